#include "model/core/batch_io.h"

#include <gtest/gtest.h>

#include <fstream>

#include "model/core/core_test_util.h"

namespace dgca {
namespace {

// A 2-row batch with every array filled with distinct values.
Batch MakeBatch(int B, int L, int T, int K, int base) {
  Batch b;
  b.batch_size = B;
  b.seq_len = L;
  b.top_k = K;
  auto fill = [&](std::vector<int32_t>* v, int64_t n, int off) {
    v->resize(n);
    for (int64_t i = 0; i < n; ++i) (*v)[i] = static_cast<int32_t>(base + off + i);
  };
  fill(&b.input_ids, B * L, 0);
  fill(&b.attention_mask, B * L, 1000);
  fill(&b.prompt_slot, B * L, 2000);
  fill(&b.labels, B * L, 3000);
  fill(&b.mft_labels, B * L, 4000);
  fill(&b.slot_index, T, 5000);
  fill(&b.slot_source_id, T, 6000);
  fill(&b.slot_target_id, T, 7000);
  fill(&b.candidates, T * K, 8000);
  fill(&b.row_length, B, 9000);
  b.sample_index = {int64_t{1} << 40, base};
  b.token_type_ids.assign(B * L, 0);
  return b;
}

void ExpectSame(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.batch_size, b.batch_size);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.input_ids, b.input_ids);
  EXPECT_EQ(a.attention_mask, b.attention_mask);
  EXPECT_EQ(a.prompt_slot, b.prompt_slot);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.mft_labels, b.mft_labels);
  EXPECT_EQ(a.slot_index, b.slot_index);
  EXPECT_EQ(a.slot_source_id, b.slot_source_id);
  EXPECT_EQ(a.slot_target_id, b.slot_target_id);
  EXPECT_EQ(a.candidates, b.candidates);
  EXPECT_EQ(a.row_length, b.row_length);
  EXPECT_EQ(a.sample_index, b.sample_index);
  EXPECT_EQ(a.token_type_ids, b.token_type_ids);
}

TEST(BatchIoTest, RoundTripKeepsOrderAndEveryArray) {
  const std::string path = testutil::TempPath("batches.bin");
  const Batch b1 = MakeBatch(2, 6, 4, 3, 0);
  const Batch b2 = MakeBatch(2, 5, 0, 0, 77);  // a batch without target slots
  {
    auto w = BatchRecordWriter::Open(path);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE((*w)->Append(1, 0, b1).ok());
    ASSERT_TRUE((*w)->Append(1, 1, b2).ok());
    ASSERT_TRUE((*w)->Append(2, 0, b1).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  auto r = ReadBatchRecords(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].step, 1);
  EXPECT_EQ((*r)[0].micro, 0);
  EXPECT_EQ((*r)[1].step, 1);
  EXPECT_EQ((*r)[1].micro, 1);
  EXPECT_EQ((*r)[2].step, 2);
  ExpectSame((*r)[0].batch, b1);
  ExpectSame((*r)[1].batch, b2);
  ExpectSame((*r)[2].batch, b1);
  std::remove(path.c_str());
}

TEST(BatchIoTest, WrongSizesAreRejectedOnWrite) {
  const std::string path = testutil::TempPath("bad_write.bin");
  auto w = BatchRecordWriter::Open(path);
  ASSERT_TRUE(w.ok());
  Batch b = MakeBatch(2, 6, 4, 3, 0);
  b.candidates.pop_back();
  Status s = (*w)->Append(1, 0, b);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("candidates has 11 elements, expected 12"), std::string::npos) << s.ToString();
  std::remove(path.c_str());
}

TEST(BatchIoTest, TruncatedAndForeignFilesNameTheRecord) {
  const std::string path = testutil::TempPath("trunc.bin");
  {
    auto w = BatchRecordWriter::Open(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(1, 0, MakeBatch(2, 6, 4, 3, 0)).ok());
    ASSERT_TRUE((*w)->Append(2, 0, MakeBatch(2, 6, 4, 3, 0)).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t record = (bytes.size() - 8) / 2;
  testutil::WriteFile(path, bytes.substr(0, bytes.size() - 5));
  auto r = ReadBatchRecords(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("record 1 at byte " + std::to_string(8 + record)),
            std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().ToString();

  testutil::WriteFile(path, "PK\x03\x04 this is a zip");
  r = ReadBatchRecords(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not start with \"DGCABAT1\""), std::string::npos)
      << r.status().ToString();

  // Garbage sizes after a valid magic.
  testutil::WriteFile(path, std::string("DGCABAT1") + std::string(32, '\xff'));
  r = ReadBatchRecords(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("impossible sizes"), std::string::npos) << r.status().ToString();
  std::remove(path.c_str());
  EXPECT_EQ(ReadBatchRecords(path).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace dgca
