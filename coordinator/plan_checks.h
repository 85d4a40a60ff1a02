// The plan checked against what the job measured, as pure functions of
// step samples (the scheduler calls them; coordinator/scheduler.h):
//  - the live check, once, as soon as a running job has enough
//    steady-state rank-steps: measured step time against the prediction,
//    exposed communication against the target, the limiting stage as
//    `dgca diagnose` reads it, memory above its target (a "plan" event);
//  - the review at the end of a job: medians of its steps against the plan
//    (Job.plan_check, a "plan" event), and the measurements later plans of
//    the same model on the same nodes learn from (compute per micro-step,
//    peak memory), which RecordReview stores.
//
// Thread-safety: pure functions, except RecordReview (the job store is
// thread-safe).
#ifndef DGCA_COORDINATOR_PLAN_CHECKS_H_
#define DGCA_COORDINATOR_PLAN_CHECKS_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/job_store.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/metrics.pb.h"
#include "dgca/v1/plan.pb.h"
#include "planner/diagnosis.h"

namespace dgca {

// Fewer steady-state rank-steps than this make no check and no diagnosis.
inline constexpr size_t kMinStepSamples = 5;

// One rank's step as the plan check keeps it.
StepSample SampleOf(const v1::StepMetrics& m);

// Medians over rank-steps: seconds per optimizer step, exposed
// communication share, all-reduce seconds, compute per micro-step (the step
// less its data wait and exposed communication, over `accumulation`).
struct StepMedians {
  double step = 0, comm_share = 0, allreduce = 0, compute = 0;
};
StepMedians MediansOf(const std::vector<StepSample>& samples, int accumulation);

// (predicted - measured) / measured; 0 when nothing was measured.
double RelativeError(double predicted, double measured);

// Whether the live check is due: at least max(40, 10 x ranks) steady-state
// rank-steps (capped at the ring's size) covering at least 10 s of step time
// per rank, or a full ring. The first second of a job is not its steady
// state (the quickstart's 30 ms steps gave 40 rank-steps in 0.6 s, whose
// median named a +10% straggler that the whole run's put at +2%).
bool LiveCheckDue(size_t samples, double step_seconds_seen, int ranks);

// The live check's event text ("live check (median of N rank-steps): step
// ... vs ... predicted (+x%); exposed communication ...; limiting stage:
// ..."); "" when the samples give no step time.
std::string LiveCheckText(const std::string& job_id, const v1::JobSpec& spec,
                          const v1::Plan& plan, const std::vector<StepSample>& samples);

// The review of a finished job.
struct PlanReview {
  v1::PlanCheck check;  // samples == 0: too few samples, nothing reviewed
  std::string text;     // the "plan" event, before what RecordReview adds
  // Compute per micro-step for later plans: a successful job's, or any job
  // with at least 4 x kMinStepSamples rank-steps (a cancelled or failed
  // job's steps are still real steps).
  std::optional<StepMeasurement> step;
  // Its peak memory, unless the job failed (one that ran out of memory died
  // before its peak was reported) or its ranks ran both attention kernels.
  std::optional<MemoryMeasurement> memory;
  std::string memory_not_stored;  // why a peak was seen but is not stored
  // What the compute reached of the compute prior's ideal on the plan's
  // device class (when the plan had a prior to compare with).
  std::optional<EfficiencyMeasurement> efficiency;
  std::string kept_attention;     // "fused"/"gemm" an "auto" plan's ranks kept
};
PlanReview ReviewPlan(const std::string& job_id, const v1::JobSpec& spec, const v1::Plan& plan,
                      const std::vector<StepSample>& samples, const std::string& node_set,
                      v1::JobState final_state, const std::string& attention_kernels,
                      bool attention_mixed, int64_t now_unix_ms);

// Stores the review's measurements and returns the event text with what was
// stored (or why not).
std::string RecordReview(JobStore* store, const PlanReview& review);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_PLAN_CHECKS_H_
