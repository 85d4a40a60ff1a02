// tuning.mode trial as the scheduler runs it: each candidate of the planner
// is a short attempt of the job itself on its ranks (TrialSpec), timed after
// a warm-up; coordinator/scheduler_trials.cc launches and supervises them.
//
// Thread-safety: pure functions.
#ifndef DGCA_COORDINATOR_TUNING_TRIALS_H_
#define DGCA_COORDINATOR_TUNING_TRIALS_H_

#include <string>

#include "dgca/v1/job.pb.h"
#include "dgca/v1/plan.pb.h"

namespace dgca {

// A trial runs kTrialWarmupSteps + kTrialTimedSteps optimizer steps; the
// first (allocation, first touch, loader warm-up) are not timed.
inline constexpr int kTrialWarmupSteps = 2;
inline constexpr int kTrialTimedSteps = 4;

// Whether the job is planned with trials (tuning.mode trial, not a probe).
bool WantsTrials(const v1::JobSpec& spec);

// What a trial's ranks run: the job cut to the trial's steps, with no
// evaluation, no checkpoints and no tuning of its own.
v1::JobSpec TrialSpec(const v1::JobSpec& spec);

// "micro_batch M x accumulation K, bucket B MB": a candidate in events.
std::string CandidateLabel(const v1::Plan& plan);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_TUNING_TRIALS_H_
