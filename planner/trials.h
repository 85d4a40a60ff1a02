// Tuning trials (`tuning.mode: trial`, or `auto` when a runner is given):
// the caller supplies a runner that times a candidate plan on the real
// ranks (the coordinator runs each as a short attempt of the job,
// coordinator/scheduler_trials.cc). RunTrials ranks candidates around the
// model's choice by predicted throughput, times the best few (at most
// kMaxTrials, within spec.tuning.budget_s) and keeps the fastest measured
// one; every trial is logged in Plan.trials with its score.
#ifndef DGCA_PLANNER_TRIALS_H_
#define DGCA_PLANNER_TRIALS_H_

#include "absl/status/statusor.h"
#include "dgca/v1/plan.pb.h"

namespace dgca {

inline constexpr int kMaxTrials = 3;

class TrialRunner {
 public:
  virtual ~TrialRunner() = default;
  // Runs a few optimizer steps of `candidate` (ranks, micro_batch,
  // accumulation, bucket_mb, precision, env as in the plan) and returns the
  // measured seconds per optimizer step. `budget_s` is what is left of the
  // tuning budget; a runner that cannot fit in it returns an error
  // (RESOURCE_EXHAUSTED when it did not start it: the trial is noted
  // "skipped", not "failed").
  virtual absl::StatusOr<double> TimeStep(const v1::Plan& candidate, double budget_s) = 0;
};

}  // namespace dgca

#endif  // DGCA_PLANNER_TRIALS_H_
