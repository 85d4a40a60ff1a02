// The planner (the tuner): turns a job spec, the nodes' topology reports
// and measurements into a Plan in which every resolved value carries a
// one-line reason (docs/planner.md). Values the user set win, and the plan
// says so.
//
// Where things live:
//   planner/cost_model.h   the step-time formulas (c(m), C, exposed, step)
//   planner/compute_prior.h c(m) before anything was measured
//   planner/link_model.h   the all-reduce time: topology prior, measurements
//   planner/fits.h         least-squares fits of measurements
//   planner/decisions.h    each decision, in the order MakePlan takes them
//   planner/trials.h       tuning trials on the real ranks
//   planner/plan_format.h  the text of `dgca plan`
//   planner/diagnosis.h    `dgca diagnose`: measured steps against the plan
//
// Thread-safety: pure functions; safe from any thread. A TrialRunner is
// called from the calling thread only.
#ifndef DGCA_PLANNER_PLANNER_H_
#define DGCA_PLANNER_PLANNER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/plan.pb.h"
#include "dgca/v1/topology.pb.h"
#include "planner/cost_model.h"
#include "planner/measurements.h"
#include "planner/trials.h"
#include "planner/units.h"

namespace dgca {

// Plans `spec` on `nodes` (at least one: FAILED_PRECONDITION otherwise).
// Never fails for a valid spec that can run: facts the topology lacks are
// reported in Plan.warnings and the decisions' reasons. INVALID_ARGUMENT
// for a rank count that cannot work (planner/decisions.h DecideRanks).
// `trials` (may be null) times candidates when the tuning mode asks for
// trials; its errors are logged as failed trials, never returned.
absl::StatusOr<v1::Plan> MakePlan(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                                  const PlannerMeasurements& measurements,
                                  TrialRunner* trials = nullptr);

}  // namespace dgca

#endif  // DGCA_PLANNER_PLANNER_H_
