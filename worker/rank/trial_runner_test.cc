// LocalTrialRunner: really trains a candidate for a few steps (1 and 2 ranks,
// tiny preset on the shared ECSpell data) and returns seconds per step; a
// budget too small stops the trial; MakePlan in trial mode logs the trials
// it timed with this runner.
#include "worker/rank/trial_runner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "worker/rank/train_config.h"
#include "topology/probe.h"

namespace dgca {
namespace {

std::string Data() {
  const char* d = std::getenv("DGCA_SHARED_DATA");
  return d && *d ? d : "../shared/data";
}
bool HaveData() { return access((Data() + "/ecspell/train_law.txt").c_str(), R_OK) == 0; }

v1::JobSpec TinySpec() {
  v1::JobSpec s;
  s.set_name("trial");
  s.mutable_model()->set_preset("tiny");
  s.mutable_model()->mutable_prompt()->set_length(3);
  s.mutable_model()->mutable_prompt()->set_encoder("lstm");
  s.mutable_model()->mutable_heads_spec()->set_detector(true);
  s.mutable_model()->mutable_heads_spec()->set_fusion("gated");
  s.mutable_model()->mutable_heads_spec()->mutable_candidate()->set_top_k(8);
  s.mutable_model()->mutable_heads_spec()->mutable_candidate()->set_enabled(true);
  s.mutable_data()->set_train(Data() + "/ecspell/train_law.txt");
  s.mutable_data()->set_eval(Data() + "/ecspell/test_law.txt");
  s.mutable_data()->set_max_seq_len(32);
  s.mutable_data()->mutable_mft()->set_mode("noerror");
  s.mutable_data()->mutable_mft()->set_rate(0.3);
  s.mutable_data()->mutable_loader()->set_prefetch(2);
  s.mutable_train()->set_steps(100);
  s.mutable_train()->set_global_batch(8);
  s.mutable_train()->set_precision("fp32");
  s.mutable_train()->mutable_optimizer()->set_lr(1e-3);
  s.mutable_train()->set_seed(42);
  s.mutable_resources()->set_device("cpu");
  s.mutable_resources()->set_threads_per_rank(1);
  s.mutable_comm()->set_backend("auto");
  s.mutable_comm()->set_overlap(true);
  s.mutable_comm()->set_timeout_s(30);
  s.mutable_tuning()->set_mode("trial");
  s.mutable_tuning()->set_budget_s(60);
  return s;
}

v1::Plan Candidate(const v1::JobSpec& spec, int ranks, int micro, int accumulation) {
  v1::Plan p = SimplePlan(spec, ranks);
  p.set_ranks(ranks);
  p.set_micro_batch(micro);
  p.set_accumulation(accumulation);
  p.set_threads_per_rank(1);
  p.set_bucket_mb(1);
  return p;
}

TEST(LocalTrialRunnerTest, OneAndTwoRanksGiveStepTimes) {
  if (!HaveData()) GTEST_SKIP() << "no ECSpell data under " << Data();
  LocalTrialRunner runner(TinySpec());
  auto one = runner.TimeStep(Candidate(TinySpec(), 1, 4, 2), 60);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_GT(*one, 0);
  EXPECT_LT(*one, 30);
  auto two = runner.TimeStep(Candidate(TinySpec(), 2, 4, 1), 60);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_GT(*two, 0);
  std::fprintf(stderr, "tiny, seq 32: 1 rank micro 4 x 2: %.3f s/step; 2 ranks micro 4: %.3f s/step\n",
               *one, *two);
}

TEST(LocalTrialRunnerTest, BudgetTooSmallStopsTheTrial) {
  if (!HaveData()) GTEST_SKIP() << "no ECSpell data under " << Data();
  LocalTrialRunner runner(TinySpec());
  auto r = runner.TimeStep(Candidate(TinySpec(), 1, 4, 1), 1e-3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_FALSE(runner.TimeStep(Candidate(TinySpec(), 1, 4, 1), 0).ok());
}

TEST(LocalTrialRunnerTest, MakePlanInTrialModeLogsMeasuredTrials) {
  if (!HaveData()) GTEST_SKIP() << "no ECSpell data under " << Data();
  v1::JobSpec spec = TinySpec();
  spec.mutable_resources()->set_ranks(1);
  ProbeOptions po;
  auto topo = ProbeTopology(po);
  ASSERT_TRUE(topo.ok()) << topo.status();
  LocalTrialRunner runner(spec);
  auto plan = MakePlan(spec, {*topo}, PlannerMeasurements(), &runner);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->trials_size(), 0) << plan->DebugString();
  int measured = 0;
  for (const auto& t : plan->trials()) {
    if (t.measured_step_seconds() > 0) ++measured;
  }
  EXPECT_GT(measured, 0) << plan->DebugString();
}

}  // namespace
}  // namespace dgca
