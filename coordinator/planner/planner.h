// Planner (the tuner): turns a job spec, the nodes' topology reports and
// measurements into a Plan in which every resolved value carries a one-line
// reason (DESIGN.md "Planner"). Values the user set win, and the plan says so.
//
// Thread-safety: pure functions; safe from any thread.
#ifndef DGCA_COORDINATOR_PLANNER_PLANNER_H_
#define DGCA_COORDINATOR_PLANNER_PLANNER_H_

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
  // samples on one rank.
  double step_seconds = 0;
  int step_micro_batch = 0;
  // Added by T1: raw points of the all-reduce probe, (bytes, seconds) for one
  // all-reduce among the job's ranks. When allreduce_bus_bandwidth is 0 and
  // there are at least two sizes, bandwidth and latency are fitted from
  // them: t = latency + bytes * 2(n-1)/n / busbw (least squares).
  std::vector<std::pair<double, double>> allreduce_points;
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
  // tuning budget; a runner that cannot fit in it returns an error.
  virtual absl::StatusOr<double> TimeStep(const v1::Plan& candidate,
                                          double budget_s) = 0;
};

inline constexpr int kMaxTrials = 3;

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

// `dgca plan`: a header line, then a table (name, value, source, reason) of
// every decision, the environment, the predictions (step time, comm share,
// memory, samples/s, against one rank alone), the trials and the warnings.
std::string FormatPlan(const v1::Plan& plan);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_PLANNER_PLANNER_H_
