// A small model trained on train_law for a
// stated number of CPU steps beats the copy-the-source baseline on test_law.
// Kept apart from trainer_test.cc because it runs for about 50 s.
#include "model/train/trainer.h"

#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/core/data.h"
#include "model/core/eval_metrics.h"
#include "model/core/tokenizer.h"
#include "model/train/trainer_test_util.h"

namespace dgca {
namespace {

using namespace testutil;  // NOLINT: test helpers

// Longer run (stated: TrainLawF1 runs kF1Steps steps, micro-batch 32, the
// whole test_law set). The copy-the-source baseline has sentence correction
// F1 = 0 by definition (a positive sentence is corrected only when p == t !=
// s), so the model must actually fix sentences; its detection F1 and false
// positive rate are printed beside the baseline's.
TEST(TrainerF1Test, TrainLawCorrectionF1BeatsCopySource) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  const int kF1Steps = 700;
  TrainConfig c = TinyConfig();
  c.steps = kF1Steps;
  c.micro_batch = 32;
  c.eval_path = DataDir() + "/ecspell/test_law.txt";
  Recorder rec(-1, true);
  auto r = Train(c, nullptr, &rec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Copy-the-source baseline on the same data with the same vocabulary.
  auto vocab = Vocab::BuildFromExamples({c.train_path});
  ASSERT_TRUE(vocab.ok());
  ReadStats st;
  auto ex = ReadEcspell(c.eval_path, *vocab, &st);
  ASSERT_TRUE(ex.ok());
  CorrectionMetrics copy;
  const size_t max_chars = static_cast<size_t>(MaxCharsForSeqLen(c.max_seq_len, 3));
  for (const Example& e : *ex) {
    const size_t n = std::min(max_chars, e.src.size());
    std::vector<int32_t> s(e.src.begin(), e.src.begin() + n), t(e.trg.begin(), e.trg.begin() + n);
    copy.Add(s, t, s);
  }
  auto base = copy.Compute();
  printf("test_law (%lld sentences, truncated to %zu chars): model sentence correction F1 %.4f "
         "(P %.4f R %.4f), detection F1 %.4f, FPR %.4f; copy-source correction F1 %.4f, "
         "detection F1 %.4f, FPR %.4f; final loss %.4f\n",
         static_cast<long long>(rec.evals.empty() ? 0 : rec.evals.back().samples),
         max_chars, r->eval["sentence_correction_f1"], r->eval["sentence_correction_precision"],
         r->eval["sentence_correction_recall"], r->eval["sentence_detection_f1"],
         r->eval["false_positive_rate"], base["sentence_correction_f1"],
         base["sentence_detection_f1"], base["false_positive_rate"], r->final_loss);
  EXPECT_GT(r->eval["sentence_correction_f1"], base["sentence_correction_f1"]);
}

}  // namespace
}  // namespace dgca
