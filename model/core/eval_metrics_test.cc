#include "model/core/eval_metrics.h"

#include <cmath>

#include <gtest/gtest.h>

namespace dgca {
namespace {

TEST(EvalMetricsTest, HandWorkedExample) {
  CorrectionMetrics m;
  // 1. positive (error at 1), corrected exactly: det TP, cor TP.
  m.Add({1, 2, 3}, {1, 9, 3}, {1, 9, 3});
  // 2. positive (error at 0), right position, wrong char: det TP, not cor.
  m.Add({4, 5}, {7, 5}, {8, 5});
  // 3. positive (errors at 0 and 2), only one fixed: neither.
  m.Add({1, 1, 1}, {2, 1, 2}, {2, 1, 1});
  // 4. positive, untouched: not predicted.
  m.Add({3, 3}, {3, 4}, {3, 3});
  // 5. negative, changed: false positive.
  m.Add({6, 6}, {6, 6}, {6, 7});
  // 6. negative, untouched.
  m.Add({5}, {5}, {5});
  auto r = m.Compute();
  // Sentences: positives 4 (1-4), predicted positives 4 (1, 2, 3, 5).
  // Detection TP 2 (1, 2); correction TP 1 (1).
  EXPECT_DOUBLE_EQ(r["sentences"], 6);
  EXPECT_DOUBLE_EQ(r["sentence_detection_precision"], 2.0 / 4);
  EXPECT_DOUBLE_EQ(r["sentence_detection_recall"], 2.0 / 4);
  EXPECT_DOUBLE_EQ(r["sentence_detection_f1"], 0.5);
  EXPECT_DOUBLE_EQ(r["sentence_correction_precision"], 1.0 / 4);
  EXPECT_DOUBLE_EQ(r["sentence_correction_recall"], 1.0 / 4);
  EXPECT_DOUBLE_EQ(r["sentence_correction_f1"], 0.25);
  // Characters: error positions 1 + 1 + 2 + 1 = 5; changed positions
  // 1 + 1 + 1 + 0 + 1 = 4; detection TP (changed and error) 3; correction TP
  // (also p == t) 2 (sentence 1, sentence 3 position 0).
  EXPECT_DOUBLE_EQ(r["char_detection_precision"], 3.0 / 4);
  EXPECT_DOUBLE_EQ(r["char_detection_recall"], 3.0 / 5);
  EXPECT_DOUBLE_EQ(r["char_detection_f1"], 2 * 0.75 * 0.6 / 1.35);
  EXPECT_DOUBLE_EQ(r["char_correction_precision"], 2.0 / 4);
  EXPECT_DOUBLE_EQ(r["char_correction_recall"], 2.0 / 5);
  // False positive rate: 1 of 2 correct sentences changed.
  EXPECT_DOUBLE_EQ(r["false_positive_rate"], 0.5);
  EXPECT_EQ(r.size(), 14u);
}

TEST(EvalMetricsTest, EdgeCasesAreZeroNotNan) {
  CorrectionMetrics empty;
  for (const auto& kv : empty.Compute()) {
    EXPECT_FALSE(std::isnan(kv.second)) << kv.first;
    EXPECT_EQ(kv.second, 0.0) << kv.first;
  }
  // No positives, no predictions.
  CorrectionMetrics clean;
  clean.Add({1, 2}, {1, 2}, {1, 2});
  auto r = clean.Compute();
  EXPECT_EQ(r["sentence_correction_f1"], 0.0);
  EXPECT_EQ(r["char_detection_precision"], 0.0);
  EXPECT_EQ(r["false_positive_rate"], 0.0);
  EXPECT_EQ(r["sentences"], 1.0);
  // Positives but no predictions: recall 0, precision 0, F1 0.
  CorrectionMetrics copy;
  copy.Add({1, 2}, {1, 3}, {1, 2});
  r = copy.Compute();
  EXPECT_EQ(r["sentence_detection_precision"], 0.0);
  EXPECT_EQ(r["sentence_detection_recall"], 0.0);
  EXPECT_EQ(r["sentence_detection_f1"], 0.0);
  // Predictions but no positives: FPR 1.
  CorrectionMetrics fp;
  fp.Add({1}, {1}, {2});
  r = fp.Compute();
  EXPECT_EQ(r["false_positive_rate"], 1.0);
  EXPECT_EQ(r["sentence_detection_recall"], 0.0);
}

TEST(EvalMetricsTest, MergeEqualsSingle) {
  CorrectionMetrics a, b, all;
  a.Add({1, 2, 3}, {1, 9, 3}, {1, 9, 3});
  all.Add({1, 2, 3}, {1, 9, 3}, {1, 9, 3});
  b.Add({4, 5}, {7, 5}, {8, 5});
  all.Add({4, 5}, {7, 5}, {8, 5});
  b.Add({6}, {6}, {7});
  all.Add({6}, {6}, {7});
  a.Merge(b);
  EXPECT_EQ(a.Compute(), all.Compute());
}

TEST(EvalMetricsTest, LengthMismatchCountsAsDifference) {
  CorrectionMetrics m;
  m.Add({1, 2}, {1, 2}, {1});  // prediction lost a character: changed
  EXPECT_EQ(m.Compute()["false_positive_rate"], 1.0);
}

}  // namespace
}  // namespace dgca
