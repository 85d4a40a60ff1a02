// Planner (the tuner): turns a job spec, the nodes' topology reports and
// measurements into a Plan in which every resolved value carries a one-line
// reason (DESIGN.md "Planner"). Values the user set win, and the plan says so.
//
// Cost model (per rank; planner/planner.cc has the details):
//   c(m)    = a + b m  (forward+backward+optimizer of one micro-step, measured:
//             b = step_seconds / step_micro_batch and a = 0 from one point,
//             a least-squares line from step_points of two or more m)
//   G       = 4 * parameters (fp32 gradients), f = 2(n-1)/n
//   t(S)    = latency + S * f / busbw               (one all-reduce of S bytes)
//   C       = ceil(G/S) * latency + G * f / busbw   (all gradients)
//   exposed = max(C/nb, C - 2/3 c(m) (1 - 1/nb))    (nb = ceil(G/S); only the
//             last micro-step's backward overlaps; no all-reduce on
//             accumulation micro-steps; exposed = C for CPU ranks that use
//             every core)
//   step    = k * c(m) + exposed; samples/s = n*m*k / step; share = exposed/step
// Decisions, each a PlanDecision with its arithmetic:
//   resources.device/ranks (one per GPU, dropped to 1 when the model predicts
//   one GPU faster; CPU: one per NUMA node or min(2, cpus)), comm.backend,
//   train.precision (bf16 on cc >= 8.0, fp16 below or unknown, fp32 on CPU),
//   train.micro_batch (largest that fits 80% of device memory per
//   model/core/memory_model.h, minus 512 MiB CUDA context), train.accumulation
//   (smallest k with exposed <= 10% of the step within global_batch; else the
//   fastest, with a warning naming the global_batch that would reach 10%),
//   comm.bucket_mb (G/4 when the all-reduce is not small next to backward,
//   25 MiB when it is; never below 9 * latency * busbw / f), data.loader.threads,
//   resources.threads_per_rank, env.* (OMP_NUM_THREADS on CPU;
//   CUDA_DEVICE_ORDER, and NCCL_SHM_DISABLE / NCCL_P2P_DISABLE /
//   NCCL_IB_DISABLE only where the topology calls for them). Values set in the
//   spec (and comm.env) win with source USER.
//
// Thread-safety: pure functions; safe from any thread. A TrialRunner is
// called from the calling thread only.
#ifndef DGCA_PLANNER_PLANNER_H_
#define DGCA_PLANNER_PLANNER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/plan.pb.h"
#include "dgca/v1/topology.pb.h"

namespace dgca {

// Measured inputs; absent measurements (0) make the planner use its model and
// say so in the reasons.
struct PlannerMeasurements {
  // All-reduce bus bandwidth (bytes/s) and latency (s) between the job's ranks.
  double allreduce_bus_bandwidth = 0;
  double allreduce_latency_s = 0;
  // Seconds for one forward+backward of one micro-batch of `step_micro_batch`
  // samples on one rank. CPU ranks: measure with the plan's threads_per_rank
  // and, ideally, while the other ranks run too (a trial): ranks share cores
  // and memory bandwidth, and a rank timed alone on a busy 2-core machine ran
  // twice as fast as the same rank next to its peer (bench/gloo gloo-exposed,
  // tiny preset, micro-batch 16: 11.5 vs 22 ms per sample).
  double step_seconds = 0;
  int step_micro_batch = 0;
  // Added by T1: raw points of the all-reduce probe, (bytes, seconds) for one
  // all-reduce among the job's ranks. When allreduce_bus_bandwidth is 0 and
  // there are at least two sizes, bandwidth and latency are fitted from
  // them: t = latency + bytes * 2(n-1)/n / busbw (least squares).
  std::vector<std::pair<double, double>> allreduce_points;
  // Added by R2-A: where the all-reduce figures come from, e.g. "measured by
  // dgca diagnose comm at 2026-11-22 04:40:00 UTC (job j-000003-ab12)";
  // prefixed to the link's reason when a measurement is used.
  std::string allreduce_source;
  // Step-time points (micro-batch, seconds per micro-step of forward+
  // backward+optimizer, communication excluded), e.g. what earlier jobs of
  // the same model measured. With two or more distinct micro-batches they
  // replace step_seconds/step_micro_batch: c(m) = a + b m is fitted (least
  // squares; a >= 0, else the fit through the origin) so a fixed per-step
  // cost (optimizer, launch, loader hand-off) is not scaled with m. One
  // point acts as step_seconds/step_micro_batch.
  std::vector<std::pair<int, double>> step_points;
  // Where the step time comes from, e.g. "measured by job j-000004-ab12 at
  // 2026-11-22 05:10:00 UTC (micro-batch 16, median of 40 steps)"; cited in
  // the accumulation decision's reason.
  std::string step_source;
  // Extra all-reduce time inside a job, per second of compute c(m): the
  // ranks' steps jitter, so each all-reduce also waits for the slower peer,
  // which a probe that only communicates never sees. Learned from earlier
  // jobs on these nodes as (measured all-reduce - the probe's prediction) /
  // measured compute; 0 = none. Added to C as skew * c(m).
  double allreduce_skew_per_compute = 0;
  std::string allreduce_skew_source;
  // Memory points (micro-batch, bytes): the most memory a rank of an earlier
  // job of the same model on these nodes held (GPU memory with the CUDA
  // context, or a CPU rank's peak resident set), newest first, one per
  // micro-batch. The plan's memory line goes through them (Planner::Memory):
  // one point sets the fixed part, the slope the larger of the model's and
  // the measured excess per sample when the point fits the budget, the
  // smaller when not; two or more distinct micro-batches fit the slope
  // (least squares, never below the model's) and put the line on or above
  // every point. memory_source is cited.
  std::vector<std::pair<int, double>> memory_points;
  std::string memory_source;
  // The same for the GEMM + softmax attention, where the plan's are the
  // fused kernels' (CUDA): peaks of earlier runs that ran the GEMM version
  // (an explicit gemm plan, or an "auto" plan whose ranks kept it). An
  // "auto" plan predicts its memory, the GEMM version's, through them
  // instead of through the fused line plus the memory model's difference.
  std::vector<std::pair<int, double>> gemm_memory_points;
  std::string gemm_memory_source;
};

// Tuning trials (`tuning.mode: trial`, or `auto` when a runner is given):
// the caller supplies a runner that times a candidate plan on the real ranks
// (the worker side implements it). MakePlan ranks its candidates by
// predicted throughput, times the best few (at most kMaxTrials, within
// spec.tuning.budget_s) and keeps the fastest measured one; every trial is
// logged in Plan.trials with its score.
class TrialRunner {
 public:
  virtual ~TrialRunner() = default;
  // Runs a few optimizer steps of `candidate` (ranks, micro_batch,
  // accumulation, bucket_mb, precision, env as in the plan) and returns the
  // measured seconds per optimizer step. `budget_s` is what is left of the
  // tuning budget; a runner that cannot fit in it returns an error
  // (RESOURCE_EXHAUSTED when it did not start it: the trial is noted
  // "skipped", not "failed").
  virtual absl::StatusOr<double> TimeStep(const v1::Plan& candidate,
                                          double budget_s) = 0;
};

inline constexpr int kMaxTrials = 3;

// The planner's target for exposed communication: at most this share of the
// optimizer step (DESIGN.md "Accumulation", default 10%).
inline constexpr double kTargetCommShare = 0.10;

// Plans `spec` on `nodes` (at least one). Never fails for a valid spec: facts
// the topology lacks are reported in Plan.warnings and the decisions' reasons.
absl::StatusOr<v1::Plan> MakePlan(const v1::JobSpec& spec,
                                  const std::vector<v1::Topology>& nodes,
                                  const PlannerMeasurements& measurements);

// As above; `trials` (may be null) times candidates when the tuning mode
// asks for trials. Errors from the runner are logged as failed trials, never
// returned.
absl::StatusOr<v1::Plan> MakePlan(const v1::JobSpec& spec,
                                  const std::vector<v1::Topology>& nodes,
                                  const PlannerMeasurements& measurements,
                                  TrialRunner* trials);

// Bytes for people: "1.50 GiB", "12.0 MiB", "800 KiB" (binary units).
std::string FormatBytes(double bytes);

// `dgca plan`: a header line, then a table (name, value, source, reason) of
// every decision, the environment, the predictions (step time, comm share,
// memory, samples/s, against one rank alone), the trials and the warnings.
std::string FormatPlan(const v1::Plan& plan);

}  // namespace dgca

#endif  // DGCA_PLANNER_PLANNER_H_
