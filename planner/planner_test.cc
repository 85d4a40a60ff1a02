#include "planner/compute_prior.h"
#include "planner/planner.h"

#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "spec/spec.h"
#include "model/core/config.h"
#include "gtest/gtest.h"
#include "planner/plan_format.h"
#include "topology/probe.h"

namespace dgca {
namespace {

std::string SourceDir() {
  const char* src = std::getenv("DGCA_SOURCE_DIR");
  return src ? src : ".";
}

v1::Topology Fixture(const std::string& name) {
  ProbeOptions opt;
  opt.root = SourceDir() + "/tests/fixtures/" + name + "/root";
  opt.use_nvml = false;
  auto t = ProbeTopology(opt);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : v1::Topology();
}

v1::JobSpec Config(const std::string& file) {
  std::string path = SourceDir() + "/configs/" + file;
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto r = ParseJobSpec(text, path);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return DefaultJobSpec();
  EXPECT_TRUE(r->ok()) << FormatProblems(r->problems);
  return r->spec;
}

const v1::PlanDecision& Find(const v1::Plan& p, const std::string& name) {
  for (const auto& d : p.decisions())
    if (d.name() == name) return d;
  static v1::PlanDecision none;
  ADD_FAILURE() << "no decision " << name;
  return none;
}

bool HasNcclEnv(const v1::Plan& p) {
  for (const auto& kv : p.env())
    if (absl::StartsWith(kv.first, "NCCL_")) return true;
  return false;
}

void ExpectEveryDecisionHasAReason(const v1::Plan& p) {
  for (const auto& d : p.decisions()) {
    EXPECT_FALSE(d.reason().empty()) << d.name();
    EXPECT_NE(d.source(), v1::VALUE_SOURCE_UNSPECIFIED) << d.name();
  }
}

// The figures such a machine really showed (a user's WSL2 report).
PlannerMeasurements Wsl2Measurements() {
  PlannerMeasurements m;
  m.allreduce_bus_bandwidth = 1e9;
  m.step_seconds = 0.2;
  m.step_micro_batch = 128;
  return m;
}

// ---- CPU -----------------------------------------------------------------------

TEST(Planner, CpuJobDefaults) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_train()->set_global_batch(32);
  v1::Topology t;
  t.set_node("n0");
  t.set_cpu_count(8);
  t.set_numa_nodes(1);
  t.set_memory_bytes(32ull << 30);
  auto plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device(), "cpu");
  EXPECT_EQ(plan->backend(), "gloo");
  EXPECT_EQ(plan->ranks(), 2);
  EXPECT_EQ(plan->micro_batch(), 16);
  EXPECT_EQ(plan->accumulation(), 1);
  EXPECT_EQ(plan->precision(), "fp32");
  EXPECT_EQ(plan->threads_per_rank(), 4);
  EXPECT_EQ(plan->loader_threads(), 1);
  EXPECT_EQ(plan->env().at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(plan->rank_nodes_size(), 2);
  // No step measurement: a quarter of the fp32 gradients (bert-base: 513 MB).
  EXPECT_EQ(plan->bucket_mb(), 123);  // ceil(489.3 MiB / 4)
  EXPECT_TRUE(absl::StrContains(Find(*plan, "comm.bucket_mb").reason(), "G/4"));
  ExpectEveryDecisionHasAReason(*plan);
}

TEST(Planner, CpuContainerLimitsThreads) {
  v1::JobSpec spec = DefaultJobSpec();
  v1::Topology t = Fixture("cpu-only");
  auto plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks(), 2);
  EXPECT_EQ(plan->threads_per_rank(), 2);  // cgroup: 4 of 8 CPUs
  EXPECT_TRUE(absl::StrContains(Find(*plan, "resources.threads_per_rank").reason(),
                                "cgroup limit 4"));
}

TEST(Planner, CpuPredictionsFromMeasurement) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_train()->set_global_batch(16);
  v1::Topology t = Fixture("cpu-only");
  PlannerMeasurements m;
  m.step_seconds = 0.4;
  m.step_micro_batch = 8;
  m.allreduce_bus_bandwidth = 1e9;
  m.allreduce_latency_s = 1e-4;
  auto plan = MakePlan(spec, {t}, m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->micro_batch(), 8);
  ASSERT_EQ(plan->accumulation(), 1);
  // The CPU ranks use every core (2 ranks x 2 threads on a 4-CPU limit), so
  // nothing overlaps: step = c + C with C = nb x latency + G x f / busbw.
  ModelConfig cfg;
  ASSERT_TRUE(ApplyPreset("tiny", cfg).ok());
  cfg = *ApplyPreset("tiny", cfg);
  const double G = 4.0 * CountParameters(cfg);
  const double nb = std::ceil(G / (plan->bucket_mb() * 1024 * 1024));
  const double C = nb * 1e-4 + G * 1.0 / 1e9;
  EXPECT_NEAR(plan->predicted_allreduce_seconds(), C, 1e-12);
  EXPECT_NEAR(plan->predicted_step_seconds(), 0.4 + C, 1e-12);
  EXPECT_NEAR(plan->predicted_comm_share(), C / (0.4 + C), 1e-12);
  EXPECT_NEAR(plan->predicted_samples_per_second(), 16 / (0.4 + C), 1e-9);
  EXPECT_NEAR(plan->predicted_single_rank_samples_per_second(), 20.0, 1e-6);
  EXPECT_TRUE(absl::StrContains(Find(*plan, "train.accumulation").reason(), "no overlap"));
  // With a spare core (1 thread per rank) the model lets backward hide it.
  spec.mutable_resources()->set_threads_per_rank(1);
  auto spare = MakePlan(spec, {t}, m);
  ASSERT_TRUE(spare.ok());
  EXPECT_LT(spare->predicted_comm_share(), plan->predicted_comm_share());
}

// Two or more measured micro-batches: c(m) = a + b m by least squares, so
// a fixed per-step cost is not scaled with m; measured all-reduce sizes are
// interpolated; the learned peer wait adds skew x c(m) to the all-reduce.
TEST(Planner, StepPointsFitInterpolatedAllReduceAndSkew) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_train()->set_global_batch(16);
  spec.mutable_train()->set_micro_batch(8);
  spec.mutable_comm()->set_bucket_mb(1);
  spec.mutable_resources()->set_ranks(2);
  spec.mutable_resources()->set_threads_per_rank(1);
  v1::Topology t = Fixture("cpu-only");
  PlannerMeasurements m;
  // c(4) = 0.05, c(12) = 0.13: a = 0.01, b = 0.01 -> c(8) = 0.09 (a line
  // through the origin from c(4) alone would say 0.10).
  m.step_points = {{4, 0.05}, {12, 0.13}};
  m.step_source = "measured by job j-test";
  m.allreduce_bus_bandwidth = 1e9;
  m.allreduce_latency_s = 1e-3;
  m.allreduce_points = {{4096, 1e-3}, {1048576, 2e-3}, {16777216, 17e-3}};
  auto plan = MakePlan(spec, {t}, m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ModelConfig cfg = *ApplyPreset("tiny", ModelConfig());
  const double G = 4.0 * CountParameters(cfg);
  const double S = 1024.0 * 1024;
  const double nb = std::ceil(G / S);
  const double rest = G - (nb - 1) * S;
  // t(1 MiB) = 2 ms exactly; the rest is interpolated between 4 KiB and 1 MiB.
  const double t_rest = 1e-3 + (2e-3 - 1e-3) * (rest - 4096) / (1048576 - 4096);
  const double C = (nb - 1) * 2e-3 + t_rest;
  EXPECT_NEAR(plan->predicted_allreduce_probe_seconds(), C, 1e-12);
  EXPECT_NEAR(plan->predicted_allreduce_seconds(), C, 1e-12);
  // 2 ranks x 1 thread on the fixture's CPUs: see whether backward overlaps.
  const double c8 = 0.09;
  EXPECT_NEAR(plan->predicted_single_rank_samples_per_second(), 8 / c8, 1e-9);
  EXPECT_GE(plan->predicted_step_seconds(), c8 - 1e-12);
  const auto& why = Find(*plan, "predicted.step_seconds").reason();
  EXPECT_TRUE(absl::StrContains(why, "least squares")) << why;
  EXPECT_TRUE(absl::StrContains(why, "j-test")) << why;
  EXPECT_TRUE(absl::StrContains(why, "interpolated between 3 measured sizes")) << why;

  // A learned peer wait of 0.1 x c adds 0.009 s to the all-reduce.
  m.allreduce_skew_per_compute = 0.1;
  m.allreduce_skew_source = "from job j-skew";
  auto skewed = MakePlan(spec, {t}, m);
  ASSERT_TRUE(skewed.ok());
  EXPECT_NEAR(skewed->predicted_allreduce_probe_seconds(), C, 1e-12);
  EXPECT_NEAR(skewed->predicted_allreduce_seconds(), C + 0.1 * c8, 1e-12);
  EXPECT_NEAR(skewed->allreduce_skew_per_compute(), 0.1, 0);
  EXPECT_TRUE(absl::StrContains(Find(*skewed, "predicted.step_seconds").reason(), "j-skew"));

  // A fit with a negative intercept falls back to a line through the origin.
  m.allreduce_skew_per_compute = 0;
  m.step_points = {{4, 0.02}, {12, 0.13}};
  auto origin = MakePlan(spec, {t}, m);
  ASSERT_TRUE(origin.ok());
  const double b = (4 * 0.02 + 12 * 0.13) / (16.0 + 144.0);
  EXPECT_NEAR(origin->predicted_single_rank_samples_per_second(), 1 / b, 1e-6);
  EXPECT_TRUE(absl::StrContains(Find(*origin, "predicted.step_seconds").reason(),
                                "through the origin"));
}

TEST(Planner, UserValuesWin) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_train()->set_global_batch(32);
  spec.mutable_resources()->set_ranks(4);
  spec.mutable_train()->set_micro_batch(2);
  spec.mutable_comm()->set_bucket_mb(7);
  spec.mutable_train()->set_precision("fp32");
  v1::Topology t;
  t.set_cpu_count(8);
  auto plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ranks(), 4);
  EXPECT_EQ(plan->micro_batch(), 2);
  EXPECT_EQ(plan->accumulation(), 4);
  EXPECT_EQ(plan->bucket_mb(), 7);
  EXPECT_EQ(Find(*plan, "resources.ranks").source(), v1::USER);
  EXPECT_EQ(Find(*plan, "train.micro_batch").source(), v1::USER);
  EXPECT_EQ(Find(*plan, "comm.bucket_mb").source(), v1::USER);
  EXPECT_EQ(Find(*plan, "train.precision").source(), v1::USER);
}

// More ranks than samples per step, or CPU ranks far past the cores, is a
// spec the planner refuses (a tester's 4096 CPU ranks with global_batch 8
// on 2 cores were launched and stalled the machine); a few ranks per core
// is a warning.
TEST(Planner, RanksPastTheBatchOrTheCoresAreRefused) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_resources()->set_device("cpu");
  spec.mutable_train()->set_global_batch(8);
  spec.mutable_resources()->set_ranks(16);
  v1::Topology t;
  t.set_cpu_count(64);
  auto plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(plan.status().message(),
                                "resources.ranks = 16 but train.global_batch = 8: every rank needs at least one "
                                "sample per step"))
      << plan.status();

  spec.mutable_train()->set_global_batch(8192);
  spec.mutable_resources()->set_ranks(4096);
  t.set_cpu_count(2);
  plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StrContains(plan.status().message(),
                                "resources.ranks = 4096 CPU ranks but the connected nodes have 2 CPU(s) in all"))
      << plan.status();
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "set resources.ranks <= 8")) << plan.status();

  spec.mutable_resources()->set_ranks(4);  // two per core: allowed, with a warning
  plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  bool warned = false;
  for (const auto& w : plan->warnings()) warned |= absl::StrContains(w, "4 CPU ranks on 2 CPU(s): ranks share cores");
  EXPECT_TRUE(warned);

  spec.mutable_resources()->set_ranks(2);  // one per core: no warning
  plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const auto& w : plan->warnings()) EXPECT_FALSE(absl::StrContains(w, "ranks share cores")) << w;
}

// CUDA ranks all-reduce over NCCL, which refuses two ranks on one GPU: more
// ranks than GPUs is an error naming the counts and what would work (it
// used to be a warning, and the job then failed at NCCL's init).
TEST(Planner, MoreCudaRanksThanGpusIsAnError) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_resources()->set_device("cuda");
  spec.mutable_resources()->set_ranks(3);
  auto plan = MakePlan(spec, {Fixture("wsl2-2x4090")}, PlannerMeasurements{});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(plan.status().message(),
                                "resources.ranks = 3 but the connected nodes have 2 GPU(s): CUDA ranks need one GPU each "
                                "(NCCL refuses two ranks on one GPU); set resources.ranks <= 2 or leave it auto"))
      << plan.status();
  spec.mutable_resources()->set_ranks(2);
  auto two = MakePlan(spec, {Fixture("wsl2-2x4090")}, PlannerMeasurements{});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->rank_local_devices_size(), 2);
  EXPECT_NE(two->rank_local_devices(0), two->rank_local_devices(1));
  // A node without GPUs listed first takes no CUDA rank (it used to take
  // every rank, all on a "GPU 0" it does not have).
  const v1::Topology cpu = Fixture("cpu-only"), gpus = Fixture("wsl2-2x4090");
  auto mixed = MakePlan(spec, {cpu, gpus}, PlannerMeasurements{});
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  ASSERT_EQ(mixed->rank_nodes_size(), 2);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(mixed->rank_nodes(r), gpus.node()) << r;
  EXPECT_NE(mixed->rank_local_devices(0), mixed->rank_local_devices(1));
}

TEST(Planner, NoNodesIsAnError) {
  EXPECT_FALSE(MakePlan(DefaultJobSpec(), {}, PlannerMeasurements{}).ok());
}

// ---- WSL2, two RTX 4090 over SYS, 1 GB/s -------- ------------------------

TEST(PlannerWsl2, SmallShmBigBucketAccumulationBeatsOneGpu) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  v1::Topology t = Fixture("wsl2-2x4090");
  auto plan = MakePlan(spec, {t}, Wsl2Measurements());
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::cout << FormatPlan(*plan);
  EXPECT_EQ(plan->ranks(), 2);
  EXPECT_EQ(plan->device(), "cuda");
  EXPECT_EQ(plan->backend(), "nccl");
  EXPECT_EQ(plan->precision(), "bf16");
  // /dev/shm is 64 MiB: below what NCCL's SHM transport needs for 2 ranks.
  ASSERT_TRUE(plan->env().count("NCCL_SHM_DISABLE"));
  EXPECT_EQ(plan->env().at("NCCL_SHM_DISABLE"), "1");
  const std::string shm = Find(*plan, "env.NCCL_SHM_DISABLE").reason();
  EXPECT_TRUE(absl::StrContains(shm, "64.0 MiB free")) << shm;
  EXPECT_TRUE(absl::StrContains(shm, "9637888")) << shm;
  EXPECT_EQ(plan->env().at("NCCL_P2P_DISABLE"), "1");
  // Bucket: at least 100 MB, with the arithmetic.
  EXPECT_GE(plan->bucket_mb() * 1024 * 1024, 100e6);
  const std::string bucket = Find(*plan, "comm.bucket_mb").reason();
  EXPECT_TRUE(absl::StrContains(bucket, "G/4")) << bucket;
  EXPECT_TRUE(absl::StrContains(bucket, "9 x latency x busbw / f")) << bucket;
  EXPECT_TRUE(absl::StrContains(bucket, "1 GB/s")) << bucket;
  // Accumulation: predicted throughput beats one GPU alone.
  EXPECT_GT(plan->accumulation(), 1);
  EXPECT_EQ(plan->ranks() * plan->micro_batch() * plan->accumulation(), 2048);
  EXPECT_GT(plan->predicted_samples_per_second(),
            plan->predicted_single_rank_samples_per_second());
  EXPECT_NEAR(plan->predicted_single_rank_samples_per_second(), 640, 1e-6);
  const std::string acc = Find(*plan, "train.accumulation").reason();
  EXPECT_TRUE(absl::StrContains(acc, "step(k) = k x c + exposed")) << acc;
  EXPECT_TRUE(absl::StrContains(acc, "max(C/nb, C - 2/3 c (1 - 1/nb))")) << acc;
  // The arithmetic is consistent: step = k c + exposed, sps = 2048 / step.
  const double c = 0.2 / 128 * plan->micro_batch();
  EXPECT_NEAR(plan->predicted_samples_per_second() * plan->predicted_step_seconds(), 2048,
              1e-6);
  EXPECT_GT(plan->predicted_step_seconds(), plan->accumulation() * c);
  EXPECT_GT(plan->predicted_memory_bytes(), 0);
  EXPECT_LT(plan->predicted_memory_bytes(), 0.85 * (24564.0 * 1024 * 1024));
  // What `dgca diagnose` scales the measured peak by: the device, the 80%
  // target (the CUDA context included, as in the prediction) and the
  // activations per sample on top of the model state.
  EXPECT_DOUBLE_EQ(plan->device_memory_bytes(), 24564.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(plan->memory_target_bytes(), 0.8 * 24564.0 * 1024 * 1024);
  EXPECT_LE(plan->predicted_memory_bytes(), plan->memory_target_bytes());
  EXPECT_GT(plan->predicted_activation_bytes_per_sample(), 0);
  EXPECT_GT(plan->predicted_memory_bytes() -
                plan->micro_batch() * plan->predicted_activation_bytes_per_sample(),
            0);
  ExpectEveryDecisionHasAReason(*plan);
}

TEST(PlannerWsl2, LargeShmKeepsSharedMemory) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  v1::Topology t = Fixture("wsl2-2x4090");
  t.set_shm_total_bytes(16ull << 30);  // WSL2's own default: half the RAM
  t.set_shm_free_bytes(16ull << 30);
  auto plan = MakePlan(spec, {t}, Wsl2Measurements());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->env().count("NCCL_SHM_DISABLE"));
  EXPECT_EQ(plan->env().at("NCCL_P2P_DISABLE"), "1");
  EXPECT_FALSE(plan->env().count("NCCL_IB_DISABLE"));
}

TEST(PlannerWsl2, DefaultGlobalBatchPlansOneGpuAndSaysWhy) {
  v1::JobSpec spec = DefaultJobSpec();  // global_batch 128
  v1::Topology t = Fixture("wsl2-2x4090");
  auto plan = MakePlan(spec, {t}, Wsl2Measurements());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks(), 1);
  const std::string why = Find(*plan, "resources.ranks").reason();
  EXPECT_TRUE(absl::StrContains(why, "would be slower")) << why;
  EXPECT_TRUE(absl::StrContains(why, "640 samples/s")) << why;
  EXPECT_FALSE(HasNcclEnv(*plan));  // one rank: nothing to configure
}

TEST(PlannerWsl2, UserEnvWinsAndThePlanSaysSo) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  (*spec.mutable_comm()->mutable_env())["NCCL_SHM_DISABLE"] = "0";
  (*spec.mutable_comm()->mutable_env())["NCCL_DEBUG"] = "WARN";
  auto plan = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->env().at("NCCL_SHM_DISABLE"), "0");
  EXPECT_EQ(plan->env().at("NCCL_DEBUG"), "WARN");
  const auto& d = Find(*plan, "env.NCCL_SHM_DISABLE");
  EXPECT_EQ(d.source(), v1::USER);
  EXPECT_TRUE(absl::StrContains(d.reason(), "the planner would set 1")) << d.reason();
}

TEST(PlannerWsl2, LargerGlobalBatchMeetsTheTenPercentTarget) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  spec.mutable_train()->set_global_batch(4096);
  auto plan = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LE(plan->predicted_comm_share(), 0.10);
  EXPECT_TRUE(absl::StrContains(Find(*plan, "train.accumulation").reason(), "<= 10%"));
}

// ---- The first plan: nothing measured, the compute and link priors ---------------

// A fresh coordinator with one agent on the WSL2 box: no job has run, no
// probe was measured. At global_batch 128 two GPUs over SYS are slower than
// one, and the plan says so with the arithmetic.
TEST(PlannerFirstPlan, Wsl2AtBatch128PlansOneGpuWithTheArithmetic) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  spec.mutable_train()->set_global_batch(128);
  auto plan = MakePlan(spec, {Fixture("wsl2-2x4090")}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::cout << FormatPlan(*plan);
  EXPECT_EQ(plan->ranks(), 1);
  EXPECT_EQ(plan->compute_source(), "prior");
  EXPECT_EQ(plan->compute_device_class(), "gpu RTX 4090 bf16");
  EXPECT_GT(plan->predicted_step_seconds(), 0);
  EXPECT_GT(plan->predicted_samples_per_second(), 0);
  const std::string why = Find(*plan, "resources.ranks").reason();
  EXPECT_TRUE(absl::StrContains(why, "2 ranks would be slower: 2 ranks: 64 samples in")) << why;
  EXPECT_TRUE(absl::StrContains(why, "exposed all-reduce")) << why;
  EXPECT_TRUE(absl::StrContains(why, "1 rank: 128 samples in")) << why;
  EXPECT_TRUE(absl::StrContains(why, "compute from the prior")) << why;
  EXPECT_FALSE(HasNcclEnv(*plan));
  const std::string step = Find(*plan, "predicted.step_seconds").reason();
  EXPECT_TRUE(absl::StrContains(step, "compute prior: c(m) =")) << step;
  EXPECT_TRUE(absl::StrContains(step, "165 TFLOP/s bf16 peak")) << step;
  for (const auto& w : plan->warnings()) EXPECT_FALSE(absl::StrContains(w, "no step-time")) << w;
}

// At 2048 the two GPUs win: accumulation hides what it can, the plan
// predicts above one GPU's throughput, and NCCL's P2P and SHM stay off.
TEST(PlannerFirstPlan, Wsl2AtBatch2048PlansTwoGpusAboveOne) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  auto plan = MakePlan(spec, {Fixture("wsl2-2x4090")}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::cout << FormatPlan(*plan);
  EXPECT_EQ(plan->ranks(), 2);
  EXPECT_EQ(plan->compute_source(), "prior");
  EXPECT_EQ(plan->ranks() * plan->micro_batch() * plan->accumulation(), 2048);
  EXPECT_GT(plan->accumulation(), 1);  // 1024 samples per rank do not fit 24 GB at once
  EXPECT_GT(plan->predicted_samples_per_second(),
            plan->predicted_single_rank_samples_per_second());
  EXPECT_EQ(plan->env().at("NCCL_P2P_DISABLE"), "1");
  EXPECT_EQ(plan->env().at("NCCL_SHM_DISABLE"), "1");
  const std::string ranks = Find(*plan, "resources.ranks").reason();
  EXPECT_TRUE(absl::StrContains(ranks, "one rank per GPU")) << ranks;
  const std::string acc = Find(*plan, "train.accumulation").reason();
  EXPECT_TRUE(absl::StrContains(acc, "compute prior")) << acc;
  // The micro-batch is the largest that fits: with k x m fixed per rank a
  // larger k only adds per-micro-step overhead.
  EXPECT_LE(plan->predicted_memory_bytes(), plan->memory_target_bytes());
}

// NVLink: all 8 H100s at batch 128; a PCIe box of 4 A100s (PHB/SYS pairs at
// PCIe speed) uses its 4 GPUs at a batch that keeps them busy, one at 32.
TEST(PlannerFirstPlan, NvlinkAndPcieBoxes) {
  auto nv = MakePlan(DefaultJobSpec(), {Fixture("nvlink-8-h100")}, PlannerMeasurements{});
  ASSERT_TRUE(nv.ok()) << nv.status();
  EXPECT_EQ(nv->ranks(), 8) << Find(*nv, "resources.ranks").reason();
  EXPECT_LE(nv->predicted_comm_share(), 0.5);
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_train()->set_global_batch(512);
  auto pcie = MakePlan(spec, {Fixture("a100-4x-pcie")}, PlannerMeasurements{});
  ASSERT_TRUE(pcie.ok()) << pcie.status();
  std::cout << FormatPlan(*pcie);
  EXPECT_EQ(pcie->ranks(), 4) << Find(*pcie, "resources.ranks").reason();
  EXPECT_EQ(pcie->compute_device_class(), "gpu A100 bf16");
  spec.mutable_train()->set_global_batch(32);
  auto small = MakePlan(spec, {Fixture("a100-4x-pcie")}, PlannerMeasurements{});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->ranks(), 1) << Find(*small, "resources.ranks").reason();
}

// A GPU the table of peaks lacks: no prior, no invented numbers; the plan
// says why it could not predict.
TEST(PlannerFirstPlan, UnknownGpuHasNoPriorAndSaysWhy) {
  v1::Topology t = Fixture("wsl2-2x4090");
  for (auto& g : *t.mutable_gpus()) g.set_name("NVIDIA Quantum Accelerator 9000");
  auto plan = MakePlan(DefaultJobSpec(), {t}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->compute_source(), "");
  EXPECT_EQ(plan->predicted_step_seconds(), 0);
  EXPECT_EQ(plan->ranks(), 2);
  bool said = false;
  for (const auto& w : plan->warnings())
    said |= absl::StrContains(w, "\"NVIDIA Quantum Accelerator 9000\"") &&
            absl::StrContains(w, "not in the table of GPU peaks");
  EXPECT_TRUE(said);
}

// Measurements of the model replace the prior, and the plan says which.
TEST(PlannerFirstPlan, MeasurementsReplaceThePrior) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  auto prior = MakePlan(spec, {Fixture("wsl2-2x4090")}, PlannerMeasurements{});
  auto measured = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements());
  ASSERT_TRUE(prior.ok() && measured.ok());
  EXPECT_EQ(prior->compute_source(), "prior");
  EXPECT_EQ(measured->compute_source(), "measured");
  EXPECT_NEAR(measured->predicted_single_rank_samples_per_second(), 640, 1e-6);
  EXPECT_NE(prior->predicted_single_rank_samples_per_second(),
            measured->predicted_single_rank_samples_per_second());
  // The prior's ideal line is kept either way (what the efficiency is
  // learned from).
  EXPECT_GT(measured->compute_ideal_seconds_per_sample(), 0);
  EXPECT_DOUBLE_EQ(measured->compute_ideal_seconds_per_sample(),
                   prior->compute_ideal_seconds_per_sample());
  // A measured efficiency for the class replaces the run of record's.
  PlannerMeasurements e;
  e.compute_efficiency = 0.5;
  e.compute_efficiency_source = "jobs j-1 and j-2 on gpu RTX 4090 bf16";
  auto learned = MakePlan(spec, {Fixture("wsl2-2x4090")}, e);
  ASSERT_TRUE(learned.ok());
  EXPECT_NEAR(learned->predicted_single_rank_samples_per_second() /
                  prior->predicted_single_rank_samples_per_second(),
              0.5 / kGpuEfficiencyOfRecord, 0.05);
  EXPECT_TRUE(absl::StrContains(Find(*learned, "predicted.step_seconds").reason(),
                                "jobs j-1 and j-2"));
}

// CPU ranks: the prior from the GEMM rate the agent measured.
TEST(PlannerFirstPlan, CpuPriorFromTheMeasuredGemmRate) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_data()->set_max_seq_len(40);
  spec.mutable_train()->set_global_batch(16);
  v1::Topology t;
  t.set_node("n0");
  t.set_cpu_count(2);
  t.set_numa_nodes(1);
  t.set_memory_bytes(24ull << 30);
  t.set_cpu_model("Intel(R) Xeon(R) Processor");
  t.set_cpu_mhz(2100);
  t.set_cpu_vector_bits(512);
  t.set_cpu_gemm_flops_one_thread(28e9);
  t.set_cpu_gemm_flops_all_threads(34e9);
  auto plan = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->compute_source(), "prior");
  EXPECT_EQ(plan->compute_device_class(), "cpu Intel(R) Xeon(R) Processor x1");
  EXPECT_GT(plan->predicted_step_seconds(), 0);
  const std::string step = Find(*plan, "predicted.step_seconds").reason();
  EXPECT_TRUE(absl::StrContains(step, "GEMM measured at 0.028 TFLOP/s on 1 thread")) << step;
  // Not measured: no prior.
  t.set_cpu_gemm_flops_one_thread(0);
  auto unknown = MakePlan(spec, {t}, PlannerMeasurements{});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->compute_source(), "");
  EXPECT_EQ(unknown->predicted_step_seconds(), 0);
}

// device: cuda where no node has a GPU: the plan says it cannot run here
// and invents nothing (it used to read "compute capability 100.0").
TEST(PlannerFirstPlan, CudaWithoutAGpuSaysSoAndInventsNothing) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  auto plan = MakePlan(spec, {Fixture("cpu-only")}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  bool said = false;
  for (const auto& w : plan->warnings()) said |= absl::StartsWith(w, "cannot run here:");
  EXPECT_TRUE(said);
  const std::string precision = Find(*plan, "train.precision").reason();
  EXPECT_FALSE(absl::StrContains(precision, "100.0")) << precision;
  EXPECT_TRUE(absl::StrContains(precision, "no connected node reports a GPU")) << precision;
  EXPECT_EQ(plan->predicted_step_seconds(), 0);
  EXPECT_EQ(plan->compute_source(), "");
}

// ---- NVLink: no NCCL overrides, small k -----------------------------------------

TEST(PlannerNvlink, NoNcclOverridesSmallK) {
  v1::JobSpec spec = Config("nvlink-8-gpus.yaml");
  v1::Topology t = Fixture("nvlink-8-h100");
  PlannerMeasurements m;
  m.step_seconds = 0.06;  // bert-base bf16, 128 samples, one H100 (order of magnitude)
  m.step_micro_batch = 128;
  auto plan = MakePlan(spec, {t}, m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::cout << FormatPlan(*plan);
  EXPECT_EQ(plan->ranks(), 8);
  EXPECT_FALSE(HasNcclEnv(*plan)) << absl::StrJoin(plan->env(), ",", absl::PairFormatter("="));
  EXPECT_EQ(plan->env().at("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
  EXPECT_LE(plan->accumulation(), 2);
  EXPECT_EQ(plan->precision(), "bf16");
  EXPECT_LT(plan->predicted_comm_share(), 0.10);
  EXPECT_TRUE(absl::StrContains(Find(*plan, "comm.bucket_mb").reason(), "NV18"));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(plan->rank_local_devices(r), r);
}

// Nothing measured: the compute prior predicts, and on NVLink all 8 GPUs
// beat one even at global_batch 128.
TEST(PlannerNvlink, DefaultsWithoutMeasurementPredictFromThePrior) {
  auto plan = MakePlan(DefaultJobSpec(), {Fixture("nvlink-8-h100")}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks(), 8) << Find(*plan, "resources.ranks").reason();
  EXPECT_EQ(plan->accumulation(), 1);
  EXPECT_EQ(plan->micro_batch(), 16);
  EXPECT_FALSE(HasNcclEnv(*plan));
  EXPECT_EQ(plan->compute_source(), "prior");
  EXPECT_EQ(plan->compute_device_class(), "gpu H100 SXM bf16");
  EXPECT_GT(plan->predicted_step_seconds(), 0);
  EXPECT_GT(plan->predicted_samples_per_second(), plan->predicted_single_rank_samples_per_second());
  EXPECT_TRUE(absl::StrContains(Find(*plan, "resources.ranks").reason(), "1 rank: 128 samples"))
      << Find(*plan, "resources.ranks").reason();
  for (const auto& w : plan->warnings()) EXPECT_FALSE(absl::StrContains(w, "no step-time")) << w;
}

// ---- Attention kernels ------------------------------------------------------------------

TEST(PlannerAttention, FusedWhereItAppliesAndSaysWhy) {
  const v1::Topology h100 = Fixture("nvlink-8-h100");
  // bert-base (head size 64), seq 128, bf16 on H100: the fused kernels run
  // and the GEMM version's probabilities fit too, so the ranks time both.
  auto plan = MakePlan(DefaultJobSpec(), {h100}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->attention(), "auto");
  EXPECT_EQ(Find(*plan, "train.attention").source(), v1::PLANNER);
  EXPECT_TRUE(absl::StrContains(Find(*plan, "train.attention").reason(), "bf16, head size 64"))
      << Find(*plan, "train.attention").reason();
  EXPECT_TRUE(absl::StrContains(Find(*plan, "train.attention").reason(), "times the fused"))
      << Find(*plan, "train.attention").reason();
  // Asked for fused: fused, untimed.
  v1::JobSpec fused = DefaultJobSpec();
  fused.mutable_train()->set_attention("fused");
  auto pfu = MakePlan(fused, {h100}, PlannerMeasurements{});
  ASSERT_TRUE(pfu.ok());
  EXPECT_EQ(pfu->attention(), "fused");
  EXPECT_EQ(Find(*pfu, "train.attention").source(), v1::USER);
  // fp32: the GEMM version, and why.
  v1::JobSpec fp32 = DefaultJobSpec();
  fp32.mutable_train()->set_precision("fp32");
  auto p32 = MakePlan(fp32, {h100}, PlannerMeasurements{});
  ASSERT_TRUE(p32.ok());
  EXPECT_EQ(p32->attention(), "gemm");
  EXPECT_TRUE(absl::StrContains(Find(*p32, "train.attention").reason(), "fp32"));
  // A head size the kernels do not take (768 / 6 = 128), asked for fused:
  // GEMM, with a warning that names the reason.
  v1::JobSpec d128 = DefaultJobSpec();
  d128.mutable_model()->set_preset("custom");
  d128.mutable_model()->set_layers(12);
  d128.mutable_model()->set_hidden(768);
  d128.mutable_model()->set_heads(6);
  d128.mutable_model()->set_ffn(3072);
  d128.mutable_train()->set_attention("fused");
  auto pd = MakePlan(d128, {h100}, PlannerMeasurements{});
  ASSERT_TRUE(pd.ok()) << pd.status();
  EXPECT_EQ(pd->attention(), "gemm");
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(pd->warnings(), "\n"), "head size 128"))
      << absl::StrJoin(pd->warnings(), "\n");
  // The user's gemm wins, and the memory bound counts the probabilities.
  v1::JobSpec gemm = DefaultJobSpec();
  gemm.mutable_train()->set_attention("gemm");
  gemm.mutable_data()->set_max_seq_len(512);
  v1::JobSpec fused512 = DefaultJobSpec();
  fused512.mutable_data()->set_max_seq_len(512);
  auto pg = MakePlan(gemm, {h100}, PlannerMeasurements{});
  auto pf = MakePlan(fused512, {h100}, PlannerMeasurements{});
  ASSERT_TRUE(pg.ok() && pf.ok());
  EXPECT_EQ(pg->attention(), "gemm");
  EXPECT_EQ(Find(*pg, "train.attention").source(), v1::USER);
  // "... -> at most N samples" in the micro-batch reason: the memory bound.
  auto bound = [](const v1::Plan& p) {
    const std::string r = Find(p, "train.micro_batch").reason();
    const size_t at = r.find("at most ");
    return at == std::string::npos ? -1 : std::atoi(r.c_str() + at + 8);
  };
  EXPECT_GT(bound(*pg), 0) << Find(*pg, "train.micro_batch").reason();
  EXPECT_LT(bound(*pg), bound(*pf));
  std::cout << "bert-base seq 512 on an H100, at most: GEMM " << bound(*pg) << ", fused " << bound(*pf) << " samples\n";
  // A micro-batch between the two bounds: the GEMM version would not fit,
  // so the ranks keep the fused kernels untimed, and the reason says so.
  v1::JobSpec big = fused512;
  const int between = (bound(*pg) + bound(*pf)) / 2;
  big.mutable_train()->set_micro_batch(between);
  big.mutable_train()->set_global_batch(between * 8);
  auto pb = MakePlan(big, {h100}, PlannerMeasurements{});
  ASSERT_TRUE(pb.ok()) << pb.status();
  EXPECT_EQ(pb->micro_batch(), between);
  EXPECT_EQ(pb->attention(), "fused");
  EXPECT_TRUE(absl::StrContains(Find(*pb, "train.attention").reason(), "not timed against the GEMM version"))
      << Find(*pb, "train.attention").reason();
  EXPECT_EQ(pf->attention(), "auto") << Find(*pf, "train.attention").reason();  // its micro-batch fits both
  // "auto" predicts the memory of the larger, the GEMM version a rank may keep.
  v1::JobSpec f512 = fused512;
  f512.mutable_train()->set_attention("fused");
  auto pff = MakePlan(f512, {h100}, PlannerMeasurements{});
  ASSERT_TRUE(pff.ok());
  EXPECT_EQ(pff->micro_batch(), pf->micro_batch());
  EXPECT_GT(pf->predicted_memory_bytes(), pff->predicted_memory_bytes());
  EXPECT_GT(pf->predicted_activation_bytes_per_sample(),
            pff->predicted_activation_bytes_per_sample());
  // Device memory unknown: nothing says the GEMM version fits, so fused, untimed.
  v1::Topology unknown = h100;
  for (auto& g : *unknown.mutable_gpus()) g.set_memory_bytes(0);
  auto pu = MakePlan(DefaultJobSpec(), {unknown}, PlannerMeasurements{});
  ASSERT_TRUE(pu.ok()) << pu.status();
  EXPECT_EQ(pu->attention(), "fused");
  EXPECT_TRUE(absl::StrContains(Find(*pu, "train.attention").reason(), "device memory unknown"))
      << Find(*pu, "train.attention").reason();
  // CPU ranks: no attention decision, a warning when the spec asks.
  v1::JobSpec cpu = DefaultJobSpec();
  cpu.mutable_train()->set_attention("fused");
  auto pc = MakePlan(cpu, {Fixture("cpu-only")}, PlannerMeasurements{});
  ASSERT_TRUE(pc.ok());
  EXPECT_EQ(pc->attention(), "");
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(pc->warnings(), "\n"), "train.attention fused on CPU"));
}

// ---- PCIe machines ---------------------------------------------------------------------

TEST(PlannerPcie, A100AcrossSocketsUsesTheWorstPath) {
  PlannerMeasurements m;
  m.step_seconds = 0.12;
  m.step_micro_batch = 128;
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_train()->set_global_batch(1024);
  auto plan = MakePlan(spec, {Fixture("a100-4x-pcie")}, m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks(), 4);
  EXPECT_FALSE(HasNcclEnv(*plan));  // bare metal, big /dev/shm, single node
  EXPECT_TRUE(absl::StrContains(Find(*plan, "comm.bucket_mb").reason(), "SYS"));
  EXPECT_EQ(plan->precision(), "bf16");
}

TEST(PlannerPcie, FittedBandwidthFromProbePoints) {
  PlannerMeasurements m;
  m.step_seconds = 0.12;
  m.step_micro_batch = 128;
  // t = 1 ms + bytes * 2(n-1)/n / 10 GB/s, n = 4.
  for (double bytes : {1e6, 16e6, 256e6})
    m.allreduce_points.push_back({bytes, 1e-3 + bytes * 1.5 / 10e9});
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_train()->set_global_batch(1024);
  auto plan = MakePlan(spec, {Fixture("a100-4x-pcie")}, m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string why = Find(*plan, "comm.bucket_mb").reason();
  EXPECT_TRUE(absl::StrContains(why, "fitted from 3")) << why;
  EXPECT_TRUE(absl::StrContains(why, "10 GB/s")) << why;
  EXPECT_TRUE(absl::StrContains(why, "1 ms")) << why;
}

// ---- Degraded topology ----------------------------------------------------------------

TEST(PlannerDegraded, BrokenRootPlansWithStatedReasons) {
  ProbeOptions opt;
  opt.root = SourceDir() + "/tests/fixtures/broken/root";
  opt.nvml_library = SourceDir() + "/tests/fixtures/broken/fake-libnvidia-ml.so.1";
  auto t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok());
  auto plan = MakePlan(DefaultJobSpec(), {*t}, Wsl2Measurements());
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::cout << FormatPlan(*plan);
  EXPECT_EQ(plan->device(), "cuda");
  EXPECT_EQ(plan->precision(), "fp16");
  EXPECT_TRUE(absl::StrContains(Find(*plan, "train.precision").reason(),
                                "compute capability unknown"));
  std::string warnings = absl::StrJoin(plan->warnings(), "\n");
  EXPECT_TRUE(absl::StrContains(warnings, "unknown to the probe")) << warnings;
  EXPECT_TRUE(absl::StrContains(warnings, "device memory unknown")) << warnings;
  // The GPU pair's path is unknown: data parallelism over it is judged with
  // the measured bandwidth and found slower, and the reason says over what.
  EXPECT_TRUE(absl::StrContains(Find(*plan, "resources.ranks").reason(), "over unknown"));
  EXPECT_GE(plan->micro_batch(), 1);
  ExpectEveryDecisionHasAReason(*plan);
}

TEST(PlannerDegraded, CudaRequestedWithoutGpus) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_resources()->set_device("cuda");
  auto plan = MakePlan(spec, {Fixture("cpu-only")}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device(), "cuda");
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(plan->warnings(), "\n"), "no node reports"));
}

// ---- Several nodes ----------------------------------------------------------------

TEST(PlannerMultiNode, NoInfinibandMeansSocketsAndSaysSo) {
  v1::Topology a = Fixture("workstation-3gpu"), b = Fixture("workstation-3gpu");
  a.set_node("ws-a");
  b.set_node("ws-b");
  PlannerMeasurements m;
  m.step_seconds = 0.2;
  m.step_micro_batch = 128;
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_train()->set_global_batch(6 * 512);
  auto plan = MakePlan(spec, {a, b}, m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->ranks(), 6);
  EXPECT_EQ(plan->rank_nodes(0), "ws-a");
  EXPECT_EQ(plan->rank_nodes(5), "ws-b");
  EXPECT_EQ(plan->rank_local_devices(3), 0);
  EXPECT_EQ(plan->env().at("NCCL_IB_DISABLE"), "1");
  EXPECT_TRUE(absl::StrContains(Find(*plan, "env.NCCL_IB_DISABLE").reason(), "TCP"));
  EXPECT_TRUE(absl::StrContains(Find(*plan, "comm.bucket_mb").reason(), "10 Gb/s"));
}

TEST(PlannerMultiNode, ActiveInfinibandSetsNothing) {
  v1::Topology a = Fixture("a100-4x-pcie"), b = Fixture("a100-4x-pcie");
  a.set_node("a");
  b.set_node("b");
  // At global_batch 128 one A100 would be as fast as 8 over 10 GB/s (the
  // compute prior says so); 2048 samples a step keep all 8 busy.
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_train()->set_global_batch(2048);
  auto plan = MakePlan(spec, {a, b}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks(), 8) << Find(*plan, "resources.ranks").reason();
  EXPECT_FALSE(HasNcclEnv(*plan));
}

// ---- Robustness: any spec values, any fixture -------------------------------------------

TEST(PlannerRobustness, RandomSpecsNeverFailAndStayConsistent) {
  std::vector<v1::Topology> fixtures;
  for (const char* f : {"cpu-only", "nvlink-8-h100", "wsl2-2x4090", "workstation-3gpu",
                        "a100-4x-pcie", "broken"})
    fixtures.push_back(Fixture(f));
  fixtures.push_back(v1::Topology());  // nothing known at all
  uint64_t x = 42;
  auto next = [&x](uint64_t mod) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((x >> 33) % mod);
  };
  const char* devices[] = {"auto", "cuda", "cpu", ""};
  const char* precisions[] = {"auto", "fp32", "fp16", "bf16", ""};
  const char* modes[] = {"auto", "off", "model", "trial", ""};
  int refused = 0;
  for (int i = 0; i < 400; ++i) {
    v1::JobSpec spec = DefaultJobSpec();
    spec.mutable_train()->set_global_batch(1 + next(5) * next(100000) + (next(3) == 0 ? 2000000000 : 0));
    if (next(3) == 0) spec.mutable_resources()->set_ranks(1 + next(16));
    if (next(4) == 0) spec.mutable_train()->set_micro_batch(1 + next(300));
    if (next(4) == 0) spec.mutable_train()->set_accumulation(1 + next(40));
    if (next(4) == 0) spec.mutable_comm()->set_bucket_mb(next(1000) / 3.0);
    spec.mutable_resources()->set_device(devices[next(4)]);
    spec.mutable_train()->set_precision(precisions[next(5)]);
    spec.mutable_tuning()->set_mode(modes[next(5)]);
    if (next(3) == 0) spec.mutable_model()->set_preset("tiny");
    PlannerMeasurements m;
    if (next(2)) m.allreduce_bus_bandwidth = next(3) == 0 ? -1 : 1e6 * (1 + next(400000));
    if (next(2)) m.allreduce_latency_s = next(1000) * 1e-6;
    if (next(2)) {
      m.step_seconds = next(3) == 0 ? 0 : next(2000) * 1e-3;
      m.step_micro_batch = next(3) == 0 ? 0 : 1 + next(256);
    }
    std::vector<v1::Topology> nodes = {fixtures[next(fixtures.size())]};
    if (next(4) == 0) {
      nodes.push_back(fixtures[next(fixtures.size())]);
      if (nodes[1].node() == nodes[0].node()) nodes[1].set_node(nodes[0].node() + "-2");  // two agents, two names
    }
    auto plan = MakePlan(spec, nodes, m);
    if (!plan.ok() && spec.resources().ranks() > 0) {
      // The refusals of a user's rank count: more CUDA ranks than GPUs
      // (NCCL would refuse them), more ranks than samples per step, CPU
      // ranks far past the cores.
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << i;
      const std::string msg(plan.status().message());
      EXPECT_TRUE(absl::StrContains(msg, "CUDA ranks need one GPU each") ||
                  (spec.resources().ranks() > spec.train().global_batch() &&
                   absl::StrContains(msg, "every rank needs at least one sample per step")) ||
                  absl::StrContains(msg, "ranks per CPU only thrashes"))
          << i << plan.status();
      ++refused;
      continue;
    }
    ASSERT_TRUE(plan.ok()) << i << ": " << plan.status();
    int gpus = 0;
    for (const auto& t : nodes) gpus += t.gpus_size();
    if (plan->device() == "cuda" && gpus > 0) {  // one GPU per rank (without GPUs the ranks fail: warned)
      std::set<std::pair<std::string, int>> gpus;
      for (int r = 0; r < plan->ranks(); ++r)
        EXPECT_TRUE(gpus.emplace(plan->rank_nodes(r), plan->rank_local_devices(r)).second)
            << i << " rank " << r << ": " << plan->ShortDebugString().substr(0, 400) << " nodes " << nodes.size()
            << " " << nodes[0].node() << "/" << nodes.back().node() << " gpus " << nodes[0].gpus_size() << "/"
            << nodes.back().gpus_size();
    }
    EXPECT_GE(plan->ranks(), 1) << i;
    EXPECT_GE(plan->micro_batch(), 1) << i;
    EXPECT_GE(plan->accumulation(), 1) << i;
    EXPECT_GT(plan->bucket_mb(), 0) << i;
    EXPECT_EQ(plan->rank_nodes_size(), plan->ranks()) << i;
    EXPECT_FALSE(FormatPlan(*plan).empty());
    for (const auto& d : plan->decisions()) EXPECT_FALSE(d.reason().empty()) << i << d.name();
  }
  EXPECT_LT(refused, 100);  // most random specs plan
}

TEST(Planner, MicroBatchFromTheSpecDerivesAccumulation) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_train()->set_global_batch(64);
  spec.mutable_train()->set_micro_batch(8);
  auto plan = MakePlan(spec, {Fixture("cpu-only")}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->accumulation(), 4);
  EXPECT_TRUE(absl::StrContains(Find(*plan, "train.accumulation").reason(),
                                "micro_batch 8 from the spec"));
}

// ---- Trials ---------------------------------------------------------------------------

class FakeRunner : public TrialRunner {
 public:
  // Pretends larger buckets are slower (so the trial overrules the model).
  absl::StatusOr<double> TimeStep(const v1::Plan& c, double budget_s) override {
    ++calls;
    last_budget = budget_s;
    if (fail) return absl::UnavailableError("ranks not reachable");
    if (out_of_budget_after >= 0 && calls > out_of_budget_after) {
      return absl::ResourceExhaustedError("tuning.budget_s used up before this trial");
    }
    return 0.2 / 128 * c.micro_batch() * c.accumulation() + c.bucket_mb() * 0.004;
  }
  int calls = 0;
  double last_budget = 0;
  bool fail = false;
  int out_of_budget_after = -1;  // >= 0: RESOURCE_EXHAUSTED after that many calls
};

TEST(PlannerTrials, KeepsTheFastestAndLogsEveryTrial) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  spec.mutable_tuning()->set_mode("trial");
  FakeRunner runner;
  auto plan = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements(), &runner);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::cout << FormatPlan(*plan);
  EXPECT_GE(runner.calls, 2);
  EXPECT_LE(runner.calls, kMaxTrials);
  ASSERT_EQ(plan->trials_size(), runner.calls);
  double best = 0;
  int kept = -1;
  for (int i = 0; i < plan->trials_size(); ++i) {
    EXPECT_GT(plan->trials(i).measured_step_seconds(), 0);
    EXPECT_GT(plan->trials(i).predicted_samples_per_second(), 0);
    if (plan->trials(i).samples_per_second() > best) {
      best = plan->trials(i).samples_per_second();
      kept = i;
    }
  }
  ASSERT_GE(kept, 0);
  EXPECT_TRUE(absl::StrContains(plan->trials(kept).note(), "kept"));
  EXPECT_EQ(plan->bucket_mb(), plan->trials(kept).bucket_mb());
  EXPECT_EQ(plan->micro_batch(), plan->trials(kept).micro_batch());
  EXPECT_NEAR(plan->predicted_samples_per_second(), best, 1e-9);
}

TEST(PlannerTrials, FailingRunnerKeepsTheModelPlan) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  spec.mutable_tuning()->set_mode("trial");
  FakeRunner runner;
  runner.fail = true;
  auto model = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements());
  auto plan = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements(), &runner);
  ASSERT_TRUE(plan.ok() && model.ok());
  EXPECT_EQ(plan->bucket_mb(), model->bucket_mb());
  EXPECT_EQ(plan->accumulation(), model->accumulation());
  ASSERT_GT(plan->trials_size(), 0);
  EXPECT_TRUE(absl::StrContains(plan->trials(0).note(), "ranks not reachable"));
}

// A runner out of its own budget (RESOURCE_EXHAUSTED) skips the candidate:
// noted "skipped", not "failed"; with none measured, the model's plan stays
// and the warning says why.
TEST(PlannerTrials, RunnerOutOfBudgetSkipsCandidates) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  spec.mutable_tuning()->set_mode("trial");
  FakeRunner runner;
  runner.out_of_budget_after = 1;
  auto plan = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements(), &runner);
  ASSERT_TRUE(plan.ok());
  ASSERT_GE(plan->trials_size(), 2);
  EXPECT_GT(plan->trials(0).measured_step_seconds(), 0);
  EXPECT_TRUE(absl::StrContains(plan->trials(0).note(), "kept"));
  EXPECT_EQ(plan->trials(1).note(), "skipped: tuning.budget_s used up before this trial");

  FakeRunner none;
  none.out_of_budget_after = 0;
  auto model = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements());
  auto unmeasured = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements(), &none);
  ASSERT_TRUE(unmeasured.ok() && model.ok());
  EXPECT_EQ(unmeasured->micro_batch(), model->micro_batch());
  bool warned = false;
  for (const auto& w : unmeasured->warnings()) {
    warned |= w == "no tuning trial fitted in tuning.budget_s; keeping the model's plan";
  }
  EXPECT_TRUE(warned);
}

TEST(PlannerTrials, ModelModeNeverCallsTheRunner) {
  v1::JobSpec spec = Config("wsl2-two-gpus-sys.yaml");
  spec.mutable_tuning()->set_mode("model");
  FakeRunner runner;
  auto plan = MakePlan(spec, {Fixture("wsl2-2x4090")}, Wsl2Measurements(), &runner);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(runner.calls, 0);
  EXPECT_EQ(plan->trials_size(), 0);
}

// ---- Configs and FormatPlan ------------------------------------------------------------

TEST(PlannerConfigs, EveryExampleParsesAndPlans) {
  struct {
    const char* file;
    const char* fixture;
  } cases[] = {{"one-gpu.yaml", "workstation-3gpu"},
               {"wsl2-two-gpus-sys.yaml", "wsl2-2x4090"},
               {"nvlink-8-gpus.yaml", "nvlink-8-h100"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    v1::JobSpec spec = Config(c.file);
    auto plan = MakePlan(spec, {Fixture(c.fixture)}, PlannerMeasurements{});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectEveryDecisionHasAReason(*plan);
  }
  v1::JobSpec one = Config("one-gpu.yaml");
  auto plan = MakePlan(one, {Fixture("workstation-3gpu")}, PlannerMeasurements{});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ranks(), 1);
  EXPECT_FALSE(HasNcclEnv(*plan));
}

TEST(FormatPlan, TableEnvPredictionsWarnings) {
  auto plan = MakePlan(Config("wsl2-two-gpus-sys.yaml"), {Fixture("wsl2-2x4090")},
                       Wsl2Measurements());
  ASSERT_TRUE(plan.ok());
  std::string text = FormatPlan(*plan);
  EXPECT_TRUE(absl::StrContains(text, "SETTING")) << text;
  EXPECT_TRUE(absl::StrContains(text, "SOURCE")) << text;
  EXPECT_TRUE(absl::StrContains(text, "comm.bucket_mb")) << text;
  EXPECT_TRUE(absl::StrContains(text, "NCCL_SHM_DISABLE=1")) << text;
  EXPECT_TRUE(absl::StrContains(text, "one rank alone   640 samples/s")) << text;
  EXPECT_TRUE(absl::StrContains(text, "Warnings:")) << text;
}

// PlannerMemory's starting point: one rank on an H100, the fused
// attention, a global batch large enough that memory bounds the micro-batch,
// planned without measurements: the memory model's activations per sample
// (a) and fixed part (with the CUDA context).
class PlannerMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    spec.mutable_resources()->set_ranks(1);
    spec.mutable_resources()->set_device("cuda");
    spec.mutable_train()->set_global_batch(4096);
    spec.mutable_train()->set_attention("fused");  // "auto" predicts the GEMM version's memory
    model = MakePlan(spec, {h100}, PlannerMeasurements{});
    ASSERT_TRUE(model.ok()) << model.status();
    a = model->predicted_activation_bytes_per_sample();
    fixed = model->predicted_memory_bytes() - model->micro_batch() * a;
    ASSERT_GT(a, 0);
    ASSERT_GT(fixed, 0);
  }
  v1::Topology h100 = Fixture("nvlink-8-h100");
  v1::JobSpec spec = DefaultJobSpec();
  absl::StatusOr<v1::Plan> model = absl::UnknownError("not planned");
  double a = 0, fixed = 0;
};

// An earlier job's peak memory: the plan's memory line goes through it. The
// excess over the model includes fixed overheads, so the slope is the
// larger of the two per-sample figures when the point fits the budget (a
// larger micro-batch is predicted high), the rest fixed; the reasons cite
// the job.
TEST_F(PlannerMemory, AnEarlierJobsPeakSetsTheMemoryLine) {

  // Held 4x the model's activations at micro-batch 8 (under the budget).
  PlannerMeasurements heavy;
  heavy.memory_points = {{8, fixed + 8 * 4 * a}};
  heavy.memory_source = "job j-000009-abcd held 30.00 GiB at micro-batch 8";
  auto h = MakePlan(spec, {h100}, heavy);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_NEAR(h->predicted_activation_bytes_per_sample(), 4 * a, 1e-6 * a);
  EXPECT_LT(h->micro_batch(), model->micro_batch());
  EXPECT_LE(h->predicted_memory_bytes(), h->memory_target_bytes());
  // The line goes through the measured point.
  EXPECT_NEAR(h->predicted_memory_bytes() - (h->micro_batch() - 8) * 4 * a,
              heavy.memory_points[0].second, 1e-6 * heavy.memory_points[0].second);
  const std::string why = Find(*h, "predicted.memory_bytes").reason();
  EXPECT_TRUE(absl::StrContains(why, "job j-000009-abcd held")) << why;
  EXPECT_TRUE(absl::StrContains(why, "the larger of the measured")) << why;
  EXPECT_FALSE(absl::StrContains(Find(*model, "predicted.memory_bytes").reason(), "held"));

  // Held less than the model predicts: the model's slope, less fixed memory,
  // so at least the model's micro-batch fits.
  PlannerMeasurements light = heavy;
  light.memory_points = {{8, fixed + 8 * 0.5 * a}};
  auto l = MakePlan(spec, {h100}, light);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_NEAR(l->predicted_activation_bytes_per_sample(), a, 1e-6 * a);
  EXPECT_GE(l->micro_batch(), model->micro_batch());
  EXPECT_LE(l->predicted_memory_bytes(), model->predicted_memory_bytes() *
                                              l->micro_batch() / model->micro_batch());

  // A point over the budget: the smaller slope (here the model's), so a
  // smaller micro-batch is not predicted to save more than the model says.
  // (Twice the model's activations, at a micro-batch past the target.)
  PlannerMeasurements over = heavy;
  const int over_m =
      static_cast<int>(std::ceil((1.1 * model->memory_target_bytes() - fixed) / (2 * a)));
  over.memory_points = {{over_m, fixed + over_m * 2 * a}};
  auto o = MakePlan(spec, {h100}, over);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_NEAR(o->predicted_activation_bytes_per_sample(), a, 1e-6 * a);
  EXPECT_TRUE(absl::StrContains(Find(*o, "predicted.memory_bytes").reason(), "the smaller of"))
      << Find(*o, "predicted.memory_bytes").reason();
}

// train.attention auto: a rank may keep the GEMM attention, so the plan
// predicts that version's memory, and the measured line still counts: the
// GEMM prediction is the measured (fused) line plus the model's GEMM
// probabilities, never the bare model (which would lose the measurement).
TEST_F(PlannerMemory, AutoAttentionKeepsTheMeasuredLine) {
  spec.mutable_train()->set_attention("auto");
  auto model = MakePlan(spec, {h100}, PlannerMeasurements{});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->attention(), "auto");
  const double gemm_extra = model->predicted_activation_bytes_per_sample() - a;
  ASSERT_GT(gemm_extra, 0);

  // 1 GiB more fixed memory and twice the activations measured at 8.
  const double extra = 1024.0 * 1024 * 1024;
  PlannerMeasurements heavy;
  heavy.memory_points = {{8, fixed + extra + 8 * 2 * a}};
  heavy.memory_source = "job j-000010-abcd held it at micro-batch 8";
  auto h = MakePlan(spec, {h100}, heavy);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->attention(), "auto");
  const int m = h->micro_batch();
  // One point that fits: all of its excess counts per sample (the larger
  // slope), the line through it.
  const double held = heavy.memory_points[0].second;
  const double slope = (held - fixed) / 8;
  EXPECT_NEAR(h->predicted_activation_bytes_per_sample(), slope + gemm_extra, 1e-6 * a);
  const double line = held + slope * (m - 8);  // the measured fused line at m
  EXPECT_NEAR(h->predicted_memory_bytes(), line + m * gemm_extra, 1e-6 * line);
  EXPECT_LE(h->predicted_memory_bytes(), h->memory_target_bytes());
  const std::string why = Find(*h, "predicted.memory_bytes").reason();
  EXPECT_TRUE(absl::StrContains(why, "the GEMM attention's")) << why;
  EXPECT_TRUE(absl::StrContains(why, "job j-000010-abcd")) << why;
}

// train.attention auto with peaks of earlier GEMM-attention runs (an
// explicit gemm plan, or an auto plan whose ranks kept it): the GEMM
// version's memory is the line through those, not the fused line plus the
// model's difference; a rank may keep either version, so the prediction is
// the larger of the two lines at the plan's micro-batch.
TEST_F(PlannerMemory, AutoAttentionPredictsTheGemmVersionFromItsOwnPeaks) {
  spec.mutable_train()->set_attention("auto");
  spec.mutable_train()->set_global_batch(64);  // one micro-batch of 64: room for both versions
  auto model = MakePlan(spec, {h100}, PlannerMeasurements{});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->attention(), "auto");
  ASSERT_EQ(model->micro_batch(), 64);
  const double ga = model->predicted_activation_bytes_per_sample();  // the GEMM version's, modelled
  const double gfixed = model->predicted_memory_bytes() - 64 * ga;
  ASSERT_GT(ga, a);
  const double mib = 1024.0 * 1024;

  // The GEMM version measured above its model (1.5x the activations, 256 MiB
  // more fixed) and no fused peaks: the GEMM line is the larger.
  auto above = [&](int m) { return gfixed + 256 * mib + 1.5 * ga * m; };
  PlannerMeasurements gemm_only;
  gemm_only.gemm_memory_points = {{16, above(16)}, {4, above(4)}};
  gemm_only.gemm_memory_source = "job j-000012-abcd held x at micro-batch 16 with the GEMM attention";
  auto g = MakePlan(spec, {h100}, gemm_only);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->attention(), "auto") << Find(*g, "train.attention").reason();
  EXPECT_NEAR(g->predicted_activation_bytes_per_sample(), 1.5 * ga, 1e-6 * ga);
  EXPECT_NEAR(g->predicted_memory_bytes(), above(64), 1e-6 * above(64));
  std::string why = Find(*g, "predicted.memory_bytes").reason();
  EXPECT_TRUE(absl::StrContains(why, "the GEMM attention's, which a rank keeps if it times faster (the line "
                                     "through the GEMM version's own peaks (job j-000012-abcd held x"))
      << why;
  EXPECT_TRUE(absl::StrContains(why, "fitted over micro-batches 4, 16")) << why;
  EXPECT_TRUE(absl::StrContains(why, "the larger of the two versions'")) << why;

  // The fused kernels measured heavy (1 GiB more fixed, twice the
  // activations at 8) and the GEMM version at its model: the fused line is
  // the larger (a rank keeps the fused unless the GEMM times faster), so it
  // is the prediction; the GEMM version's figure is still cited.
  PlannerMeasurements both;
  both.memory_points = {{8, fixed + 1024 * mib + 8 * 2 * a}};
  both.memory_source = "job j-000010-abcd held it at micro-batch 8";
  auto at_model = [&](int m) { return gfixed + ga * m; };
  both.gemm_memory_points = {{16, at_model(16)}, {4, at_model(4)}};
  both.gemm_memory_source = gemm_only.gemm_memory_source;
  auto b = MakePlan(spec, {h100}, both);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->attention(), "auto") << Find(*b, "train.attention").reason();
  const double held = both.memory_points[0].second;
  const double slope = (held - fixed) / 8;  // one point that fits: all its excess per sample
  const double fused_line = held + slope * (64 - 8);
  ASSERT_GT(fused_line, at_model(64));
  EXPECT_NEAR(b->predicted_memory_bytes(), fused_line, 1e-6 * fused_line);
  EXPECT_NEAR(b->predicted_activation_bytes_per_sample(), slope, 1e-6 * slope);
  why = Find(*b, "predicted.memory_bytes").reason();
  EXPECT_TRUE(absl::StrContains(why, "the fused attention's, which a rank keeps unless the GEMM version times "
                                     "faster, the larger of the two versions'"))
      << why;
  EXPECT_TRUE(absl::StrContains(why, "job j-000010-abcd")) << why;
  EXPECT_TRUE(absl::StrContains(why, "the line through the GEMM version's own peaks (job j-000012-abcd")) << why;

  // A fused plan (the user's) ignores them: its memory is the fused line's.
  spec.mutable_train()->set_attention("fused");
  auto f = MakePlan(spec, {h100}, both);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->attention(), "fused");
  EXPECT_FALSE(absl::StrContains(Find(*f, "predicted.memory_bytes").reason(), "j-000012"));
}

// Two or more micro-batches measured: the slope is fitted (not the larger or
// smaller of model and point), and the line lies on or above every point, so
// no micro-batch that ran is predicted to need less than it held.
TEST_F(PlannerMemory, TwoMicroBatchesFitTheSlope) {

  // On a line: 3x the model's activations, 1 GiB more fixed memory. One
  // point alone (fits the budget) would keep the larger slope through it;
  // two give the line itself.
  const double extra = 1024.0 * 1024 * 1024;
  auto line = [&](int m) { return fixed + extra + 3 * a * m; };
  PlannerMeasurements two;
  two.memory_points = {{16, line(16)}, {4, line(4)}};
  two.memory_source = "job j-2 held x at micro-batch 16, job j-1 held y at micro-batch 4";
  auto p = MakePlan(spec, {h100}, two);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->predicted_activation_bytes_per_sample(), 3 * a, 1e-6 * a);
  EXPECT_NEAR(p->predicted_memory_bytes(), line(p->micro_batch()), 1e-6 * line(p->micro_batch()));
  EXPECT_LE(p->predicted_memory_bytes(), p->memory_target_bytes());
  EXPECT_LT(p->micro_batch(), model->micro_batch());
  const std::string why = Find(*p, "predicted.memory_bytes").reason();
  EXPECT_TRUE(absl::StrContains(why, "fitted over micro-batches 4, 16")) << why;
  EXPECT_TRUE(absl::StrContains(why, "job j-1 held y")) << why;

  // Off the line (a noisy middle point above it): the fitted slope, and the
  // line raised until no point is above it, touching the highest.
  PlannerMeasurements noisy;
  noisy.memory_points = {{4, line(4)}, {8, line(8) + 0.5 * extra}, {16, line(16)}};
  auto n = MakePlan(spec, {h100}, noisy);
  ASSERT_TRUE(n.ok()) << n.status();
  const double slope = n->predicted_activation_bytes_per_sample();
  const double at0 = n->predicted_memory_bytes() - slope * n->micro_batch();
  for (const auto& [m, bytes] : noisy.memory_points)
    EXPECT_GE(at0 + slope * m, bytes * (1 - 1e-9)) << "micro-batch " << m;
  EXPECT_GT(slope, 0);
  EXPECT_NEAR(std::min({at0 + slope * 4 - line(4), at0 + slope * 8 - line(8) - 0.5 * extra,
                        at0 + slope * 16 - line(16)}),
              0, 1e-6 * line(16));

  // A fitted slope below the model's (here half of it: say one point's rank
  // kept the GEMM attention under an "auto" plan, filed under the fused
  // kernels): the model's slope, the line above both points, so a larger
  // micro-batch is not predicted to need less than the model says.
  auto low = [&](int m) { return fixed + extra + 0.5 * a * m; };
  PlannerMeasurements shallow;
  shallow.memory_points = {{4, low(4)}, {16, low(16)}};
  auto sh = MakePlan(spec, {h100}, shallow);
  ASSERT_TRUE(sh.ok()) << sh.status();
  EXPECT_NEAR(sh->predicted_activation_bytes_per_sample(), a, 1e-6 * a);
  const double sh0 = sh->predicted_memory_bytes() - a * sh->micro_batch();
  EXPECT_NEAR(sh0 + 4 * a, low(4), 1e-6 * low(4));  // the steeper line touches the smaller point
  EXPECT_GE(sh0 + 16 * a, low(16));
  EXPECT_TRUE(absl::StrContains(Find(*sh, "predicted.memory_bytes").reason(), "the larger of the fitted"))
      << Find(*sh, "predicted.memory_bytes").reason();

  // Peaks that shrink with the micro-batch (noise, an allocator returning
  // memory): no fitted slope; the memory model's, above both points.
  PlannerMeasurements flat;
  flat.memory_points = {{4, line(16)}, {16, line(4)}};
  auto f = MakePlan(spec, {h100}, flat);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_NEAR(f->predicted_activation_bytes_per_sample(), a, 1e-6 * a);
  const double f0 = f->predicted_memory_bytes() - a * f->micro_batch();
  EXPECT_GE(f0 + 4 * a, line(16) * (1 - 1e-9));
  EXPECT_TRUE(absl::StrContains(Find(*f, "predicted.memory_bytes").reason(),
                                "the peaks do not grow with the micro-batch"))
      << Find(*f, "predicted.memory_bytes").reason();
}

TEST(FormatPlan, TrialsOneLinePerTrial) {
  v1::Plan plan;
  EXPECT_EQ(FormatTrials(plan), "");
  v1::Trial* a = plan.add_trials();
  a->set_micro_batch(16);
  a->set_accumulation(1);
  a->set_bucket_mb(4);
  a->set_note("failed: ABORTED: rank 1 on node n1 exited with code 1; last output:\nOOM");
  v1::Trial* b = plan.add_trials();
  b->set_micro_batch(8);
  b->set_accumulation(2);
  b->set_bucket_mb(2.5);
  b->set_predicted_step_seconds(0.05);
  b->set_measured_step_seconds(0.0421);
  b->set_samples_per_second(760.1);
  b->set_note("no prediction; kept (fastest)");
  const std::string t = FormatTrials(plan);
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 3) << t;  // header + 2 rows
  EXPECT_NE(t.find("MICRO_BATCH"), std::string::npos) << t;
  EXPECT_NE(t.find("exited with code 1; last output:"), std::string::npos) << t;
  EXPECT_EQ(t.find("OOM"), std::string::npos) << t;
  EXPECT_NE(t.find("0.0500"), std::string::npos) << t;
  EXPECT_NE(t.find("0.0421"), std::string::npos) << t;
  EXPECT_NE(t.find("760.1"), std::string::npos) << t;
  EXPECT_NE(t.find("2.5"), std::string::npos) << t;
  EXPECT_NE(t.find("kept (fastest)"), std::string::npos) << t;
}

}  // namespace
}  // namespace dgca
