// CPU admission (placement.h CpuLoads, CpuPlanFits): CPU jobs queue rather
// than oversubscribe a node's CPUs or memory.
#include "coordinator/placement.h"

#include <gtest/gtest.h>

namespace dgca {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

v1::Plan CpuPlan(int ranks, int threads, double memory_per_rank) {
  v1::Plan p;
  p.set_device("cpu");
  p.set_ranks(ranks);
  p.set_threads_per_rank(threads);
  p.set_predicted_memory_bytes(memory_per_rank);
  return p;
}

std::unique_ptr<JobRt> Running(const std::string& id, const v1::Plan& plan,
                               const std::string& node) {
  auto rt = std::make_unique<JobRt>();
  rt->id = id;
  rt->state = v1::RUNNING;
  rt->plan = plan;
  rt->ranks.resize(plan.ranks());
  for (RankRt& r : rt->ranks) r.node = node;
  return rt;
}

class CpuAdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::RegisterAgent reg;
    reg.set_node("a");
    reg.mutable_topology()->set_cpu_count(4);
    reg.mutable_topology()->set_memory_bytes(static_cast<uint64_t>(10 * kGiB));
    nodes_.Register(reg, "peer", nullptr, Clock::TimePoint());
  }
  std::vector<RankSlot> On(const std::string& node, int ranks) {
    return std::vector<RankSlot>(ranks, RankSlot{node, -1});
  }
  NodeRegistry nodes_;
  std::map<std::string, std::unique_ptr<JobRt>> jobs_;
};

TEST_F(CpuAdmissionTest, RunningRanksAreCountedPerNodeAndExitedOnesAreNot) {
  jobs_["j1"] = Running("j1", CpuPlan(2, 1, 1 * kGiB), "a");
  jobs_["j2"] = Running("j2", CpuPlan(2, 2, 0.5 * kGiB), "a");
  jobs_["j2"]->ranks[1].exited = true;
  auto gpu = Running("g", CpuPlan(1, 8, 4 * kGiB), "a");
  gpu->plan.set_device("cuda");
  jobs_["g"] = std::move(gpu);
  auto loads = CpuLoads(jobs_, nullptr);
  ASSERT_EQ(loads.count("a"), 1u);
  EXPECT_EQ(loads["a"].threads, 2 * 1 + 1 * 2);
  EXPECT_DOUBLE_EQ(loads["a"].memory_bytes, 2 * kGiB + 0.5 * kGiB);
  EXPECT_EQ(loads["a"].jobs, (std::set<std::string>{"j1", "j2"}));
  // The job asking is not its own load.
  auto without = CpuLoads(jobs_, jobs_["j1"].get());
  EXPECT_EQ(without["a"].threads, 2);
}

TEST_F(CpuAdmissionTest, AJobThatWouldOversubscribeTheCpusWaitsAndSaysWhy) {
  jobs_["j1"] = Running("j1", CpuPlan(2, 1, 0), "a");
  std::string why;
  EXPECT_TRUE(CpuPlanFits(CpuPlan(2, 1, 0), On("a", 2), CpuLoads(jobs_, nullptr), nodes_, &why))
      << why;  // 2 + 2 = 4 CPUs
  EXPECT_FALSE(CpuPlanFits(CpuPlan(3, 1, 0), On("a", 3), CpuLoads(jobs_, nullptr), nodes_, &why));
  EXPECT_EQ(why,
            "waiting for capacity: node a has 4 CPUs; job j1 holds 2 threads, and this job's 3 "
            "ranks there need 3 more (3 x 1 threads per rank)");
}

TEST_F(CpuAdmissionTest, TheCgroupCpuLimitIsTheNodesWhenLower) {
  v1::RegisterAgent reg;
  reg.set_node("a");
  reg.mutable_topology()->set_cpu_count(4);
  reg.mutable_topology()->set_cgroup_cpu_limit(2.5);
  nodes_.Register(reg, "peer", nullptr, Clock::TimePoint());
  jobs_["j1"] = Running("j1", CpuPlan(1, 1, 0), "a");
  std::string why;
  EXPECT_TRUE(CpuPlanFits(CpuPlan(1, 1, 0), On("a", 1), CpuLoads(jobs_, nullptr), nodes_, &why));
  EXPECT_FALSE(CpuPlanFits(CpuPlan(2, 1, 0), On("a", 2), CpuLoads(jobs_, nullptr), nodes_, &why));
  EXPECT_NE(why.find("node a has 2 CPUs"), std::string::npos) << why;
}

TEST_F(CpuAdmissionTest, PredictedMemoryBeyondNinetyPercentWaits) {
  jobs_["j1"] = Running("j1", CpuPlan(1, 1, 6 * kGiB), "a");
  std::string why;
  EXPECT_TRUE(
      CpuPlanFits(CpuPlan(1, 1, 2.9 * kGiB), On("a", 1), CpuLoads(jobs_, nullptr), nodes_, &why))
      << why;
  EXPECT_FALSE(
      CpuPlanFits(CpuPlan(1, 1, 3.1 * kGiB), On("a", 1), CpuLoads(jobs_, nullptr), nodes_, &why));
  EXPECT_NE(why.find("waiting for capacity: node a has 10.00 GiB of memory (90% usable by ranks); "
                     "job j1 is predicted to hold 6.00 GiB"),
            std::string::npos)
      << why;
}

TEST_F(CpuAdmissionTest, AJobBiggerThanAnIdleNodeRunsAloneRatherThanNever) {
  std::string why;
  EXPECT_TRUE(
      CpuPlanFits(CpuPlan(8, 2, 3 * kGiB), On("a", 8), CpuLoads(jobs_, nullptr), nodes_, &why))
      << why;
  // GPU plans are not this check's.
  jobs_["j1"] = Running("j1", CpuPlan(4, 1, 0), "a");
  v1::Plan gpu = CpuPlan(1, 1, 0);
  gpu.set_device("cuda");
  EXPECT_TRUE(CpuPlanFits(gpu, {RankSlot{"a", 0}}, CpuLoads(jobs_, nullptr), nodes_, &why));
}

TEST_F(CpuAdmissionTest, ATuningTrialHoldsItsRanksUntilTheLaunch) {
  auto rt = std::make_unique<JobRt>();
  rt->id = "t";
  rt->state = v1::PLANNING;
  rt->trials = std::make_shared<TrialState>();
  rt->trials->plan = CpuPlan(2, 2, 0);
  rt->trials->placement = {{"a", -1}, {"a", -1}};
  jobs_["t"] = std::move(rt);
  std::string why;
  EXPECT_FALSE(CpuPlanFits(CpuPlan(1, 1, 0), On("a", 1), CpuLoads(jobs_, nullptr), nodes_, &why));
  EXPECT_NE(why.find("job t holds 4 threads"), std::string::npos) << why;
  jobs_["t"]->trials->done = true;
  EXPECT_TRUE(CpuPlanFits(CpuPlan(1, 1, 0), On("a", 1), CpuLoads(jobs_, nullptr), nodes_, &why));
}

}  // namespace
}  // namespace dgca
