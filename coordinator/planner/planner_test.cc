#include "coordinator/planner/planner.h"

#include "gtest/gtest.h"

namespace dgca {
namespace {

const v1::PlanDecision* Find(const v1::Plan& p, const std::string& name) {
  for (const auto& d : p.decisions())
    if (d.name() == name) return &d;
  return nullptr;
}

TEST(Planner, CpuJobDefaults) {
  v1::JobSpec spec;
  spec.mutable_train()->set_global_batch(32);
  v1::Topology t;
  t.set_node("n0");
  t.set_cpu_count(8);
  auto plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device(), "cpu");
  EXPECT_EQ(plan->backend(), "gloo");
  EXPECT_EQ(plan->ranks(), 2);
  EXPECT_EQ(plan->micro_batch(), 16);
  EXPECT_EQ(plan->accumulation(), 1);
  EXPECT_EQ(plan->precision(), "fp32");
  EXPECT_EQ(plan->threads_per_rank(), 4);
  ASSERT_NE(Find(*plan, "resources.ranks"), nullptr);
  for (const auto& d : plan->decisions()) EXPECT_FALSE(d.reason().empty()) << d.name();
}

TEST(Planner, UserValuesWin) {
  v1::JobSpec spec;
  spec.mutable_train()->set_global_batch(32);
  spec.mutable_resources()->set_ranks(4);
  spec.mutable_train()->set_micro_batch(2);
  v1::Topology t;
  t.set_cpu_count(8);
  auto plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ranks(), 4);
  EXPECT_EQ(plan->micro_batch(), 2);
  EXPECT_EQ(Find(*plan, "resources.ranks")->source(), v1::USER);
  EXPECT_EQ(Find(*plan, "train.micro_batch")->source(), v1::USER);
}

TEST(Planner, NoNodesIsAnError) {
  EXPECT_FALSE(MakePlan(v1::JobSpec(), {}, PlannerMeasurements{}).ok());
}

}  // namespace
}  // namespace dgca
