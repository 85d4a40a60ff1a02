// LocalTrialRunner: the worker side of `tuning.mode: trial` (planner.h
// TrialRunner) for one node: times a candidate plan by really training it for
// a few optimizer steps in this process — candidate.ranks() threads, each a
// rank with its own Gloo communicator over a FileStore in a fresh temporary
// directory (a world of one uses the local communicator) — with the
// candidate's micro_batch, accumulation, bucket_mb and threads_per_rank.
//
// Score: the mean step_seconds of rank 0 over the timed steps (the first
// `warmup_steps` are not timed: they pay allocation and first-touch costs).
// No evaluation and no checkpoints are run. A trial that would not fit the
// remaining budget is stopped (StopRequested) and reported as
// DEADLINE_EXCEEDED; training errors come back as the trainer's status.
//
// Thread-safety: TimeStep from one thread at a time (MakePlan's).
#ifndef DGCA_WORKER_RANK_TRIAL_RUNNER_H_
#define DGCA_WORKER_RANK_TRIAL_RUNNER_H_

#include <string>

#include "planner/planner.h"
#include "dgca/v1/job.pb.h"

namespace dgca {

struct LocalTrialOptions {
  int warmup_steps = 1;
  int timed_steps = 2;
  double comm_timeout_s = 60;
  // Progress lines ("trial: ranks 2, micro 8 x 2 ...: 0.41 s/step"); may be null.
  void (*log)(const std::string& line) = nullptr;
};

class LocalTrialRunner : public TrialRunner {
 public:
  // `spec`: the job (data paths resolve against spec.base_dir()).
  LocalTrialRunner(v1::JobSpec spec, LocalTrialOptions options = LocalTrialOptions());
  absl::StatusOr<double> TimeStep(const v1::Plan& candidate, double budget_s) override;

 private:
  v1::JobSpec spec_;
  LocalTrialOptions options_;
};

}  // namespace dgca

#endif  // DGCA_WORKER_RANK_TRIAL_RUNNER_H_
