// The keys measurements are filed under, and planning with what the job
// store holds (coordinator/measured_planning.h).
#include "coordinator/measured_planning.h"

#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/plan_checks.h"
#include "planner/compute_prior.h"
#include "gtest/gtest.h"

namespace dgca {
namespace {

// Compute-time measurements are shared by jobs that train the same thing:
// dropout counts as the ranks train it (unset = the default 0.1), and a
// dropout-free spec keys as a spec from before model.dropout did, so the
// measurements stored then still serve it.
TEST(StepKey, DropoutAsTrained) {
  v1::JobSpec legacy;  // no dropout field: a spec stored before model.dropout
  legacy.mutable_model()->set_preset("tiny");
  v1::Plan plan;
  plan.set_device("cpu");
  plan.set_ranks(2);
  auto key = [&](double hidden, double attention, bool set) {
    v1::JobSpec s = legacy;
    if (set) {
      s.mutable_model()->mutable_dropout()->set_hidden(hidden);
      s.mutable_model()->mutable_dropout()->set_attention(attention);
    }
    return StepKey(s, plan, "n1");
  };
  const std::string none = key(0, 0, true), tenth = key(0.1, 0.1, true);
  const std::string before = [&] {  // the key as version 1 wrote it: the model without the field
    v1::JobSpec s = legacy;
    s.mutable_model()->clear_dropout();
    v1::ModelSpec m = s.model();
    return absl::StrCat("nodes=n1 device=cpu ranks=2 threads=", plan.threads_per_rank(), " precision=",
                        plan.precision(), " seq=", s.data().max_seq_len(), " mft=",
                        s.data().mft().ShortDebugString(), " model=", m.ShortDebugString());
  }();
  EXPECT_EQ(none, before) << "dropout 0 must key as specs did before model.dropout";
  EXPECT_NE(none, tenth);
  EXPECT_EQ(key(0, 0, false), tenth) << "an unset field trains the default 0.1";
  EXPECT_NE(key(0.1, 0, true), tenth);
  v1::JobSpec half = legacy;
  half.mutable_model()->mutable_dropout()->set_attention(0.2);  // hidden unset: 0.1
  EXPECT_EQ(StepKey(half, plan, "n1"), key(0.1, 0.2, true));
}

TEST(MemoryKey, AutoAttentionKeysAsTheKernelsTheRanksKept) {
  v1::JobSpec spec;
  v1::Plan plan;
  plan.set_attention("auto");
  const std::string base = StepKey(spec, plan, "n1");
  EXPECT_EQ(MemoryKey(spec, plan, "n1"), base + " attention=fused");  // planning
  EXPECT_EQ(MemoryKey(spec, plan, "n1", "gemm"), base + " attention=gemm");
  plan.set_attention("gemm");
  EXPECT_EQ(MemoryKey(spec, plan, "n1", "fused"), base + " attention=gemm");
}

// A store with one earlier job's compute measurement on the node: the plan
// predicts from it and cites it; without it the plan has no prediction.
TEST(PlanMeasured, PredictsFromAStoredComputeMeasurement) {
  char tmpl[] = "/tmp/dgca-measured-planning-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto store = JobStore::Open(dir + "/dgca.db");
  ASSERT_TRUE(store.ok()) << store.status();
  v1::JobSpec spec;
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_train()->set_global_batch(32);
  spec.mutable_resources()->set_ranks(2);
  spec.mutable_resources()->set_device("cpu");
  v1::Topology node;
  node.set_node("n1");
  node.set_cpu_count(2);
  node.set_memory_bytes(8ull << 30);
  auto first = PlanMeasured(store->get(), spec, {node});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->predicted_step_seconds(), 0);

  StepMeasurement m;
  m.job_id = "j-earlier";
  m.key = StepKey(spec, *first, "n1");
  m.micro_batch = first->micro_batch();
  m.compute_seconds = 0.05;
  m.samples = 40;
  m.time_unix_ms = NowUnixMs();
  ASSERT_TRUE((*store)->AddStepMeasurement(m).ok());
  auto second = PlanMeasured(store->get(), spec, {node});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(second->predicted_step_seconds(), 0.05);
  bool cited = false;
  for (const auto& d : second->decisions())
    cited |= absl::StrContains(d.reason(), "measured by earlier jobs of this model on these nodes") &&
             absl::StrContains(d.reason(), "j-earlier");
  EXPECT_TRUE(cited);
  store->reset();
  std::filesystem::remove_all(dir);
}

// The efficiency one finished job reached on a device class (the review
// stores it) serves the first plan of another model on that class: its
// prediction scales with it and cites the job.
TEST(PlanMeasured, EfficiencyLearnedOnADeviceClassServesAnotherModel) {
  char tmpl[] = "/tmp/dgca-measured-planning-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto store = JobStore::Open(dir + "/dgca.db");
  ASSERT_TRUE(store.ok()) << store.status();
  v1::Topology node;
  node.set_node("n1");
  node.set_cpu_count(2);
  node.set_memory_bytes(8ull << 30);
  node.set_cpu_model("Test CPU");
  node.set_cpu_gemm_flops_one_thread(30e9);
  node.set_cpu_gemm_flops_all_threads(34e9);
  v1::JobSpec tiny;
  tiny.mutable_model()->set_preset("tiny");
  tiny.mutable_data()->set_max_seq_len(40);
  tiny.mutable_train()->set_global_batch(8);
  tiny.mutable_resources()->set_ranks(1);
  tiny.mutable_resources()->set_device("cpu");
  auto job_plan = PlanMeasured(store->get(), tiny, {node});
  ASSERT_TRUE(job_plan.ok()) << job_plan.status();
  EXPECT_EQ(job_plan->compute_source(), "prior");
  EXPECT_EQ(job_plan->compute_device_class(), "cpu Test CPU x2");
  // The job ran at half the prior's speed: its review stores the efficiency.
  const double predicted = job_plan->predicted_step_seconds();
  std::vector<StepSample> samples(30);
  for (auto& x : samples) x.step_seconds = 2 * predicted;
  PlanReview review = ReviewPlan("j-tiny", tiny, *job_plan, samples, "n1", v1::SUCCEEDED, "",
                                 false, NowUnixMs());
  ASSERT_TRUE(review.efficiency.has_value());
  EXPECT_NEAR(review.efficiency->efficiency, kCpuEfficiencyOfRecord / 2, 1e-3);
  const std::string text = RecordReview(store->get(), review);
  EXPECT_TRUE(absl::StrContains(text, "efficiency 0.350 of the ideal on cpu Test CPU x2")) << text;

  // Another model on the same class: planned with the learned efficiency.
  v1::JobSpec small = tiny;
  small.mutable_model()->set_preset("small");
  auto record = MakePlan(small, {node}, PlannerMeasurements{});
  auto learned = PlanMeasured(store->get(), small, {node});
  ASSERT_TRUE(record.ok() && learned.ok());
  EXPECT_EQ(learned->compute_source(), "prior");
  EXPECT_NEAR(learned->predicted_step_seconds() / record->predicted_step_seconds(), 2, 1e-3);
  bool cited = false;
  for (const auto& d : learned->decisions())
    cited |= absl::StrContains(d.reason(), "the median of the newest 1 job(s) on cpu Test CPU x2") &&
             absl::StrContains(d.reason(), "j-tiny 0.350");
  EXPECT_TRUE(cited);
  // An implausible efficiency (more than 10x the ideal) is not stored.
  for (auto& x : samples) x.step_seconds = predicted / 100;
  EXPECT_FALSE(ReviewPlan("j-odd", tiny, *job_plan, samples, "n1", v1::SUCCEEDED, "", false,
                          NowUnixMs())
                   .efficiency.has_value());
  store->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dgca
