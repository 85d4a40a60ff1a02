// MakePlan: the decisions of planner/decisions.h in order, each given what
// the ones before it settled.
#include "planner/planner.h"

#include "absl/status/status.h"
#include "planner/decisions.h"
#include "planner/plan_builder.h"

namespace dgca {

absl::StatusOr<v1::Plan> MakePlan(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                                  const PlannerMeasurements& meas, TrialRunner* trials) {
  if (nodes.empty())
    return absl::FailedPreconditionError(
        "planner: no node topology to plan on (no worker agent has registered)");
  PlanBuilder b;
  const ModelFacts model = DescribeModel(spec, &b);
  WarnUnknownFacts(nodes, &b);
  const bool cuda = DecideDevice(spec, nodes, &b);
  if (absl::Status st = DecideRanks(spec, nodes, cuda, model.global, &b); !st.ok()) return st;
  DecideBackend(spec, cuda, &b);
  const Precision precision = DecidePrecision(spec, nodes, cuda, &b);
  DecideAttention(spec, model, cuda, precision, &b);
  const MemoryPlan memory = DecideMemory(spec, nodes, model, cuda, precision, meas, &b);
  const BatchPlan batch = DecideBatch(spec, nodes, model, cuda, precision, memory, meas, &b);
  DecideThreads(spec, nodes, cuda, &b);
  DecideEnv(spec, nodes, cuda, &b);
  DecideByTrials(spec, model, cuda, memory, batch, trials, &b);
  DecideAttentionTimed(spec, model, cuda, precision, memory, meas, &b);
  return b.plan();
}

}  // namespace dgca
