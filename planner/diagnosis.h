// Diagnosis: a job's measured steps -> where its step time goes and the one
// stage that limits its throughput, with the fix (`dgca diagnose JOB`,
// DiagnoseJobResponse in coordinator.proto). The planner predicts a step
// before the job runs; this reads the step the ranks measured.
//
// Stages, each a DiagnoseFinding with the numbers behind it:
//   data       the ranks waited for the loader: above kDataWaitLimit of the
//              step the trainer is starved (fix: loader threads, prefetch);
//   comm       all-reduce time not hidden behind the backward: above
//              kTargetCommShare (fix: the global batch that meets it, a
//              measured link);
//   straggler  one rank's compute more than kStragglerLimit above the
//              others' median: every other rank waits for it at each all-reduce, and
//              that wait shows up as their exposed communication (fix: look
//              at that rank's node);
//   compute    what is left: forward, backward, optimizer. Limiting when no
//              other stage is past its threshold; the healthy state.
// The job's figures are its critical rank's (StepBreakdown in job.proto):
// the rank that spends longest before the all-reduce, which the others wait
// for. Its exposed time is the link's alone, while the others' includes the
// wait; so one rank with a slow loader reads as data, not as communication,
// and a straggler's wait is not blamed on the link. Each fix says about how
// many samples/s it would gain. The limiting stage is the costliest one past
// its threshold by more than kNearLimitBand.
//
// Thread-safety: pure functions; safe from any thread.
#ifndef DGCA_PLANNER_DIAGNOSIS_H_
#define DGCA_PLANNER_DIAGNOSIS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dgca/v1/coordinator.pb.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/plan.pb.h"

namespace dgca {

// One optimizer step of one rank, as the rank reported it (StepMetrics).
struct StepSample {
  int rank = 0;
  double step_seconds = 0;
  double data_wait_seconds = 0;
  double exposed_seconds = 0;    // all-reduce not overlapped with compute
  double allreduce_seconds = 0;  // every all-reduce of the step
  // StepMetrics' memory readings; -1 = not reported.
  double gpu_memory_bytes = -1;        // the GPU's used memory (CUDA ranks)
  double host_memory_peak_bytes = -1;  // the process's peak resident set
};

// Data wait above this share of the step: the loader starves the trainer.
inline constexpr double kDataWaitLimit = 0.05;
// A rank whose compute is this much above the other ranks' median straggles.
inline constexpr double kStragglerLimit = 0.10;
// A stage past its limit by at most this share of the limit (comm at 10% to
// 12%, data at 5% to 6%, a straggler at +10% to +12%) is near it: named,
// with its fix, but not taken as the limiting stage. Run-to-run spread is
// that large (the quickstart's exposed communication measures 8.6% to 11%
// from one run to the next), and a verdict that flips between runs of the
// same job says more about the noise than about the job.
inline constexpr double kNearLimitBand = 0.20;

// Median of `v` (the mean of the middle two for an even count); 0 if empty.
double MedianOf(std::vector<double> v);

// Medians over each rank's `samples` (those with step_seconds > 0); node
// names from plan.rank_nodes; the job's figures and critical_rank from the
// rank with the largest data wait + compute (ties: the lowest rank).
// compute = step - data wait - exposed communication (never below 0), so
// the parts add up to the step. Each rank's peak_memory_bytes is the largest
// of its samples' GPU memory (plan.device "cuda") or peak resident set.
v1::StepBreakdown BreakdownOf(const std::vector<StepSample>& samples, const v1::Plan& plan);

// The smallest global batch, in whole micro-batches on every rank, at which
// exposed communication would be at most kTargetCommShare of the step, given
// the share `comm_share` measured at the plan's global batch (exposed time
// per step is fixed by the gradients; compute grows with the samples per
// step). The plan's global batch itself when the share is already at target;
// 0 when comm_share >= 1 (no global batch helps).
int64_t GlobalBatchForCommTarget(const v1::Plan& plan, double comm_share);

// " (comm is near its limit)", " (data and comm are near its limit)" for
// the stages marked near_limit; "" for none.
std::string NearLimitNote(const std::vector<std::string>& stages);

// Memory beside the stages (MemoryFinding): the rank that held the most
// (RankStepMedians.peak_memory_bytes) against the plan's prediction and the
// target its micro-batch was sized to. The memory at another micro-batch m'
// is scaled from the measured peak P at the plan's m: P + a (m' - m). The
// measured a = (P - model state) / m is the peak's excess over the memory
// model's state (weights, gradients, AdamW; predicted_memory_bytes -
// m x predicted_activation_bytes_per_sample) per sample; it includes fixed
// overheads (a CPU rank's loader and runtime, NCCL's buffers), so a smaller
// micro-batch saves less than it says: scaling down takes the smaller of it
// and the plan's activations per sample (the memory model's, or an earlier
// job's measurement), scaling up the larger (the plan's alone when P is not
// above the state). The fix: above the target, the
// largest smaller micro-batch that would be under it; under it with
// accumulation, the largest micro-batch (a divisor of the rank's samples per
// step) that would still be under it, when larger than the plan's.
v1::MemoryFinding DiagnoseMemory(const v1::Plan& plan, const v1::StepBreakdown& breakdown);

// Fills out->findings (data, compute, comm, straggler; a single-rank job has
// no straggler finding), out->limiting_stage and out->memory from the job's
// plan, spec and breakdown. INVALID_ARGUMENT when the breakdown has no step
// time.
absl::Status DiagnoseSteps(const v1::Plan& plan, const v1::JobSpec& spec,
                           const v1::StepBreakdown& breakdown, v1::DiagnoseJobResponse* out);

}  // namespace dgca

#endif  // DGCA_PLANNER_DIAGNOSIS_H_
