#include "planner/compute_prior.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace dgca {
namespace {

v1::Topology H200() {
  v1::Topology t;
  t.set_node("h200");
  auto* g = t.add_gpus();
  g->set_name("NVIDIA H200");
  return t;
}

// The efficiency of record reproduces the run it came from: bert-base,
// seq 128, bf16, micro-batch 128 in 30.10 ms per step on an H200
// (bench/gpu/RESULTS.md, run 3).
TEST(ComputePrior, ReproducesTheH200RunOfRecord) {
  auto cfg = ApplyPreset("bert-base", ModelConfig());
  ASSERT_TRUE(cfg.ok());
  const ComputePrior p =
      PriorStepTime({H200()}, /*cuda=*/true, Precision::kBf16, *cfg, 128, 1, 1, PlannerMeasurements{});
  ASSERT_TRUE(p.ok) << p.why;
  EXPECT_EQ(p.device_class, "gpu H200 SXM bf16");
  EXPECT_DOUBLE_EQ(p.efficiency, kGpuEfficiencyOfRecord);
  EXPECT_NEAR(p.fixed + 128 * p.per_sample, 0.03010, 0.03010 * 0.01);
  v1::Plan plan;  // what a finished job's review reads back
  plan.set_compute_device_class(p.device_class);
  plan.set_micro_batch(128);
  plan.set_compute_ideal_fixed_seconds(p.Ideal(0));
  plan.set_compute_ideal_seconds_per_sample(p.Ideal(1) - p.Ideal(0));
  EXPECT_NEAR(EfficiencyOf(plan, 0.03010), kGpuEfficiencyOfRecord, 0.003);
  EXPECT_EQ(EfficiencyOf(plan, 0), 0);
  plan.clear_compute_device_class();  // no prior behind it
  EXPECT_EQ(EfficiencyOf(plan, 0.03010), 0);
  EXPECT_TRUE(absl::StrContains(p.why, "989 TFLOP/s bf16 peak")) << p.why;
  EXPECT_TRUE(absl::StrContains(p.why, "the H200 run of record")) << p.why;
}

// A learned efficiency replaces the record's and is cited; c(m) scales
// inversely with it.
TEST(ComputePrior, LearnedEfficiencyReplacesTheRecord) {
  auto cfg = ApplyPreset("bert-base", ModelConfig());
  PlannerMeasurements m;
  m.compute_efficiency = 2 * kGpuEfficiencyOfRecord;
  m.compute_efficiency_source = "job j-000007 on gpu H200 SXM bf16";
  const ComputePrior record =
      PriorStepTime({H200()}, true, Precision::kBf16, *cfg, 128, 1, 1, PlannerMeasurements{});
  const ComputePrior learned = PriorStepTime({H200()}, true, Precision::kBf16, *cfg, 128, 1, 1, m);
  ASSERT_TRUE(learned.ok);
  EXPECT_NEAR(learned.per_sample, record.per_sample / 2, 1e-12);
  EXPECT_NEAR(learned.fixed, record.fixed / 2, 1e-12);
  EXPECT_TRUE(absl::StrContains(learned.why, "job j-000007")) << learned.why;
  EXPECT_DOUBLE_EQ(learned.Ideal(64), record.Ideal(64));  // the ideal does not move
}

// The slowest GPU bounds a mixed node set; a GPU the table lacks means no
// prior rather than a guess; a CPU needs its clock and SIMD width.
TEST(ComputePrior, SlowestDeviceAndUnknowns) {
  auto cfg = ApplyPreset("small", ModelConfig());
  v1::Topology mixed = H200();
  mixed.add_gpus()->set_name("NVIDIA GeForce RTX 4090");
  const ComputePrior p =
      PriorStepTime({mixed}, true, Precision::kBf16, *cfg, 64, 1, 1, PlannerMeasurements{});
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.device_class, "gpu RTX 4090 bf16");
  mixed.mutable_gpus(1)->set_name("Mystery GPU");
  const ComputePrior none =
      PriorStepTime({mixed}, true, Precision::kBf16, *cfg, 64, 1, 1, PlannerMeasurements{});
  EXPECT_FALSE(none.ok);
  EXPECT_TRUE(absl::StrContains(none.why, "\"Mystery GPU\"")) << none.why;
  EXPECT_EQ(none.Ideal(8), 0);

  // CPU: the GEMM rate measured for the rank's threads, shared only when
  // the node's ranks have more threads than it has CPUs (28 GFLOP/s on one
  // thread, 34 on both CPUs, as on this project's VM).
  v1::Topology cpu;
  cpu.set_node("c");
  cpu.set_cpu_count(2);
  cpu.set_cpu_mhz(2100);
  cpu.set_cpu_vector_bits(512);
  cpu.set_cpu_gemm_flops_one_thread(28e9);
  cpu.set_cpu_gemm_flops_all_threads(34e9);
  EXPECT_DOUBLE_EQ(CpuRankGemmRate(cpu, 1, 1), 28e9);
  EXPECT_DOUBLE_EQ(CpuRankGemmRate(cpu, 1, 2), 34e9);
  EXPECT_DOUBLE_EQ(CpuRankGemmRate(cpu, 2, 1), 28e9);  // a core each
  EXPECT_DOUBLE_EQ(CpuRankGemmRate(cpu, 4, 1), 14e9);  // oversubscribed: shared
  EXPECT_DOUBLE_EQ(CpuRankGemmRate(cpu, 2, 2), 17e9);
  const ComputePrior two = PriorStepTime({cpu}, false, Precision::kFp32, *cfg, 40, 2, 1, {});
  const ComputePrior one = PriorStepTime({cpu}, false, Precision::kFp32, *cfg, 40, 1, 2, {});
  ASSERT_TRUE(two.ok && one.ok) << two.why;
  EXPECT_DOUBLE_EQ(two.peak, 34e9);
  EXPECT_DOUBLE_EQ(one.peak, 28e9);
  EXPECT_EQ(two.device_class, "cpu CPU x2");
  EXPECT_TRUE(absl::StrContains(two.why, "2100 MHz x 512-bit SIMD")) << two.why;
  cpu.set_cpu_gemm_flops_one_thread(0);
  const ComputePrior none_cpu = PriorStepTime({cpu}, false, Precision::kFp32, *cfg, 40, 1, 1, {});
  EXPECT_FALSE(none_cpu.ok);
  EXPECT_TRUE(absl::StrContains(none_cpu.why, "GEMM rate was not measured")) << none_cpu.why;
}

}  // namespace
}  // namespace dgca
