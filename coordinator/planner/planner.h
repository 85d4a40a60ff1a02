// Planner (the tuner): turns a job spec, the nodes' topology reports and
// measurements into a Plan in which every resolved value carries a one-line
// reason (DESIGN.md "Planner"). Values the user set win, and the plan says so.
//
// Thread-safety: pure functions; safe from any thread.
#ifndef DGCA_COORDINATOR_PLANNER_PLANNER_H_
#define DGCA_COORDINATOR_PLANNER_PLANNER_H_

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
};

// Plans `spec` on `nodes` (at least one). Never fails for a valid spec: facts
// the topology lacks are reported in Plan.warnings and the decisions' reasons.
absl::StatusOr<v1::Plan> MakePlan(const v1::JobSpec& spec,
                                  const std::vector<v1::Topology>& nodes,
                                  const PlannerMeasurements& measurements);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_PLANNER_PLANNER_H_
