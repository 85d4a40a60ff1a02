// The re-plan of a running job: once, when the live check (coordinator/
// plan_checks.h) finds the measured step off the plan's prediction by more
// than kReplanStepMargin, or the exposed communication off by more than
// kReplanShareMargin of the step, and the plan's tuning mode is auto. The
// planner is asked again with what this job measured (compute per
// micro-step at its micro-batch; the link from its all-reduce per step) in
// place of the priors, the rank count, device, precision and threads held
// (never the global batch or the learning rate: the spec keeps them). If
// the new plan runs differently (micro-batch, accumulation, bucket), the
// scheduler moves the job to it at a checkpoint (coordinator/
// scheduler_replan.cc); if not, only its predictions change.
//
// Thread-safety: pure functions; safe from any thread.
#ifndef DGCA_COORDINATOR_REPLAN_H_
#define DGCA_COORDINATOR_REPLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/plan.pb.h"
#include "dgca/v1/topology.pb.h"
#include "planner/diagnosis.h"
#include "planner/measurements.h"

namespace dgca {

inline constexpr double kReplanStepMargin = 0.25;
inline constexpr double kReplanShareMargin = 0.05;

// Why `plan` should be made again from the job's `samples` ("" when it
// holds, or cannot be re-planned: tuning mode other than auto, no
// prediction to compare, a probe job, too few samples).
std::string ReplanReason(const v1::JobSpec& spec, const v1::Plan& plan,
                         const std::vector<StepSample>& samples);

// The job's own measurements, on top of `base` (the operator's overrides):
// step_seconds at the plan's micro-batch; for several ranks, the link's bus
// bandwidth from the measured all-reduce per step, C = nb x latency + G x f
// / busbw, with the prior's latency for the plan's nb buckets.
PlannerMeasurements MeasurementsOfJob(const v1::JobSpec& spec, const v1::Plan& plan,
                                      const std::vector<v1::Topology>& topo,
                                      const std::vector<StepSample>& samples,
                                      const PlannerMeasurements& base);

// The plan made again with `meas`, holding what a running job cannot change
// (ranks, device, backend, precision, threads).
absl::StatusOr<v1::Plan> Replan(const v1::JobSpec& spec, const v1::Plan& plan,
                                const std::vector<v1::Topology>& topo,
                                const PlannerMeasurements& meas);

// "" when the two plans run the same way; else what changes
// ("micro_batch 8 -> 16, bucket_mb 13 -> 4").
std::string SettingsChange(const v1::Plan& from, const v1::Plan& to);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_REPLAN_H_
