// BatchIndex: the rows and arrays it indexes, the trimmed length, and the
// messages of what it rejects (model_test and cuda_model_test check that
// both models reject through it).
#include "model/nn/batch_index.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dgca {
namespace {

ModelConfig Config() {
  ModelConfig c;
  c.vocab_size = 30;
  c.prompt_length = 1;
  c.detector = true;
  c.candidate = true;
  c.candidate_top_k = 2;
  return c;
}

// Two rows of L = 8: [CLS] [p0] x [p1] [MASK] [SEP] pad pad, row 1 with an
// MFT label on its source char and its target slot (unusually) at
// position 6, past its last real token.
Batch TwoRows() {
  Batch b;
  b.batch_size = 2;
  b.seq_len = 8;
  b.input_ids = {1, 1, 7, 2, 3, 2, 0, 0, 1, 1, 3, 2, 0, 0, 3, 0};
  b.attention_mask = {1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0};
  b.token_type_ids.assign(16, 0);
  b.token_type_ids[9] = 1;
  b.prompt_slot = {-1, 0, -1, 1, -1, -1, -1, -1, -1, 0, -1, 1, -1, -1, -1, -1};
  b.mft_labels.assign(16, -100);
  b.mft_labels[10] = 9;
  b.slot_index = {4, 14};
  b.slot_source_id = {7, 8};
  b.slot_target_id = {11, 8};
  b.candidates = {7, 11, 8, -1};
  b.top_k = 2;
  return b;
}

TEST(BatchIndex, IndexesTargetSlotsThenMftRowsAndTheInputs) {
  BatchIndex index(Config(), /*max_batch=*/2, /*seq_len=*/8);
  EXPECT_EQ(index.max_rows(), 2 * (8 - 2 - 2));
  const Batch b = TwoRows();
  ASSERT_TRUE(index.Check(b, /*need_labels=*/true).ok());
  EXPECT_EQ(index.rows(), (std::vector<int32_t>{4, 14, 10}));
  EXPECT_EQ(index.targets(), (std::vector<int32_t>{11, 8, 9}));
  EXPECT_EQ(index.token_types()[9], 1);
  EXPECT_EQ(index.prompt_slots()[11], 1);
  EXPECT_EQ(index.prompt_slots()[12], -1);
  // Row 0 is real up to position 5, row 1's target sits at 6: length 7.
  EXPECT_EQ(index.TrimmedLength(b, 1), 7);
  EXPECT_EQ(index.TrimmedLength(b, 4), 8);
  Batch early = b;
  early.slot_index[1] = 12;
  ASSERT_TRUE(index.Check(early, true).ok());
  EXPECT_EQ(index.TrimmedLength(early, 1), 6);
  EXPECT_EQ(index.TrimmedLength(early, 4), 8);
  EXPECT_EQ(index.TrimmedLength(early, 16), 8);  // never past seq_len
  // Predict's check: no targets needed, -100 kept.
  Batch unlabelled = b;
  unlabelled.slot_target_id.clear();
  ASSERT_TRUE(index.Check(unlabelled, /*need_labels=*/false).ok());
  EXPECT_EQ(index.targets()[0], -100);
  EXPECT_FALSE(index.Check(unlabelled, /*need_labels=*/true).ok());
}

TEST(BatchIndex, RejectsNamingTheFieldTheIndexAndWhatIsValid) {
  BatchIndex index(Config(), 2, 8);
  auto expect = [&](const Batch& b, const std::string& message) {
    const Status s = index.Check(b, true);
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), message);
  };
  Batch b = TwoRows();
  b.input_ids[11] = 30;
  expect(b, "DgcaModel: batch.input_ids[11] (row 1, position 3) = 30 outside [0, vocab_size=30)");
  b = TwoRows();
  b.batch_size = 3;
  expect(b, "DgcaModel: batch_size 3 outside [0, max_batch=2]");
  b = TwoRows();
  b.slot_index[1] = 4;
  expect(b, "DgcaModel: batch.slot_index[1] repeats position 4");
  b = TwoRows();
  b.mft_labels[4] = 5;
  expect(b, "DgcaModel: batch.mft_labels[4] (row 0, position 4) is set on a target slot");
  b = TwoRows();
  b.slot_source_id[1] = 40;
  expect(b, "DgcaModel: batch.slot_source_id[1] = 40 outside [0, vocab_size=30)");
  b = TwoRows();
  b.candidates[3] = -2;
  expect(b, "DgcaModel: batch.candidates[3] = -2; valid is -1 (padding) or [0, vocab_size=30)");
  b = TwoRows();
  b.top_k = 1;
  expect(b, "DgcaModel: batch.candidates has 4 entries with top_k 1; the model needs top_k 2 and slots*top_k = 4");
  b = TwoRows();
  b.slot_target_id.push_back(3);
  expect(b, "DgcaModel: batch.slot_target_id has 3 entries; expected one per slot (2)");
  // Labelled positions beyond max_rows: eight MFT labels on one row pair.
  BatchIndex small(Config(), 2, 8);
  b = TwoRows();
  for (int i : {1, 2, 3, 5, 6, 7, 8, 9}) b.mft_labels[i] = 4;
  const Status s = small.Check(b, true);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("exceed the model's limit of 8"), std::string::npos) << s.ToString();
}

TEST(BatchIndex, HeadsOffSkipsTheHeadInputs) {
  ModelConfig c = Config();
  c.detector = false;
  c.candidate = false;
  BatchIndex index(c, 2, 8);
  Batch b = TwoRows();
  b.slot_source_id.clear();
  b.candidates = {99};
  EXPECT_TRUE(index.Check(b, true).ok());
}

}  // namespace
}  // namespace dgca
