#include "coordinator/loss_curve.h"

#include <gtest/gtest.h>

#include <cmath>

namespace dgca {
namespace {

std::vector<std::pair<int64_t, double>> Pairs(const LossCurve& c) {
  std::vector<std::pair<int64_t, double>> v;
  for (const v1::LossPoint& p : c.points()) v.emplace_back(p.step(), p.loss());
  return v;
}

TEST(LossCurve, MeanOverRanksOnceEveryRankReported) {
  LossCurve c;
  c.Add(1, 0, 2.0, 2);
  EXPECT_TRUE(c.points().empty()) << "rank 1 has not reported step 1";
  c.Add(2, 0, 1.0, 2);  // rank 0 runs ahead
  c.Add(1, 0, 9.0, 2);  // a repeat of rank 0 counts once
  c.Add(1, 1, 4.0, 2);
  c.Add(2, 1, 3.0, 2);
  EXPECT_EQ(Pairs(c), (std::vector<std::pair<int64_t, double>>{{1, 3.0}, {2, 2.0}}));
  c.Add(3, 1, NAN, 2);  // not finite: ignored
  c.Add(3, 2, 1.0, 2);  // no rank 2
  c.Add(3, 0, 1.0, 2);
  EXPECT_EQ(c.points().size(), 2u);
}

TEST(LossCurve, StaysSmallAndEvenlySpacedOverALongRun) {
  LossCurve c;
  for (int64_t s = 1; s <= 10000; ++s) c.Add(s, 0, 10.0 / s, 1);
  ASSERT_LE(c.points().size(), LossCurve::kMaxPoints);
  ASSERT_GE(c.points().size(), LossCurve::kMaxPoints / 2);
  const int64_t k = c.stride();
  EXPECT_EQ(k & (k - 1), 0) << k;
  for (size_t i = 0; i < c.points().size(); ++i) {
    EXPECT_EQ(c.points()[i].step(), static_cast<int64_t>(i + 1) * k);
    EXPECT_DOUBLE_EQ(c.points()[i].loss(), 10.0 / c.points()[i].step());
  }
  EXPECT_GT(c.points().back().step(), 10000 - k);  // covers the whole run
}

TEST(LossCurve, RestartFromAnEarlierStepReplacesTheTail) {
  LossCurve c;
  for (int64_t s = 1; s <= 10; ++s) c.Add(s, 0, 5.0, 1);
  c.Add(7, 0, 1.0, 1);  // resumed from the step-6 checkpoint
  c.Add(8, 0, 1.5, 1);
  EXPECT_EQ(c.points().size(), 8u);
  EXPECT_EQ(c.points()[5].loss(), 5.0);
  EXPECT_EQ(c.points()[6].step(), 7);
  EXPECT_EQ(c.points()[6].loss(), 1.0);
  EXPECT_EQ(c.points().back().loss(), 1.5);
}

TEST(LossCurve, RestoreKeepsPointsAndStride) {
  LossCurve a;
  for (int64_t s = 1; s <= 1000; ++s) a.Add(s, 0, 1.0 / s, 1);
  google::protobuf::RepeatedPtrField<v1::LossPoint> stored(a.points().begin(), a.points().end());
  LossCurve b;
  b.Restore(stored);
  EXPECT_EQ(b.stride(), a.stride());
  for (int64_t s = 1001; s <= 1100; ++s) {
    a.Add(s, 0, 1.0 / s, 1);
    b.Add(s, 0, 1.0 / s, 1);
  }
  EXPECT_EQ(Pairs(a), Pairs(b));
}

}  // namespace
}  // namespace dgca
