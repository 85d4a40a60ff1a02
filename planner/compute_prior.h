// The compute prior: c(m), the time of one micro-step of m samples on one
// rank, before anything was measured on the device, so that the first plan
// of a job can predict its step time, compare rank counts and choose the
// accumulation (planner/cost_model.h).
//
//   c(m) = (optimizer bytes / bandwidth + m x FLOPs per sample / peak) / e
//
// FLOPs per sample: model/core/compute_cost.h TrainFlopsPerSample. The
// optimizer streams kOptimizerBytesPerParameter bytes per parameter (AdamW
// in fp32: weight, gradient, m and v read; weight, m and v written; the
// gradient cleared). Peak and bandwidth: a GPU's row of the table in
// model/core/compute_cost.cc for the plan's precision (the slowest GPU of
// the nodes); for a CPU rank the trainer's GEMM rate as the agent measured
// it (Topology.cpu_gemm_flops_*, model/cpu/gemm_rate.h; a core's peak from
// /proc/cpuinfo is only shown: on this project's VM OpenBLAS reaches a
// fifth of it) and kCpuBandwidthPerThread. e, the efficiency: what our own runs reached of
// that ideal time, per device class: the newest jobs' on that class when
// the job store has them (PlannerMeasurements.compute_efficiency, kept
// current by every finished job: coordinator/plan_checks.h), else the run
// of record (kGpuEfficiencyOfRecord, kCpuEfficiencyOfRecord).
//
// Measurements of the model itself (PlannerMeasurements.step_points)
// replace the prior (planner/decide_batch.cc); the plan says which it used
// (Plan.compute_source).
//
// Thread-safety: pure functions; safe from any thread.
#ifndef DGCA_PLANNER_COMPUTE_PRIOR_H_
#define DGCA_PLANNER_COMPUTE_PRIOR_H_

#include <string>
#include <vector>

#include "dgca/v1/plan.pb.h"
#include "dgca/v1/topology.pb.h"
#include "model/core/config.h"
#include "planner/measurements.h"

namespace dgca {

inline constexpr double kOptimizerBytesPerParameter = 32;

// The H200 run of record (bench/gpu/RESULTS.md, run 3: bert-base, seq 128,
// bf16, fused attention, micro-batch 128, 30.10 ms per step): the ideal
// time of that step, 128 x 74.7 GFLOP / 989 TFLOP/s + 128 M parameters x
// 32 B / 4.8 TB/s = 9.67 + 0.85 = 10.5 ms, is 0.350 of it
// (planner/compute_prior_test.cc checks the arithmetic).
inline constexpr double kGpuEfficiencyOfRecord = 0.350;

// CPU ranks on this project's build machine (2 vCPUs of a Xeon): what its
// jobs reached of the ideal time with the measured GEMM rate (the non-GEMM
// work: layer norms, softmax, GELU, the loader, the optimizer's passes);
// bench/planner/RESULTS-prior.md, where the prior is checked against jobs.
inline constexpr double kCpuEfficiencyOfRecord = 0.70;
// Memory bandwidth one CPU thread streams the optimizer at: a few GB/s per
// core on server parts; with the efficiency above it fits the measured
// fixed part of c(m) on the build machine (bench/planner/RESULTS-prior.md).
inline constexpr double kCpuBandwidthPerThread = 6e9;

struct ComputePrior {
  bool ok = false;          // false: the device's peak is unknown (why says so)
  std::string device_class; // "gpu RTX 4090 bf16", "cpu Intel(R) Xeon(R) Processor x2"
  double flops_per_sample = 0;
  double optimizer_bytes = 0;
  double peak = 0;          // FLOP/s of one rank
  double bandwidth = 0;     // bytes/s of one rank
  double efficiency = 0;    // e
  double fixed = 0;         // a: optimizer bytes / bandwidth / e
  double per_sample = 0;    // b: FLOPs per sample / peak / e
  std::string why;          // the arithmetic and its sources
  // The ideal time of a micro-step of m samples (e = 1).
  double Ideal(int m) const;
};

// The prior for ranks of `threads_per_rank` threads, `ranks_per_node` of
// them on each node (CPU) on `nodes`. meas.compute_efficiency, when set,
// replaces the run of record's.
ComputePrior PriorStepTime(const std::vector<v1::Topology>& nodes, bool cuda,
                           Precision precision, const ModelConfig& cfg, int seq_len,
                           int threads_per_rank, int ranks_per_node,
                           const PlannerMeasurements& meas);

// The GEMM FLOP/s one CPU rank gets on node t when `ranks_per_node` ranks of
// `threads_per_rank` threads run there: the rate measured for that many
// threads in one process (linear between one thread's and every CPU's),
// scaled down by CPUs / (ranks x threads) when the ranks' threads
// outnumber the CPUs. 0 when the rate was not measured.
double CpuRankGemmRate(const v1::Topology& t, int ranks_per_node, int threads_per_rank);

// The efficiency a measured micro-step of `plan` shows: the ideal c(m) its
// prior recorded (Plan.compute_ideal_*) at its micro-batch, over the
// measured seconds; 0 when the plan had no prior or nothing was measured.
double EfficiencyOf(const v1::Plan& plan, double measured_seconds);

}  // namespace dgca

#endif  // DGCA_PLANNER_COMPUTE_PRIOR_H_
