// The least-squares fits of planner/fits.h on points with known answers.
#include "planner/fits.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dgca {
namespace {

TEST(Fits, AllReduceLineRecoversBandwidthAndLatency) {
  // 4 ranks: t = 50 us + bytes x 1.5 / 2 GB/s.
  std::vector<std::pair<double, double>> pts;
  for (double b : {1e4, 1e6, 1e7, 1e8}) pts.push_back({b, 50e-6 + b * 1.5 / 2e9});
  const AllReduceLine line = FitAllReduceLine(pts, 4);
  ASSERT_TRUE(line.ok);
  EXPECT_NEAR(line.busbw, 2e9, 1);
  EXPECT_NEAR(line.latency, 50e-6, 1e-12);
}

TEST(Fits, AllReduceLineRefusesFallingTimes) {
  EXPECT_FALSE(FitAllReduceLine({{1e6, 0.2}, {1e8, 0.1}}, 2).ok);
  EXPECT_FALSE(FitAllReduceLine({{1e6, 0.2}}, 2).ok);
  EXPECT_FALSE(FitAllReduceLine({{1e6, 0.1}, {1e8, 0.2}}, 1).ok);
}

TEST(Fits, StepTimeFromOnePointScalesWithTheMicroBatch) {
  PlannerMeasurements m;
  m.step_seconds = 0.2;
  m.step_micro_batch = 16;
  const StepTimeFit fit = FitStepTime(m);
  EXPECT_EQ(fit.fixed, 0);
  EXPECT_DOUBLE_EQ(fit.per_sample, 0.2 / 16);
  EXPECT_TRUE(absl::StrContains(fit.why, "/ 16")) << fit.why;
}

TEST(Fits, StepTimeLineThroughPoints) {
  PlannerMeasurements m;
  // c(m) = 5 ms + 1 ms x m, newest first; an older m=8 point is ignored.
  m.step_points = {{8, 0.013}, {16, 0.021}, {32, 0.037}, {8, 0.5}};
  m.step_source = "three jobs";
  const StepTimeFit fit = FitStepTime(m);
  EXPECT_NEAR(fit.fixed, 0.005, 1e-12);
  EXPECT_NEAR(fit.per_sample, 0.001, 1e-12);
  EXPECT_TRUE(absl::StrContains(fit.why, "least squares")) << fit.why;
  EXPECT_TRUE(absl::StrContains(fit.why, "(three jobs)")) << fit.why;
}

TEST(Fits, StepTimeLineThroughTheOriginWhenTheInterceptIsNegative) {
  PlannerMeasurements m;
  m.step_points = {{10, 0.01}, {20, 0.03}};  // free fit: a = -10 ms
  const StepTimeFit fit = FitStepTime(m);
  EXPECT_EQ(fit.fixed, 0);
  EXPECT_NEAR(fit.per_sample, (10 * 0.01 + 20 * 0.03) / (100.0 + 400.0), 1e-12);
  EXPECT_TRUE(absl::StrContains(fit.why, "through the origin")) << fit.why;
}

TEST(Fits, NothingToFitLeavesTheStepUnknown) {
  EXPECT_EQ(FitStepTime(PlannerMeasurements{}).per_sample, 0);
}

MemoryEstimate Model() {
  MemoryEstimate e;
  e.params = 100;
  e.workspace = 100;
  e.activations_per_sample = 10;  // total(m) = 200 + 10 m
  return e;
}

TEST(Fits, OneMemoryPointThatFitsRaisesTheSlope) {
  MemoryEstimate e = Model();
  std::string why;
  // 500 bytes at m = 10: measured (500 - 200) / 10 = 30 per sample > 10.
  ASSERT_TRUE(FitMemoryLine({{10, 500}}, "job a", 0, 1000, &e, &why));
  EXPECT_DOUBLE_EQ(e.activations_per_sample, 30);
  EXPECT_DOUBLE_EQ(e.total(10), 500);  // through the point
  EXPECT_TRUE(absl::StrContains(why, "the larger of")) << why;
}

TEST(Fits, OneMemoryPointOverTheBudgetTakesTheSmallerSlope) {
  MemoryEstimate e = Model();
  std::string why;
  ASSERT_TRUE(FitMemoryLine({{10, 500}}, "job a", 0, 400, &e, &why));
  EXPECT_DOUBLE_EQ(e.activations_per_sample, 10);
  EXPECT_DOUBLE_EQ(e.total(10), 500);
  EXPECT_TRUE(absl::StrContains(why, "the smaller of")) << why;
}

TEST(Fits, MemoryPointsFitTheSlopeAndStayOnOrAboveEveryPoint) {
  MemoryEstimate e = Model();
  std::string why;
  // 20 bytes per sample with some noise; the CUDA context (50) comes off.
  ASSERT_TRUE(FitMemoryLine({{10, 450}, {20, 660}, {30, 850}}, "jobs", 50, 0, &e, &why));
  EXPECT_NEAR(e.activations_per_sample, 20, 1e-9);
  EXPECT_GE(e.total(10) + 1e-9, 400);
  EXPECT_GE(e.total(20) + 1e-9, 610);
  EXPECT_GE(e.total(30) + 1e-9, 800);
  EXPECT_TRUE(absl::StrContains(why, "fitted over micro-batches 10, 20, 30")) << why;
}

TEST(Fits, MemorySlopeNeverBelowTheModels) {
  MemoryEstimate e = Model();
  std::string why;
  ASSERT_TRUE(FitMemoryLine({{10, 400}, {20, 400}}, "flat", 0, 0, &e, &why));
  EXPECT_DOUBLE_EQ(e.activations_per_sample, 10);
  EXPECT_TRUE(absl::StrContains(why, "do not grow")) << why;
}

TEST(Fits, NoUsableMemoryPointLeavesTheModel) {
  MemoryEstimate e = Model();
  std::string why;
  EXPECT_FALSE(FitMemoryLine({{0, 500}, {10, -1}}, "bad", 0, 0, &e, &why));
  EXPECT_DOUBLE_EQ(e.total(10), 300);
}

}  // namespace
}  // namespace dgca
