// One test per formula of planner/cost_model.h, with numbers worked by hand.
#include "planner/cost_model.h"

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "planner/units.h"

namespace dgca {
namespace {

// t(S) = 1 ms + S / (1 GB/s) between 2 ranks (f = 1).
LinkModel OneGigabyte() {
  LinkModel link;
  link.busbw = 1e9;
  link.latency = 1e-3;
  return link;
}

// G = 100 MB, c(m) = 10 ms + 2 ms x m.
CostInputs Inputs() {
  CostInputs in;
  in.grad_bytes = 100e6;
  in.fixed = 0.010;
  in.per_sample = 0.002;
  in.global = 128;
  return in;
}

TEST(CostModel, CommIsTheSumOfItsBucketsAllReduces) {
  // nb = ceil(100 MB / 30 MB) = 4: three full buckets of 30 MB and 10 MB left.
  const Prediction p = Predict(2, 16, 1, 30e6, Inputs(), OneGigabyte());
  EXPECT_EQ(p.buckets, 4);
  EXPECT_NEAR(p.comm, 3 * (1e-3 + 0.030) + (1e-3 + 0.010), 1e-12);
  EXPECT_NEAR(p.comm_probe, p.comm, 1e-12);
}

TEST(CostModel, ExposedIsWhatTheLastBackwardCannotHide) {
  // c(16) = 42 ms, backward 28 ms; C = 4 x 26 ms = 104 ms in 4 buckets:
  // exposed = max(104/4, 104 - 28 x 3/4) = 83 ms; step(2) = 2 x 42 + 83.
  const Prediction p = Predict(2, 16, 2, 25e6, Inputs(), OneGigabyte());
  ASSERT_TRUE(p.known);
  EXPECT_NEAR(p.compute, 0.042, 1e-12);
  EXPECT_NEAR(p.comm, 0.104, 1e-12);
  EXPECT_NEAR(p.exposed, 0.083, 1e-12);
  EXPECT_NEAR(p.overlap, 0.021, 1e-12);
  EXPECT_NEAR(p.step, 0.167, 1e-12);
  EXPECT_NEAR(p.sps, 2 * 16 * 2 / 0.167, 1e-9);
  EXPECT_NEAR(p.share, 0.083 / 0.167, 1e-12);
}

TEST(CostModel, ExposedIsAtLeastOneBucket) {
  // A long backward (c = 1 s) hides all but the last bucket: C/nb.
  CostInputs in = Inputs();
  in.fixed = 1.0;
  const Prediction p = Predict(2, 1, 1, 25e6, in, OneGigabyte());
  EXPECT_NEAR(p.exposed, p.comm / 4, 1e-12);
}

TEST(CostModel, NoOverlapExposesAllCommunication) {
  CostInputs in = Inputs();
  in.can_overlap = false;
  const Prediction p = Predict(2, 16, 1, 25e6, in, OneGigabyte());
  EXPECT_NEAR(p.exposed, p.comm, 1e-12);
  EXPECT_NEAR(p.step, 0.042 + 0.104, 1e-12);
}

TEST(CostModel, SkewAddsPeerWaitToCommButNotToTheProbe) {
  CostInputs in = Inputs();
  in.skew = 0.5;  // half a second of waiting per second of compute
  const Prediction p = Predict(2, 16, 1, 25e6, in, OneGigabyte());
  EXPECT_NEAR(p.comm_probe, 0.104, 1e-12);
  EXPECT_NEAR(p.comm, 0.104 + 0.5 * 0.042, 1e-12);
}

TEST(CostModel, UnknownComputeKeepsOnlyTheLink) {
  CostInputs in = Inputs();
  in.per_sample = 0;
  const Prediction p = Predict(2, 16, 1, 25e6, in, OneGigabyte());
  EXPECT_FALSE(p.known);
  EXPECT_NEAR(p.comm, 0.104, 1e-12);
  EXPECT_EQ(p.step, 0);
  EXPECT_EQ(p.sps, 0);
}

TEST(CostModel, OneRankHasNoCommunication) {
  const Prediction p = Predict(1, 16, 1, 25e6, Inputs(), OneGigabyte());
  EXPECT_EQ(p.comm, 0);
  EXPECT_EQ(p.exposed, 0);
  EXPECT_NEAR(p.step, 0.042, 1e-12);
}

TEST(CostModel, SplitsAreTheDivisorsOfThePerRankBatchThatFit) {
  CostInputs in = Inputs();  // global 128, 2 ranks: 64 per rank
  auto all = Splits(2, in);
  ASSERT_EQ(all.size(), 7u);
  EXPECT_EQ(all.front(), std::make_pair(64, 1));
  EXPECT_EQ(all.back(), std::make_pair(1, 64));
  in.max_micro = 20;
  auto fit = Splits(2, in);
  ASSERT_FALSE(fit.empty());
  EXPECT_EQ(fit.front(), std::make_pair(16, 4));
  for (const auto& [m, k] : fit) EXPECT_EQ(m * k, 64);
}

TEST(CostModel, AccumulationForTargetMeetsTheShare) {
  // exposed 50 ms, c 100 ms: k >= 0.05 x 0.9 / (0.1 x 0.1) = 4.5 -> 5.
  Prediction p;
  p.exposed = 0.05;
  p.compute = 0.1;
  const int k = AccumulationForTarget(p);
  EXPECT_EQ(k, 5);
  EXPECT_LE(p.exposed / (k * p.compute + p.exposed), kTargetCommShare);
  EXPECT_GT(p.exposed / ((k - 1) * p.compute + p.exposed), kTargetCommShare);
}

TEST(CostModel, BucketOnAFastLinkIsPyTorchsDefault) {
  // All gradients in 400 MB / 1 TB/s = 0.4 ms, under 10% of a 28 ms backward.
  LinkModel fast;
  fast.busbw = 1e12;
  fast.latency = 1e-6;
  const Prediction at = Predict(2, 16, 1, 25e6, Inputs(), fast);
  std::string why;
  EXPECT_EQ(BucketFor(2, at, fast, 400e6, &why), kFastLinkBucketBytes);
  EXPECT_TRUE(absl::StrContains(why, "communication hides easily")) << why;
}

TEST(CostModel, BucketOnASlowLinkIsAQuarterOfTheGradients) {
  const Prediction at = Predict(2, 16, 1, 25e6, Inputs(), OneGigabyte());
  std::string why;
  EXPECT_EQ(BucketFor(2, at, OneGigabyte(), 100e6, &why), 25e6);
  EXPECT_TRUE(absl::StrContains(why, "G/4")) << why;
}

TEST(CostModel, BucketIsRaisedUntilLatencyIsATenth) {
  // 5 ms latency at 1 GB/s: S >= 9 x 5 ms x 1 GB/s / 1 = 45 MB > G/4.
  LinkModel slow = OneGigabyte();
  slow.latency = 5e-3;
  const Prediction at = Predict(2, 16, 1, 25e6, Inputs(), slow);
  std::string why;
  EXPECT_NEAR(BucketFor(2, at, slow, 100e6, &why), 45e6, 1);
  EXPECT_TRUE(absl::StrContains(why, "raised to")) << why;
}

TEST(CostModel, BucketStaysWithinOneMiBAndTheGradients) {
  const Prediction at = Predict(2, 16, 1, 25e6, Inputs(), OneGigabyte());
  std::string why;
  EXPECT_EQ(BucketFor(2, at, OneGigabyte(), 1e6, &why), kMiB);   // G/4 = 250 KB
  LinkModel slow = OneGigabyte();
  slow.latency = 1.0;  // wants S >= 9 GB
  EXPECT_EQ(BucketFor(2, at, slow, 100e6, &why), 100e6);        // at most G
}

}  // namespace
}  // namespace dgca
