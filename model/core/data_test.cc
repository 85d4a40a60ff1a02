#include "model/core/data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/core/confusion.h"
#include "model/core/core_test_util.h"
#include "model/core/tokenizer.h"

namespace dgca {
namespace {

using namespace testutil;  // NOLINT: test helpers

// [PAD] [unused1..99] [UNK] [CLS] [SEP] [MASK] then 甲 乙 丙 丁 戊 己 (104..109).
Vocab TestVocab() {
  std::vector<std::string> t = {"[PAD]"};
  for (int i = 1; i <= 99; ++i) t.push_back("[unused" + std::to_string(i) + "]");
  for (const char* s : {"[UNK]", "[CLS]", "[SEP]", "[MASK]", "甲", "乙", "丙", "丁", "戊", "己"}) {
    t.push_back(s);
  }
  return Vocab::FromTokens(t);
}

struct Shared {
  Vocab vocab;
  std::vector<Example> train;
  ReadStats stats;
  bool ok = false;
};

const Shared& LawData() {
  static Shared* s = [] {
    auto* sh = new Shared;
    auto v = Vocab::Load(SharedData() + "/vocab/vocab.txt");
    if (!v.ok()) return sh;
    sh->vocab = std::move(v).value();
    auto ex = ReadEcspell(SharedData() + "/ecspell/train_law.txt", sh->vocab, &sh->stats);
    if (!ex.ok()) return sh;
    sh->train = std::move(ex).value();
    sh->ok = true;
    return sh;
  }();
  return *s;
}

TEST(ReadEcspellTest, SmallFileCounts) {
  const std::string path = TempPath("small.txt");
  WriteFile(path,
            "甲 乙 丙\t甲 丁 丙\r\n"   // kept, one error
            "\n"                         // blank
            "甲 乙\t甲\n"                // unequal
            "甲 乙 丙 丁 戊\t甲 乙 丙 丁 己\n"  // kept; truncated at max_chars=4
            "甲 X\t甲 X");               // no final newline; X unknown
  Vocab v = TestVocab();
  ReadStats st;
  auto r = ReadEcspell(path, v, 4, &st);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(st.lines, 5);
  EXPECT_EQ(st.kept, 3);
  EXPECT_EQ(st.skipped_unequal, 1);
  EXPECT_EQ(st.skipped_empty, 1);
  EXPECT_EQ(st.truncated, 1);
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].src, (std::vector<int32_t>{104, 105, 106}));
  EXPECT_EQ((*r)[0].trg, (std::vector<int32_t>{104, 107, 106}));
  EXPECT_EQ((*r)[0].trg_chars, (std::vector<std::string>{"甲", "丁", "丙"}));
  EXPECT_EQ((*r)[1].src.size(), 4u);
  EXPECT_EQ((*r)[1].trg, (std::vector<int32_t>{104, 105, 106, 107}));
  EXPECT_EQ((*r)[2].src, (std::vector<int32_t>{104, kUnkId}));
  // Without max_chars nothing is truncated.
  r = ReadEcspell(path, v, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[1].src.size(), 5u);
  std::remove(path.c_str());
}

TEST(ReadEcspellTest, Errors) {
  Vocab v = TestVocab();
  const std::string path = TempPath("bad.txt");
  auto r = ReadEcspell("/nonexistent/train.txt", v, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/train.txt"), std::string::npos);

  WriteFile(path, "");
  r = ReadEcspell(path, v, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ": empty"), std::string::npos) << r.status().message();

  // A stream is refused before it is opened: /dev/zero grew a rank to
  // 3.2 GB until the OOM killer ended it, and a FIFO blocked it for ever.
  r = ReadEcspell("/dev/zero", v, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("/dev/zero: is a character device"), std::string::npos)
      << r.status().message();
  const std::string fifo = TempPath("fifo.txt");
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  r = ReadEcspell(fifo, v, nullptr);  // returns at once: no writer is waited for
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(fifo + ": is a FIFO"), std::string::npos)
      << r.status().message();
  unlink(fifo.c_str());

  // A directory (data.train pointing at the data folder) is named as one,
  // not read as an empty file; so is the vocabulary built from it.
  const std::string dir = TempPath("a-dir");
  mkdir(dir.c_str(), 0755);
  r = ReadEcspell(dir, v, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(dir + ": is a directory, not a data file"), std::string::npos)
      << r.status().message();
  auto built = Vocab::BuildFromExamples({dir});
  ASSERT_FALSE(built.ok());
  EXPECT_NE(built.status().message().find(dir + ": is a directory, not a training data file"), std::string::npos)
      << built.status().message();

  WriteFile(path, "甲 乙\t甲 乙\n甲 \xff\t甲 乙\n");
  r = ReadEcspell(path, v, nullptr);
  ASSERT_FALSE(r.ok());
  // Line 2, byte column 5 ("甲" is 3 bytes, then a space).
  EXPECT_NE(r.status().message().find(path + ":2:5:"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("UTF-8"), std::string::npos);

  WriteFile(path, "甲 乙\t甲 乙\n甲 乙 甲 乙\n");
  r = ReadEcspell(path, v, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ":2:"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("TAB"), std::string::npos);

  WriteFile(path, "甲\t乙 丙\n\n");
  r = ReadEcspell(path, v, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no usable"), std::string::npos);
  std::remove(path.c_str());
}

TEST(ReadEcspellTest, SharedLawFile) {
  const Shared& d = LawData();
  if (!d.ok) GTEST_SKIP() << "shared data not present under " << SharedData();
  EXPECT_EQ(d.stats.lines, 1960);
  EXPECT_EQ(d.stats.kept, 1960);
  EXPECT_EQ(d.stats.skipped_unequal, 0);
  // README: 1,059 sentences with errors, 1,681 error characters. Exact
  // vocabulary lookup leaves 345 source characters as [UNK] (33 distinct;
  // checked with a Python one-liner): the README's 243 leaves out the 102
  // upper-case Latin letters whose lower-case form is in the vocabulary.
  int64_t err_sent = 0, err_chars = 0, unk = 0, chars = 0;
  for (const Example& e : d.train) {
    bool any = false;
    for (size_t i = 0; i < e.src.size(); ++i) {
      if (e.src_chars[i] != e.trg_chars[i]) {
        ++err_chars;
        any = true;
      }
      if (e.src[i] == kUnkId) ++unk;
    }
    chars += static_cast<int64_t>(e.src.size());
    err_sent += any;
  }
  EXPECT_EQ(err_sent, 1059);
  EXPECT_EQ(err_chars, 1681);
  EXPECT_EQ(unk, 345);
  EXPECT_NEAR(static_cast<double>(chars) / 1960, 30.7, 0.05);
}

TEST(BuildBatchTest, RowLayoutPositionByPosition) {
  std::vector<Example> ex(2);
  ex[0].src = {104, 105, 106};
  ex[0].trg = {104, 107, 106};
  ex[1].src = {108};
  ex[1].trg = {108};
  BatchOptions o;
  o.seq_len = 16;
  o.prompt_length = 2;
  o.top_k = 3;
  ConfusionSet cs = ConfusionSet::FromLists(110, {{105, {107, 109, 104}}, {108, {109}}});
  Batch b = BuildBatch(ex, {0, 1}, o, &cs, /*mft=*/false, 0);
  ASSERT_EQ(b.batch_size, 2);
  ASSERT_EQ(b.seq_len, 16);
  const int P = 2, n = 3;
  // Row 0: [CLS] [CLS]x2 104 105 106 [SEP]x2 [MASK]x3 [SEP] [PAD]...
  const std::vector<int32_t> ids0 = {101, 101, 101, 104, 105, 106, 102, 102,
                                     103, 103, 103, 102, 0,   0,   0,   0};
  const std::vector<int32_t> slot0 = {-1, 0, 1, -1, -1, -1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1};
  std::vector<int32_t> lab0(16, -100);
  lab0[2 * P + n + 1] = 104;
  lab0[2 * P + n + 2] = 107;
  lab0[2 * P + n + 3] = 106;
  for (int p = 0; p < 16; ++p) {
    SCOPED_TRACE(p);
    EXPECT_EQ(b.input_ids[p], ids0[p]);
    EXPECT_EQ(b.prompt_slot[p], slot0[p]);
    EXPECT_EQ(b.labels[p], lab0[p]);
    EXPECT_EQ(b.attention_mask[p], p <= 2 * P + 2 * n + 1 ? 1 : 0);
    EXPECT_EQ(b.token_type_ids[p], 0);
    EXPECT_EQ(b.mft_labels[p], -100);
  }
  // Row 1: [CLS] [CLS]x2 108 [SEP]x2 [MASK] [SEP] [PAD]...
  const std::vector<int32_t> ids1 = {101, 101, 101, 108, 102, 102, 103, 102,
                                     0,   0,   0,   0,   0,   0,   0,   0};
  for (int p = 0; p < 16; ++p) {
    SCOPED_TRACE(p);
    EXPECT_EQ(b.input_ids[16 + p], ids1[p]);
    EXPECT_EQ(b.attention_mask[16 + p], p < 8 ? 1 : 0);
    EXPECT_EQ(b.labels[16 + p], p == 6 ? 108 : -100);
  }
  EXPECT_EQ(b.prompt_slot[16 + 4], 2);
  EXPECT_EQ(b.prompt_slot[16 + 5], 3);
  ASSERT_EQ(b.num_slots(), 4);
  EXPECT_EQ(b.slot_index, (std::vector<int32_t>{8, 9, 10, 16 + 6}));
  EXPECT_EQ(b.slot_source_id, (std::vector<int32_t>{104, 105, 106, 108}));
  EXPECT_EQ(b.slot_target_id, (std::vector<int32_t>{104, 107, 106, 108}));
  EXPECT_EQ(b.top_k, 3);
  EXPECT_EQ(b.candidates, (std::vector<int32_t>{104, -1, -1,     // no confusion
                                                105, 107, 109,   // first K-1 of the list
                                                106, -1, -1,
                                                108, 109, -1}));
  EXPECT_EQ(b.row_length, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(b.sample_index, (std::vector<int64_t>{0, 1}));
  // top_k 0: no candidates; null confusion: only x_i.
  o.top_k = 0;
  EXPECT_TRUE(BuildBatch(ex, {0, 1}, o, &cs, false, 0).candidates.empty());
  o.top_k = 2;
  EXPECT_EQ(BuildBatch(ex, {1}, o, nullptr, false, 0).candidates, (std::vector<int32_t>{108, -1}));
}

TEST(BuildBatchTest, TruncatesToSeqLen) {
  std::vector<Example> ex(1);
  for (int i = 0; i < 20; ++i) {
    ex[0].src.push_back(104 + i % 6);
    ex[0].trg.push_back(104 + i % 6);
  }
  BatchOptions o;
  o.seq_len = 20;
  o.prompt_length = 3;  // max chars (20 - 2 - 6) / 2 = 6
  EXPECT_EQ(MaxCharsForSeqLen(20, 3), 6);
  Batch b = BuildBatch(ex, {0}, o, nullptr, false, 0);
  EXPECT_EQ(b.row_length[0], 6);
  EXPECT_EQ(b.num_slots(), 6);
  EXPECT_EQ(b.input_ids[2 * 3 + 2 * 6 + 1], 102);
  EXPECT_EQ(b.attention_mask[19], 1);
}

TEST(BuildBatchTest, MftRateAndExclusions) {
  const Shared& d = LawData();
  if (!d.ok) GTEST_SKIP() << "shared data not present under " << SharedData();
  BatchOptions o;
  o.seq_len = 256;
  o.prompt_length = 3;
  o.mft_rate = 0.3f;
  o.top_k = 0;
  SetSpecialTokens(d.vocab, &o);
  std::vector<int64_t> all(d.train.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  Batch b = BuildBatch(d.train, all, o, nullptr, /*mft=*/true, 0);
  int64_t eligible = 0, masked = 0;
  const int P = o.prompt_length, L = o.seq_len;
  for (int r = 0; r < b.batch_size; ++r) {
    const Example& e = d.train[b.sample_index[r]];
    const int n = b.row_length[r];
    for (int i = 0; i < n; ++i) {
      const int pos = r * L + P + 1 + i;
      const bool is_masked = b.input_ids[pos] == kMaskId;
      const bool can = e.src[i] == e.trg[i] && !d.vocab.IsSpecial(e.src[i]);
      if (!can) {
        ASSERT_FALSE(is_masked) << "masked an error or special at row " << r << " char " << i;
        ASSERT_EQ(b.mft_labels[pos], -100);
        ASSERT_EQ(b.input_ids[pos], e.src[i]);
        continue;
      }
      ++eligible;
      if (is_masked) {
        ++masked;
        ASSERT_EQ(b.mft_labels[pos], e.src[i]);
      } else {
        ASSERT_EQ(b.mft_labels[pos], -100);
      }
    }
  }
  ASSERT_GT(eligible, 50000);
  EXPECT_NEAR(static_cast<double>(masked) / eligible, 0.3, 0.01);
  // Slot source ids stay unmasked.
  for (int t = 0; t < b.num_slots(); ++t) ASSERT_NE(b.slot_source_id[t], kMaskId);
  // Never at evaluation, and mode none / rate 0 mask nothing.
  Batch e = BuildBatch(d.train, all, o, nullptr, /*mft=*/false, 0);
  EXPECT_EQ(std::count(e.mft_labels.begin(), e.mft_labels.end(), -100),
            static_cast<long>(e.mft_labels.size()));
  o.mft_mode = MftMode::kNone;
  Batch none = BuildBatch(d.train, all, o, nullptr, true, 0);
  EXPECT_EQ(none.input_ids, e.input_ids);
  // Rate 1: every eligible position.
  o.mft_mode = MftMode::kNoError;
  o.mft_rate = 1.0f;
  Batch full = BuildBatch(d.train, all, o, nullptr, true, 0);
  EXPECT_EQ(static_cast<int64_t>(std::count_if(full.mft_labels.begin(), full.mft_labels.end(),
                                               [](int32_t x) { return x != -100; })),
            eligible);
}

TEST(BuildBatchTest, MftDeterministicPerSample) {
  std::vector<Example> ex(40);
  for (auto& e : ex) {
    for (int i = 0; i < 30; ++i) {
      e.src.push_back(104 + i % 6);
      e.trg.push_back(104 + i % 6);
    }
  }
  BatchOptions o;
  o.seq_len = 70;
  o.prompt_length = 1;
  o.top_k = 0;
  Batch a = BuildBatch(ex, {3, 7, 11}, o, nullptr, true, 2);
  Batch a2 = BuildBatch(ex, {3, 7, 11}, o, nullptr, true, 2);
  EXPECT_EQ(a.input_ids, a2.input_ids);
  // Sample 7 alone gets the same mask as inside the batch.
  Batch single = BuildBatch(ex, {7}, o, nullptr, true, 2);
  EXPECT_TRUE(std::equal(single.input_ids.begin(), single.input_ids.end(),
                         a.input_ids.begin() + 70));
  // A different epoch or seed redraws.
  Batch other = BuildBatch(ex, {3, 7, 11}, o, nullptr, true, 3);
  EXPECT_NE(a.input_ids, other.input_ids);
  o.seed = 7;
  EXPECT_NE(a.input_ids, BuildBatch(ex, {3, 7, 11}, o, nullptr, true, 2).input_ids);
}

// ---------------------------------------------------------------- loader

std::shared_ptr<const std::vector<Example>> SyntheticExamples(int n) {
  auto ex = std::make_shared<std::vector<Example>>(n);
  for (int i = 0; i < n; ++i) {
    const int len = 3 + i % 7;
    for (int k = 0; k < len; ++k) {
      (*ex)[i].src.push_back(104 + (i + k) % 6);
      (*ex)[i].trg.push_back(104 + (i + k) % 6);
    }
  }
  return ex;
}

LoaderOptions SmallLoaderOptions() {
  LoaderOptions o;
  o.batch.seq_len = 32;
  o.batch.prompt_length = 2;
  o.batch.top_k = 2;
  o.micro_batch = 4;
  o.accumulation = 2;
  return o;
}

std::vector<Batch> Drain(std::shared_ptr<const std::vector<Example>> ex, LoaderOptions o,
                         int64_t start_step, int count) {
  auto l = DataLoader::Create(ex, nullptr, o, LoaderPosition{start_step});
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i) {
    auto b = (*l)->Next(nullptr);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    out.push_back(std::move(b).value());
  }
  return out;
}

TEST(DataLoaderTest, StreamMatchesShardingFormula) {
  auto ex = SyntheticExamples(37);
  LoaderOptions o = SmallLoaderOptions();
  auto batches = Drain(ex, o, 0, 24);  // 12 steps of G=8: crosses epochs
  for (int k = 0; k < 24; ++k) {
    auto refs = MicroBatchSamples(37, o, k / 2, k % 2);
    ASSERT_EQ(batches[k].batch_size, 4);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(batches[k].sample_index[j], refs[j].index);
  }
  // Each epoch visits every sample once: positions 0..36 of the stream.
  std::multiset<int64_t> first_epoch;
  for (int k = 0; k < 24; ++k) {
    for (int j = 0; j < 4; ++j) {
      const int64_t p = k * 4 + j;
      if (p < 37) first_epoch.insert(batches[k].sample_index[j]);
    }
  }
  EXPECT_EQ(first_epoch.size(), 37u);
  EXPECT_EQ(std::set<int64_t>(first_epoch.begin(), first_epoch.end()).size(), 37u);
  EXPECT_EQ(EpochPermutation(37, 42, 0), EpochPermutation(37, 42, 0));
  EXPECT_NE(EpochPermutation(37, 42, 0), EpochPermutation(37, 42, 1));
}

TEST(DataLoaderTest, DeterministicAcrossThreadCounts) {
  auto ex = SyntheticExamples(50);
  LoaderOptions o = SmallLoaderOptions();
  o.threads = 1;
  auto a = Drain(ex, o, 0, 20);
  o.threads = 3;
  o.prefetch = 5;
  auto b = Drain(ex, o, 0, 20);
  for (int k = 0; k < 20; ++k) {
    EXPECT_EQ(a[k].input_ids, b[k].input_ids) << k;
    EXPECT_EQ(a[k].mft_labels, b[k].mft_labels) << k;
    EXPECT_EQ(a[k].candidates, b[k].candidates) << k;
  }
}

TEST(DataLoaderTest, ResumeGivesIdenticalStream) {
  auto ex = SyntheticExamples(29);
  LoaderOptions o = SmallLoaderOptions();
  auto l = DataLoader::Create(ex, nullptr, o, LoaderPosition{0});
  ASSERT_TRUE(l.ok());
  std::vector<Batch> full;
  EXPECT_EQ((*l)->position().step, 0);
  for (int k = 0; k < 16; ++k) {
    auto b = (*l)->Next(nullptr);
    ASSERT_TRUE(b.ok());
    full.push_back(std::move(b).value());
    EXPECT_EQ((*l)->position().step, (k + 1) / 2) << k;
  }
  // Resume at step 5 (after 10 micro-batches).
  auto resumed = Drain(ex, o, 5, 6);
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(resumed[k].sample_index, full[10 + k].sample_index);
    EXPECT_EQ(resumed[k].input_ids, full[10 + k].input_ids);
    EXPECT_EQ(resumed[k].dropout_keys, full[10 + k].dropout_keys);  // resumed dropout masks too
    EXPECT_EQ(resumed[k].dropout_keys.size(), static_cast<size_t>(resumed[k].batch_size));
  }
}

TEST(DataLoaderTest, UnionOverRanksEqualsSingleRank) {
  auto ex = SyntheticExamples(45);
  LoaderOptions one = SmallLoaderOptions();
  one.micro_batch = 6;
  one.world_size = 1;
  auto single = Drain(ex, one, 0, 10);
  LoaderOptions two = one;
  two.micro_batch = 3;
  two.world_size = 2;
  two.rank = 0;
  auto r0 = Drain(ex, two, 0, 10);
  two.rank = 1;
  auto r1 = Drain(ex, two, 0, 10);
  const int L = one.batch.seq_len;
  for (int k = 0; k < 10; ++k) {
    // Rows of the W=1 micro-batch = rank 0's rows then rank 1's rows, MFT
    // masks included.
    std::vector<int32_t> joined = r0[k].input_ids;
    joined.insert(joined.end(), r1[k].input_ids.begin(), r1[k].input_ids.end());
    EXPECT_EQ(single[k].input_ids, joined) << k;
    std::vector<int64_t> si = r0[k].sample_index;
    si.insert(si.end(), r1[k].sample_index.begin(), r1[k].sample_index.end());
    EXPECT_EQ(single[k].sample_index, si);
    // A sample's dropout key is its own, whichever rank and batch it is in.
    std::vector<uint64_t> keys = r0[k].dropout_keys;
    keys.insert(keys.end(), r1[k].dropout_keys.begin(), r1[k].dropout_keys.end());
    EXPECT_EQ(single[k].dropout_keys, keys);
    EXPECT_EQ(static_cast<int>(single[k].input_ids.size()), 6 * L);
  }
}

TEST(DataLoaderTest, ErrorFromBuilderThreadAndShutdown) {
  auto ex = std::make_shared<std::vector<Example>>(*SyntheticExamples(4));
  (*ex)[2].trg.pop_back();  // corrupt one example
  LoaderOptions o = SmallLoaderOptions();
  o.micro_batch = 4;
  o.accumulation = 1;
  auto l = DataLoader::Create(ex, nullptr, o, LoaderPosition{0});
  ASSERT_TRUE(l.ok());
  double wait = -1;
  auto b = (*l)->Next(&wait);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("example 2"), std::string::npos) << b.status().message();
  EXPECT_GE(wait, 0.0);
  EXPECT_FALSE((*l)->Next(nullptr).ok());  // sticky
  l->reset();  // destructor with builders blocked on a full queue
  // Shutdown while builders are mid-stream.
  auto good = DataLoader::Create(SyntheticExamples(100), nullptr, o, LoaderPosition{0});
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE((*good)->Next(nullptr).ok());
}

TEST(DataLoaderTest, CreateValidates) {
  auto ex = SyntheticExamples(10);
  LoaderOptions o = SmallLoaderOptions();
  EXPECT_FALSE(DataLoader::Create(nullptr, nullptr, o, {}).ok());
  LoaderOptions bad = o;
  bad.micro_batch = 0;
  EXPECT_FALSE(DataLoader::Create(ex, nullptr, bad, {}).ok());
  bad = o;
  bad.rank = 2;
  bad.world_size = 2;
  EXPECT_FALSE(DataLoader::Create(ex, nullptr, bad, {}).ok());
  bad = o;
  bad.batch.seq_len = 6;
  auto r = DataLoader::Create(ex, nullptr, bad, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_seq_len"), std::string::npos);
}

TEST(DataLoaderTest, SharedDataWithConfusion) {
  const Shared& d = LawData();
  if (!d.ok) GTEST_SKIP() << "shared data not present";
  auto cs = ConfusionSet::LoadJson(SharedData() + "/confusion/pinyin_sam.json", d.vocab);
  ASSERT_TRUE(cs.ok());
  LoaderOptions o;
  o.batch.seq_len = 128;
  o.batch.top_k = 8;
  SetSpecialTokens(d.vocab, &o.batch);
  o.micro_batch = 16;
  o.threads = 2;
  auto ex = std::make_shared<const std::vector<Example>>(d.train);
  auto l = DataLoader::Create(ex, std::make_shared<const ConfusionSet>(std::move(cs).value()), o, {});
  ASSERT_TRUE(l.ok());
  int64_t slots = 0, with_cands = 0;
  for (int k = 0; k < 20; ++k) {
    auto b = (*l)->Next(nullptr);
    ASSERT_TRUE(b.ok());
    ASSERT_EQ(b->candidates.size(), static_cast<size_t>(b->num_slots()) * 8);
    for (int t = 0; t < b->num_slots(); ++t) {
      const int32_t* c = b->candidates.data() + t * 8;
      ASSERT_EQ(c[0], b->slot_source_id[t]);
      std::set<int32_t> seen;
      for (int j = 0; j < 8 && c[j] != -1; ++j) ASSERT_TRUE(seen.insert(c[j]).second);
      ++slots;
      with_cands += c[1] != -1;
    }
  }
  EXPECT_GT(with_cands, slots / 2);
}

}  // namespace
}  // namespace dgca
