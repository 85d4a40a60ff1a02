#include "cli/watch_view.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace dgca {
namespace cli {
namespace {

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

v1::StepMetrics Sample(int rank, int64_t step, double loss) {
  v1::StepMetrics m;
  m.set_job_id("j-000007-abcd");
  m.set_rank(rank);
  m.set_step(step);
  m.set_total_steps(200);
  m.set_loss(loss);
  m.set_samples_per_second(256);
  m.set_step_seconds(0.04);
  m.set_exposed_comm_seconds(0.005);
  m.set_allreduce_seconds(0.01);
  return m;
}

TEST(WatchViewTest, SparklineScalesBetweenMinAndMax) {
  EXPECT_EQ(Sparkline({1, 2, 3, 4, 5, 6, 7, 8}), "▁▂▃▄▅▆▇█");
  EXPECT_EQ(Sparkline({8, 1}), "█▁");
  EXPECT_EQ(Sparkline({2.5, 2.5, 2.5}), "▄▄▄");  // flat: middle, no division by zero
  EXPECT_EQ(Sparkline({}), "");
  EXPECT_EQ(Sparkline({1, NAN, 2}), "▁█");
  std::vector<double> many;
  for (int i = 0; i < 100; ++i) many.push_back(i);
  std::string s = Sparkline(many, 30);
  EXPECT_EQ(s.size(), 30u * std::string("▁").size());  // only the last 30
  EXPECT_EQ(s.substr(0, 3), "▁");
  EXPECT_EQ(s.substr(s.size() - 3), "█");
}

TEST(WatchViewTest, ProgressBar) {
  EXPECT_EQ(ProgressBar(0.5, 4), "[██░░]");
  EXPECT_EQ(ProgressBar(0, 3), "[░░░]");
  EXPECT_EQ(ProgressBar(2, 3), "[███]");
  EXPECT_EQ(ProgressBar(NAN, 2), "[░░]");
}

TEST(WatchViewTest, LossHistoryIsTheMeanOverRanksPerStep) {
  LossHistory h(4);
  h.Add(Sample(0, 1, 4.0));
  h.Add(Sample(1, 1, 2.0));
  h.Add(Sample(0, 2, 1.0));
  EXPECT_EQ(h.Last(10), (std::vector<double>{3.0, 1.0}));
  for (int s = 3; s <= 7; ++s) h.Add(Sample(0, s, s));
  EXPECT_EQ(h.Last(10), (std::vector<double>{4, 5, 6, 7}));  // capacity 4
  EXPECT_EQ(h.Last(2), (std::vector<double>{6, 7}));
}

TEST(WatchViewTest, RendersBarSparklineCommAndRankRows) {
  WatchInput in;
  in.job.set_id("j-000007-abcd");
  in.job.set_name("demo");
  in.job.set_state(v1::RUNNING);
  in.job.set_total_steps(200);
  in.job.set_step(79);
  for (int r = 0; r < 2; ++r) {
    v1::RankProgress* p = in.job.add_ranks();
    p->set_rank(r);
    p->set_node("n1");
    p->set_state("running");
    p->set_step(79);
    p->set_heartbeat_age_seconds(0.25 + r);
  }
  in.ranks[0] = Sample(0, 80, 3.0);
  in.ranks[1] = Sample(1, 80, 3.5);
  in.losses = {8, 7, 6, 5, 4, 3.25};
  std::string t = RenderWatch(in, 10);
  EXPECT_TRUE(Has(t, "job j-000007-abcd (demo)  RUNNING")) << t;
  EXPECT_TRUE(Has(t, "progress  [████░░░░░░]  40%  step 80/200")) << t;
  EXPECT_TRUE(Has(t, "512.0 samples/s  0.040 s/step")) << t;
  EXPECT_TRUE(Has(t, "loss      3.2500  █▇▅▄▂▁  (last 6 steps)")) << t;
  EXPECT_TRUE(Has(t, "comm      exposed 12.5% of step time, all-reduce 25.0%")) << t;
  EXPECT_TRUE(Has(t, "ETA 5s")) << t;  // 120 steps x 0.04 s
  EXPECT_TRUE(Has(t, "RANK  NODE  STATE    STEP  LOSS    SAMPLES/S  COMM   HB_AGE")) << t;
  EXPECT_TRUE(Has(t, "0     n1    running  80    3.0000  256.0      12.5%  0.2s")) << t;
  EXPECT_TRUE(Has(t, "1     n1    running  80    3.5000  256.0      12.5%  1.2s")) << t;
  EXPECT_EQ(t.back(), '\n');
}

TEST(WatchViewTest, FinishedJobWithoutLiveSamples) {
  WatchInput in;
  in.job.set_id("j-000008-ffff");
  in.job.set_state(v1::FAILED);
  in.job.set_message("rank 1 exited with code 1");
  in.job.set_total_steps(50);
  in.job.set_step(20);
  in.job.set_loss(6.5);
  v1::RankProgress* p = in.job.add_ranks();
  p->set_rank(1);
  p->set_state("failed");
  p->set_step(20);
  p->set_loss(6.5);
  p->set_exit_code(1);
  std::string t = RenderWatch(in, 10);
  EXPECT_TRUE(Has(t, "FAILED")) << t;
  EXPECT_TRUE(Has(t, "rank 1 exited with code 1")) << t;
  EXPECT_TRUE(Has(t, "[████░░░░░░]  40%  step 20/50")) << t;
  EXPECT_TRUE(Has(t, "comm      -")) << t;
  EXPECT_TRUE(Has(t, "exit 1")) << t;
  EXPECT_FALSE(Has(t, "ETA")) << t;
  EXPECT_FALSE(Has(t, "▁")) << "no sparkline without losses\n" << t;
}

}  // namespace
}  // namespace cli
}  // namespace dgca
