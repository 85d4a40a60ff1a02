// Planning with what earlier jobs measured: the job store's all-reduce
// sweeps (`dgca diagnose comm`), compute times per micro-batch, peak memory
// and in-job all-reduce skew on the same node set and model are turned
// into PlannerMeasurements (planner/measurements.h), and the plan is made
// again with them; its reasons then cite where each figure came from.
//
// The keys under which measurements are filed say what they depend on, so
// a measurement is only reused where it holds.
//
// Thread-safety: thread-safe (the job store is).
#ifndef DGCA_COORDINATOR_MEASURED_PLANNING_H_
#define DGCA_COORDINATOR_MEASURED_PLANNING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_store.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/plan.pb.h"
#include "dgca/v1/topology.pb.h"
#include "planner/planner.h"

namespace dgca {

// What a compute-time measurement depends on besides the micro-batch: node
// set, device, ranks, threads per rank, precision, sequence length, MFT and
// the model (init_from excluded; dropout as trained: unset is the default,
// none keys as specs from before model.dropout did). Jobs with equal keys
// share c(m).
std::string StepKey(const v1::JobSpec& spec, const v1::Plan& plan, const std::string& node_set);

// What a memory measurement depends on: StepKey and the attention kernels
// (the GEMM version keeps [heads, L, L] probabilities per sample). `kept`:
// the kernels an "auto" plan's ranks reported running ("" when planning, or
// not reported): "auto" keys as "fused" when planning (which one a plan
// says depends on its micro-batch, which this measurement changes), and a
// finished "auto" job's peak is stored under the kernels its ranks ran.
std::string MemoryKey(const v1::JobSpec& spec, const v1::Plan& plan, const std::string& node_set,
                      const std::string& kept = "");

// "node_set|backend|ranks": the all-reduce measurements' key.
std::string CommKey(const std::string& node_set, const v1::Plan& plan);

// Plans `spec` on `topo`, then, when the store holds measurements for the
// plan's node set (all-reduce sweeps and skews for its backend and ranks,
// compute and memory of the same StepKey), plans again with them. With
// `trials` (tuning.mode trial) the final plan times its candidates through
// it. A failing second plan leaves the first. `node_set` names the node set
// the measurements are filed under; "" = the plan's own nodes (a Slurm job
// files them under its partition: coordinator/job_runtime.h SlurmNodeSet).
// `step_measured` (optional) is set to whether the plan's step time comes
// from earlier jobs' measured compute rather than the cost model alone.
// `base`: what both plans start from (the operator's overrides,
// PlannerMeasurements.link_prior_busbw).
absl::StatusOr<v1::Plan> PlanMeasured(JobStore* store, const v1::JobSpec& spec,
                                      const std::vector<v1::Topology>& topo,
                                      TrialRunner* trials = nullptr,
                                      const std::string& node_set = "",
                                      bool* step_measured = nullptr,
                                      const PlannerMeasurements& base = {});

}  // namespace dgca

#endif  // DGCA_COORDINATOR_MEASURED_PLANNING_H_
