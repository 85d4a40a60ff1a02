#include "planner/diagnosis.h"

#include <algorithm>
#include <string>
#include <vector>

#include "planner/planner.h"
#include "gtest/gtest.h"

namespace dgca {
namespace {

v1::Plan PlanOf(int ranks, int micro, int accumulation, const std::string& device) {
  v1::Plan p;
  p.set_ranks(ranks);
  p.set_micro_batch(micro);
  p.set_accumulation(accumulation);
  p.set_device(device);
  p.set_backend(device == "cuda" ? "nccl" : "gloo");
  p.set_precision(device == "cuda" ? "bf16" : "fp32");
  p.set_loader_threads(1);
  p.set_threads_per_rank(1);
  for (int r = 0; r < ranks; ++r) p.add_rank_nodes("n" + std::to_string(r / 2));
  return p;
}

// `steps` steps of every rank: step = data + compute + exposed, with
// compute scaled per rank by `slow[rank]` (1 = nominal) and a little
// spread so the medians are not all one value.
std::vector<StepSample> Steps(int ranks, int steps, double data, double compute, double exposed,
                              std::vector<double> slow = {}) {
  slow.resize(ranks, 1.0);
  std::vector<StepSample> out;
  for (int s = 0; s < steps; ++s) {
    const double jitter = 1 + 0.01 * ((s % 3) - 1);
    for (int r = 0; r < ranks; ++r) {
      StepSample x;
      x.rank = r;
      x.data_wait_seconds = data * jitter;
      x.exposed_seconds = exposed * jitter;
      x.allreduce_seconds = 2 * exposed * jitter;
      x.step_seconds = x.data_wait_seconds + compute * slow[r] * jitter + x.exposed_seconds;
      out.push_back(x);
    }
  }
  return out;
}

// `steps` synchronous data-parallel steps: every rank reaches the
// all-reduce after its data wait and compute; once the last one is there
// the link takes `link` s, so each rank's exposed time is `link` plus its
// wait for the last. Rank `slow` waits `slow_data` for data and computes
// `slow_compute`, the others 0 and `compute`. All-reduce time: exposed +
// `hidden` (the part behind the backward).
std::vector<StepSample> SyncSteps(int ranks, int slow, double slow_data, double slow_compute,
                                  double compute, double link, double hidden, int steps = 20) {
  const double last = std::max(slow_data + slow_compute, compute);
  std::vector<StepSample> out;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < ranks; ++r) {
      StepSample x;
      x.rank = r;
      x.data_wait_seconds = r == slow ? slow_data : 0.0;
      const double c = r == slow ? slow_compute : compute;
      x.exposed_seconds = link + (last - (x.data_wait_seconds + c));
      x.allreduce_seconds = x.exposed_seconds + hidden;
      x.step_seconds = x.data_wait_seconds + c + x.exposed_seconds;
      out.push_back(x);
    }
  }
  return out;
}

v1::DiagnoseJobResponse Diagnose(const v1::Plan& plan, const std::vector<StepSample>& samples,
                                 const v1::JobSpec& spec = {}) {
  v1::DiagnoseJobResponse out;
  *out.mutable_breakdown() = BreakdownOf(samples, plan);
  absl::Status st = DiagnoseSteps(plan, spec, out.breakdown(), &out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

const v1::DiagnoseFinding* Find(const v1::DiagnoseJobResponse& d, const std::string& stage) {
  for (const auto& f : d.findings()) {
    if (f.stage() == stage) return &f;
  }
  return nullptr;
}

TEST(MedianOf, OddEvenEmpty) {
  EXPECT_EQ(MedianOf({}), 0);
  EXPECT_EQ(MedianOf({3, 1, 2}), 2);
  EXPECT_EQ(MedianOf({4, 1, 3, 2}), 2.5);
}

TEST(BreakdownOf, MediansPerRankAndPartsAddUpToTheStep) {
  const v1::Plan plan = PlanOf(2, 8, 1, "cpu");
  std::vector<StepSample> s;
  // rank 0: steps 1.0, 1.2, 1.1 (data 0.1, 0.3, 0.2; exposed 0.2 each);
  // rank 1: steps 2.0, 2.0 (data 0, exposed 0.5, 0.7); one unusable sample.
  s.push_back({0, 1.0, 0.1, 0.2, 0.4});
  s.push_back({0, 1.2, 0.3, 0.2, 0.4});
  s.push_back({0, 1.1, 0.2, 0.2, 0.4});
  s.push_back({1, 2.0, 0.0, 0.5, 0.6});
  s.push_back({1, 2.0, 0.0, 0.7, 0.8});
  s.push_back({1, 0.0, 5.0, 5.0, 5.0});  // no step time: skipped
  const v1::StepBreakdown b = BreakdownOf(s, plan);
  EXPECT_EQ(b.samples(), 5);
  ASSERT_EQ(b.ranks_size(), 2);
  EXPECT_EQ(b.ranks(0).rank(), 0);
  EXPECT_EQ(b.ranks(0).node(), "n0");
  EXPECT_EQ(b.ranks(0).samples(), 3);
  EXPECT_DOUBLE_EQ(b.ranks(0).step_seconds(), 1.1);
  EXPECT_DOUBLE_EQ(b.ranks(0).data_wait_seconds(), 0.2);
  EXPECT_DOUBLE_EQ(b.ranks(0).exposed_comm_seconds(), 0.2);
  EXPECT_DOUBLE_EQ(b.ranks(0).allreduce_seconds(), 0.4);
  EXPECT_NEAR(b.ranks(0).compute_seconds(), 1.1 - 0.2 - 0.2, 1e-12);
  EXPECT_EQ(b.ranks(1).samples(), 2);
  EXPECT_DOUBLE_EQ(b.ranks(1).exposed_comm_seconds(), 0.6);
  EXPECT_NEAR(b.ranks(1).compute_seconds(), 1.4, 1e-12);
  // The job's figures: rank 1 spends longest before the all-reduce (0 +
  // 1.4 s against 0.2 + 0.7 s).
  EXPECT_EQ(b.critical_rank(), 1);
  EXPECT_DOUBLE_EQ(b.step_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(b.data_wait_seconds(), 0.0);
  EXPECT_DOUBLE_EQ(b.exposed_comm_seconds(), 0.6);
  EXPECT_DOUBLE_EQ(b.allreduce_seconds(), 0.7);
  EXPECT_NEAR(b.compute_seconds(), 1.4, 1e-12);
  EXPECT_NEAR(b.data_wait_seconds() + b.compute_seconds() + b.exposed_comm_seconds(),
              b.step_seconds(), 1e-12);
}

TEST(BreakdownOf, EqualRanksMakeTheLowestCritical) {
  const v1::StepBreakdown b = BreakdownOf(Steps(3, 10, 0.0, 1.0, 0.1), PlanOf(3, 8, 1, "cpu"));
  EXPECT_EQ(b.critical_rank(), 0);
  EXPECT_EQ(b.samples(), 30);
}

TEST(GlobalBatchForCommTarget, SmallestWholeBatchThatMeetsTheTarget) {
  const v1::Plan plan = PlanOf(2, 8, 1, "cpu");  // global 16, in units of 16
  EXPECT_EQ(GlobalBatchForCommTarget(plan, 0.05), 16);
  EXPECT_EQ(GlobalBatchForCommTarget(plan, 1.0), 0);
  for (double share : {0.11, 0.2, 0.4, 0.75}) {
    const int64_t g = GlobalBatchForCommTarget(plan, share);
    ASSERT_GT(g, 16) << share;
    EXPECT_EQ(g % 16, 0) << share;
    // Exposed E fixed, compute C scales with the global batch.
    const double e = share, c = 1 - share;
    auto share_at = [&](int64_t global) { return e / (e + c * global / 16.0); };
    EXPECT_LE(share_at(g), kTargetCommShare + 1e-9) << share;
    EXPECT_GT(share_at(g - 16), kTargetCommShare) << share;
  }
}

TEST(DiagnoseSteps, ComputeBoundWhenNothingElseIsPastItsLimit) {
  const v1::Plan plan = PlanOf(2, 8, 2, "cpu");
  const auto d = Diagnose(plan, Steps(2, 20, 0.001, 0.9, 0.05));
  EXPECT_EQ(d.limiting_stage(), "compute");
  ASSERT_EQ(d.findings_size(), 4);
  EXPECT_EQ(d.findings(0).stage(), "data");
  EXPECT_EQ(d.findings(1).stage(), "compute");
  EXPECT_EQ(d.findings(2).stage(), "comm");
  EXPECT_EQ(d.findings(3).stage(), "straggler");
  for (const auto& f : d.findings()) {
    EXPECT_EQ(f.limiting(), f.stage() == "compute") << f.stage();
    EXPECT_FALSE(f.above_limit()) << f.stage();
    EXPECT_EQ(f.fix(), "") << f.stage();
  }
  EXPECT_NE(d.findings(1).finding().find("micro-batch 8 x 2 accumulation"), std::string::npos)
      << d.findings(1).finding();
  EXPECT_NE(d.findings(1).finding().find("compute-bound"), std::string::npos);
  double shares = 0;
  for (const auto& f : d.findings()) shares += f.stage() == "straggler" ? 0 : f.share();
  EXPECT_NEAR(shares, 1.0, 1e-9);
}

TEST(DiagnoseSteps, AStarvedLoaderIsTheDataStageWithTheLoaderFix) {
  v1::Plan plan = PlanOf(2, 8, 1, "cpu");
  v1::JobSpec spec;
  spec.mutable_data()->mutable_loader()->set_prefetch(3);
  // data 0.2 of a 1.0 s step; exposed 0.05.
  const auto d = Diagnose(plan, Steps(2, 20, 0.2, 0.75, 0.05), spec);
  EXPECT_EQ(d.limiting_stage(), "data");
  const auto* f = Find(d, "data");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->limiting());
  EXPECT_NEAR(f->share(), 0.2, 1e-9);
  EXPECT_NE(f->fix().find("raise data.loader.threads to 2 (the plan runs 1)"), std::string::npos)
      << f->fix();
  EXPECT_NE(f->fix().find("data.loader.prefetch to 6 (now 3)"), std::string::npos) << f->fix();
  EXPECT_NE(f->fix().find("resources.threads_per_rank"), std::string::npos) << f->fix();
  EXPECT_FALSE(Find(d, "comm")->above_limit());
  EXPECT_NE(f->fix().find("about +25% samples/s"), std::string::npos) << f->fix();
  // GPU ranks: no advice about sharing cores.
  const auto g = Diagnose(PlanOf(2, 8, 1, "cuda"), Steps(2, 20, 0.2, 0.75, 0.05), spec);
  EXPECT_EQ(Find(g, "data")->fix().find("threads_per_rank"), std::string::npos);
}

// One rank's loader is slow (0.4 s a step); the others wait those 0.4 s at
// the all-reduce, so their exposed communication is 0.45 s. Pooled, that
// would read as a communication problem; the critical rank shows the loader.
TEST(DiagnoseSteps, OneSlowLoaderIsDataNotCommunication) {
  for (int ranks : {2, 4}) {
    const auto d = Diagnose(PlanOf(ranks, 8, 1, "cpu"),
                            SyncSteps(ranks, ranks - 1, 0.4, 0.75, 0.75, 0.05, 0.05));
    EXPECT_EQ(d.limiting_stage(), "data") << ranks;
    EXPECT_EQ(d.breakdown().critical_rank(), ranks - 1);
    EXPECT_NEAR(Find(d, "data")->share(), 0.4 / 1.2, 1e-9) << ranks;
    EXPECT_NE(Find(d, "data")->finding().find("rank " + std::to_string(ranks - 1)),
              std::string::npos)
        << Find(d, "data")->finding();
    EXPECT_FALSE(Find(d, "comm")->above_limit()) << Find(d, "comm")->finding();
    EXPECT_NEAR(Find(d, "comm")->share(), 0.05 / 1.2, 1e-9) << ranks;
    EXPECT_NE(Find(d, "comm")->finding().find("mostly waiting for rank " +
                                              std::to_string(ranks - 1)),
              std::string::npos)
        << Find(d, "comm")->finding();
    EXPECT_FALSE(Find(d, "straggler")->above_limit()) << Find(d, "straggler")->finding();
  }
}

TEST(DiagnoseSteps, ExposedCommunicationNamesTheGlobalBatchThatMeetsTheTarget) {
  v1::Plan plan = PlanOf(2, 8, 1, "cpu");
  const auto d = Diagnose(plan, Steps(2, 20, 0.0, 0.6, 0.4));
  EXPECT_EQ(d.limiting_stage(), "comm");
  const auto* f = Find(d, "comm");
  ASSERT_NE(f, nullptr);
  EXPECT_NEAR(f->share(), 0.4, 1e-9);
  const int64_t want = GlobalBatchForCommTarget(plan, f->share());
  EXPECT_NE(f->fix().find("raise train.global_batch to >= " + std::to_string(want) + " (now 16)"),
            std::string::npos)
      << f->fix();
  // Predicted from the nominal link: ask for a measurement.
  EXPECT_NE(f->fix().find("dgca diagnose comm --ranks 2 --device cpu"), std::string::npos)
      << f->fix();
  EXPECT_NE(f->finding().find("50% of it hidden"), std::string::npos) << f->finding();
  plan.set_allreduce_measured(true);
  const auto m = Diagnose(plan, Steps(2, 20, 0.0, 0.6, 0.4));
  EXPECT_EQ(Find(m, "comm")->fix().find("dgca diagnose comm"), std::string::npos);
}

TEST(DiagnoseSteps, TheCostlierOfTwoStagesPastTheirLimitsLimits) {
  const v1::Plan plan = PlanOf(2, 8, 1, "cpu");
  auto d = Diagnose(plan, Steps(2, 20, 0.3, 0.5, 0.2));
  EXPECT_EQ(d.limiting_stage(), "data");
  EXPECT_TRUE(Find(d, "comm")->above_limit());
  EXPECT_FALSE(Find(d, "comm")->limiting());
  d = Diagnose(plan, Steps(2, 20, 0.2, 0.5, 0.3));
  EXPECT_EQ(d.limiting_stage(), "comm");
  EXPECT_TRUE(Find(d, "data")->above_limit());
}

// Just past a limit (within kNearLimitBand of it) is named with its fix but
// does not limit: the quickstart's comm share crosses 10% between runs.
TEST(DiagnoseSteps, AStageJustPastItsLimitIsNearNotLimiting) {
  const v1::Plan plan = PlanOf(2, 8, 1, "cpu");
  // Exposed 0.11 of a 1.0 s step: 11%, inside 10% x 1.2.
  auto d = Diagnose(plan, Steps(2, 20, 0.0, 0.89, 0.11));
  const auto* comm = Find(d, "comm");
  EXPECT_TRUE(comm->above_limit());
  EXPECT_TRUE(comm->near_limit());
  EXPECT_FALSE(comm->limiting());
  EXPECT_NE(comm->fix().find("raise train.global_batch"), std::string::npos) << comm->fix();
  EXPECT_NE(comm->finding().find("within 20% of its limit"), std::string::npos) << comm->finding();
  EXPECT_EQ(d.limiting_stage(), "compute");
  EXPECT_NE(Find(d, "compute")->finding().find("(comm is near its limit)"), std::string::npos)
      << Find(d, "compute")->finding();
  // 12.5%: past the band, limiting.
  d = Diagnose(plan, Steps(2, 20, 0.0, 0.875, 0.125));
  EXPECT_FALSE(Find(d, "comm")->near_limit());
  EXPECT_EQ(d.limiting_stage(), "comm");
  // A near stage does not hide a clear one: data 5.5% (near), comm 30%.
  d = Diagnose(plan, Steps(2, 20, 0.055, 0.645, 0.3));
  EXPECT_TRUE(Find(d, "data")->near_limit());
  EXPECT_EQ(d.limiting_stage(), "comm");
  // A straggler at +11%: near; at +13%: limiting.
  d = Diagnose(plan, Steps(2, 20, 0, 1.0, 0.01, {1.0, 1.11}));
  EXPECT_TRUE(Find(d, "straggler")->near_limit()) << Find(d, "straggler")->finding();
  EXPECT_EQ(d.limiting_stage(), "compute");
  d = Diagnose(plan, Steps(2, 20, 0, 1.0, 0.01, {1.0, 1.13}));
  EXPECT_FALSE(Find(d, "straggler")->near_limit());
  EXPECT_EQ(d.limiting_stage(), "straggler");
}

// One rank computes 30% longer; the others wait for it at the all-reduce,
// which they measure as exposed communication. The straggler limits, and
// communication is judged by the slowest rank's own exposed time.
TEST(DiagnoseSteps, AStragglerIsNamedAndItsWaitIsNotBlamedOnTheLink) {
  const v1::Plan plan = PlanOf(4, 8, 1, "cuda");
  const auto d = Diagnose(plan, SyncSteps(4, 2, 0.0, 1.3, 1.0, 0.03, 0.07));
  EXPECT_EQ(d.limiting_stage(), "straggler");
  const auto* st = Find(d, "straggler");
  ASSERT_NE(st, nullptr);
  EXPECT_TRUE(st->limiting());
  EXPECT_NE(st->finding().find("rank 2 (node n1)"), std::string::npos) << st->finding();
  EXPECT_NE(st->finding().find("+30.0%"), std::string::npos) << st->finding();
  EXPECT_NE(st->fix().find("node n1"), std::string::npos) << st->fix();
  EXPECT_NE(st->fix().find("nvidia-smi"), std::string::npos) << st->fix();
  const auto* comm = Find(d, "comm");
  EXPECT_NEAR(comm->share(), 0.03 / 1.33, 1e-9);
  EXPECT_FALSE(comm->above_limit()) << comm->finding();
  EXPECT_NE(comm->finding().find("on the critical rank, 2"), std::string::npos) << comm->finding();
  EXPECT_NE(comm->finding().find("mostly waiting for rank 2"), std::string::npos)
      << comm->finding();
  EXPECT_NE(st->fix().find("about +29% samples/s if it kept up"), std::string::npos) << st->fix();

  // Ranks within the limit of each other: no straggler.
  const auto even = Diagnose(plan, Steps(4, 20, 0, 1.0, 0.03, {1.0, 1.05, 1.0, 1.08}));
  EXPECT_FALSE(Find(even, "straggler")->above_limit());
  EXPECT_EQ(even.limiting_stage(), "compute");
}

TEST(DiagnoseSteps, TwoRanksCompareTheSlowOneWithTheOther) {
  // Rank 1 computes 1.8 s, rank 0 1.0 s and waits 0.8 s at the all-reduce;
  // the link costs 0.05 s. 80% slower than the other rank (against a median
  // over both ranks it would read as 29%).
  const std::vector<StepSample> s = SyncSteps(2, 1, 0.0, 1.8, 1.0, 0.05, 0.1);
  const v1::Plan plan = PlanOf(2, 8, 1, "cpu");
  const v1::StepBreakdown b = BreakdownOf(s, plan);
  EXPECT_EQ(b.critical_rank(), 1);
  EXPECT_NEAR(b.compute_seconds(), 1.8, 1e-9);
  EXPECT_NEAR(b.exposed_comm_seconds(), 0.05, 1e-9);
  const auto d = Diagnose(plan, s);
  EXPECT_EQ(d.limiting_stage(), "straggler");
  EXPECT_NE(Find(d, "straggler")->finding().find("+80.0%"), std::string::npos)
      << Find(d, "straggler")->finding();
  EXPECT_NE(Find(d, "straggler")->fix().find("resources.threads_per_rank (1)"), std::string::npos);
  EXPECT_NEAR(Find(d, "comm")->share(), 0.05 / 1.85, 1e-9);
  EXPECT_NE(Find(d, "comm")->finding().find("(up to 45.9%) is mostly waiting for rank 1"),
            std::string::npos)
      << Find(d, "comm")->finding();
}

TEST(DiagnoseSteps, OneRankHasNoCommunicationAndNoStraggler) {
  const auto d = Diagnose(PlanOf(1, 8, 1, "cpu"), Steps(1, 20, 0.0, 1.0, 0.0));
  ASSERT_EQ(d.findings_size(), 3);
  EXPECT_EQ(Find(d, "straggler"), nullptr);
  EXPECT_EQ(Find(d, "comm")->finding(), "one rank: no gradient all-reduce");
  EXPECT_EQ(d.limiting_stage(), "compute");
}

TEST(DiagnoseSteps, NoStepTimeIsAnError) {
  v1::DiagnoseJobResponse out;
  absl::Status st = DiagnoseSteps(PlanOf(2, 8, 1, "cpu"), {}, v1::StepBreakdown(), &out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- memory

constexpr double kGiB = 1024.0 * 1024 * 1024;

// A plan whose memory model predicts `state` + m x `per_sample` bytes, on a
// device of `device` bytes with `target` bytes as its target.
v1::Plan MemoryPlan(int ranks, int m, int k, const std::string& device_kind, double state,
                    double per_sample, double device, double target) {
  v1::Plan p = PlanOf(ranks, m, k, device_kind);
  p.set_predicted_memory_bytes(state + m * per_sample);
  p.set_predicted_activation_bytes_per_sample(per_sample);
  p.set_device_memory_bytes(device);
  p.set_memory_target_bytes(target);
  return p;
}

// Steps whose memory readings peak at `gpu[rank]` and `host[rank]` on one
// step of the rank's third, 90% of it on the others: the peak is the
// largest reading, neither the median nor the last.
std::vector<StepSample> WithMemory(std::vector<StepSample> steps, const std::vector<double>& gpu,
                                   const std::vector<double>& host) {
  std::vector<int> seen(std::max(gpu.size(), host.size()), 0);
  for (StepSample& x : steps) {
    if (x.rank >= static_cast<int>(seen.size())) continue;
    const double f = seen[x.rank]++ == 2 ? 1.0 : 0.9;
    if (x.rank < static_cast<int>(gpu.size())) x.gpu_memory_bytes = gpu[x.rank] * f;
    if (x.rank < static_cast<int>(host.size())) x.host_memory_peak_bytes = host[x.rank] * f;
  }
  return steps;
}

TEST(BreakdownOf, PeakMemoryIsTheGpusOnCudaAndTheProcessesOnCpu) {
  const auto steps = WithMemory(Steps(2, 10, 0, 1, 0), {3e9, 5e9}, {1e9, 2e9});
  const auto gpu = BreakdownOf(steps, PlanOf(2, 8, 1, "cuda"));
  ASSERT_EQ(gpu.ranks_size(), 2);
  EXPECT_DOUBLE_EQ(gpu.ranks(0).peak_memory_bytes(), 3e9);
  EXPECT_DOUBLE_EQ(gpu.ranks(1).peak_memory_bytes(), 5e9);
  const auto cpu = BreakdownOf(steps, PlanOf(2, 8, 1, "cpu"));
  EXPECT_DOUBLE_EQ(cpu.ranks(0).peak_memory_bytes(), 1e9);
  EXPECT_DOUBLE_EQ(cpu.ranks(1).peak_memory_bytes(), 2e9);
}

TEST(DiagnoseMemory, UnusedMemoryNamesTheLargerMicroBatchThatFits) {
  // State 10 GiB, the model's 1 GiB per sample at m=8: 18 GiB predicted;
  // rank 1 held 26 GiB, 2 GiB per sample measured (the larger: scaling up).
  // 64 samples per rank and step: 26 + (m' - 8) x 2 <= 64 up to m' = 27,
  // whose largest divisor of 64 is 16.
  const v1::Plan plan = MemoryPlan(2, 8, 8, "cuda", 10 * kGiB, 1 * kGiB, 80 * kGiB, 64 * kGiB);
  const auto d = Diagnose(plan, WithMemory(Steps(2, 10, 0, 1, 0), {20 * kGiB, 26 * kGiB}, {}));
  const v1::MemoryFinding& m = d.memory();
  ASSERT_TRUE(m.known());
  EXPECT_EQ(m.rank(), 1);
  EXPECT_DOUBLE_EQ(m.peak_bytes(), 26 * kGiB);
  EXPECT_FALSE(m.above_target());
  EXPECT_EQ(m.micro_batch_fit(), 16);
  EXPECT_NE(m.finding().find("rank 1 (node n0) held 26.00 GiB at most (GPU memory), 32% of its "
                             "GPU's 80.00 GiB; target 64.00 GiB; the plan predicted 18.00 GiB at "
                             "micro-batch 8, 31% under that"),
            std::string::npos)
      << m.finding();
  EXPECT_NE(m.fix().find("train.micro_batch 16 with train.accumulation 4"), std::string::npos)
      << m.fix();
  EXPECT_NE(m.fix().find("about 42.00 GiB"), std::string::npos) << m.fix();  // 26 + 8 x 2
  EXPECT_NE(m.fix().find("measured peak by 2.00 GiB per sample"), std::string::npos) << m.fix();
  // The model's 3 GiB per sample is the larger (2 measured): 26 + (m' - 8) x 3 <= 64
  // up to m' = 20, divisor 16 (50 GiB).
  const v1::Plan big = MemoryPlan(2, 8, 8, "cuda", 10 * kGiB, 3 * kGiB, 80 * kGiB, 64 * kGiB);
  const auto b = Diagnose(big, WithMemory(Steps(2, 10, 0, 1, 0), {20 * kGiB, 26 * kGiB}, {}));
  EXPECT_NE(b.memory().fix().find("about 50.00 GiB of the 64.00 GiB target (scaled from the "
                                  "measured peak by the plan's 3.00 GiB per sample)"),
            std::string::npos)
      << b.memory().fix();
}

TEST(DiagnoseMemory, AboveTheTargetNamesTheSmallerMicroBatchUnderIt) {
  // m=16, k=4: 64 per rank; 70 GiB held, state 10 GiB: 3.75 GiB per sample
  // measured, the model's 3 the smaller (scaling down, the measured excess
  // overstates the saving): 70 + (m' - 16) 3 <= 64 needs m' <= 14: divisor
  // 8, 46 GiB.
  const v1::Plan plan = MemoryPlan(1, 16, 4, "cuda", 10 * kGiB, 3 * kGiB, 80 * kGiB, 64 * kGiB);
  auto d = Diagnose(plan, WithMemory(Steps(1, 10, 0, 1, 0), {70 * kGiB}, {}));
  EXPECT_TRUE(d.memory().above_target());
  EXPECT_EQ(d.memory().micro_batch_fit(), 8);
  EXPECT_EQ(d.memory().fix(),
            "above the target: set train.micro_batch 8 and train.accumulation 8 (the same global "
            "batch) for about 46.00 GiB (scaled from the measured peak by the plan's "
            "3.00 GiB per sample)");
  // Past 95% of the device: the fix says it may run out.
  d = Diagnose(plan, WithMemory(Steps(1, 10, 0, 1, 0), {77 * kGiB}, {}));
  EXPECT_EQ(d.memory().fix().rfind("at 96% of the GPU's memory, one allocation from running out; "
                                   "above the target",
                                   0),
            0u)
      << d.memory().fix();
  // Nothing under the target even at one sample: other levers, not the
  // bf16 the plan already runs.
  // (76 GiB held, state 64: 0.75 GiB per sample; at one sample 64.75 GiB.)
  const v1::Plan tight =
      MemoryPlan(1, 16, 4, "cuda", 64 * kGiB, 0.75 * kGiB, 80 * kGiB, 64 * kGiB);
  d = Diagnose(tight, WithMemory(Steps(1, 10, 0, 1, 0), {76 * kGiB}, {}));
  EXPECT_EQ(d.memory().micro_batch_fit(), 0);
  EXPECT_NE(d.memory().fix().find("even at micro-batch 1"), std::string::npos) << d.memory().fix();
  EXPECT_EQ(d.memory().fix().find("bf16"), std::string::npos) << d.memory().fix();
  // A CPU rank past its whole share of the host.
  const v1::Plan cpu = MemoryPlan(2, 16, 4, "cpu", 1 * kGiB, 0.1 * kGiB, 8 * kGiB, 5.6 * kGiB);
  d = Diagnose(cpu, WithMemory(Steps(2, 10, 0, 1, 0), {}, {9 * kGiB, 2 * kGiB}));
  EXPECT_EQ(d.memory().fix().rfind("at 112% of its share of the host's memory: the node may swap "
                                   "or kill a rank; ",
                                   0),
            0u)
      << d.memory().fix();
}

TEST(DiagnoseMemory, APeakUnderTheModelsStateScalesByTheModelsPerSample) {
  // 6 GiB held, the state predicted at 10: the measurement says nothing per
  // sample, so the model's 2 GiB: 6 + (m' - 4) x 2 <= 20 up to m' = 11,
  // the largest divisor of 16 is 8.
  const v1::Plan plan = MemoryPlan(1, 4, 4, "cuda", 10 * kGiB, 2 * kGiB, 40 * kGiB, 20 * kGiB);
  const auto d = Diagnose(plan, WithMemory(Steps(1, 10, 0, 1, 0), {6 * kGiB}, {}));
  EXPECT_EQ(d.memory().micro_batch_fit(), 8);
  EXPECT_NE(d.memory().fix().find("by the plan's 2.00 GiB per sample"), std::string::npos)
      << d.memory().fix();
}

TEST(DiagnoseMemory, OneMicroStepAlreadyNeedsNoFix) {
  const v1::Plan plan = MemoryPlan(2, 16, 1, "cpu", 1 * kGiB, 0.1 * kGiB, 12 * kGiB, 8 * kGiB);
  const auto d = Diagnose(plan, WithMemory(Steps(2, 10, 0, 1, 0), {}, {2 * kGiB, 3 * kGiB}));
  EXPECT_TRUE(d.memory().known());
  EXPECT_EQ(d.memory().rank(), 1);
  EXPECT_NE(d.memory().finding().find("(peak resident set), 25% of its 12.00 GiB share of the host"),
            std::string::npos)
      << d.memory().finding();
  EXPECT_EQ(d.memory().micro_batch_fit(), 16);
  EXPECT_EQ(d.memory().fix(), "");
}

TEST(DiagnoseMemory, NoReadingsSayWhichOnesAreMissing) {
  const auto d = Diagnose(PlanOf(2, 8, 1, "cuda"), Steps(2, 10, 0, 1, 0));
  EXPECT_FALSE(d.memory().known());
  EXPECT_EQ(d.memory().finding(),
            "no rank reported its GPU memory (e.g. NVML not available on the node)");
  EXPECT_EQ(d.memory().fix(), "");
}

}  // namespace
}  // namespace dgca
