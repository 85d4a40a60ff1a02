// Placement: where the ranks of a plan run (node and GPU per rank), or why
// they cannot yet. The scheduler asks before every launch (a first
// attempt, a restart, a tuning trial) and launches only a complete
// placement.
//
// AgentPlacement places on the agents connected to this coordinator (the
// `local` launcher: agents started by hand or by the embedded agent). A
// cluster scheduler's launcher (Slurm) implements the same interface over
// the agents of the job's own allocation.
//
// Thread-safety: Place() reads state the scheduler guards with its mutex;
// call it with that mutex held.
#ifndef DGCA_COORDINATOR_PLACEMENT_H_
#define DGCA_COORDINATOR_PLACEMENT_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/job_runtime.h"
#include "coordinator/node_registry.h"
#include "dgca/v1/plan.pb.h"

namespace dgca {

// (node, GPU) pairs.
using DeviceSet = std::set<std::pair<std::string, int>>;

struct RankSlot {
  std::string node;
  int local_device = -1;  // -1: a CPU rank
};

class Placement {
 public:
  virtual ~Placement() = default;
  // One slot per rank of `plan`, none of them on a GPU in `busy`; or false
  // and *why ("waiting for capacity: ...").
  virtual bool Place(const v1::Plan& plan, const DeviceSet& busy, std::vector<RankSlot>* slots,
                     std::string* why) const = 0;
};

// Rank r on plan.rank_nodes(r) (the first connected node when the plan
// names none), GPU plan.rank_local_devices(r) for CUDA plans. Waits while a
// named node is not connected or a GPU is busy.
class AgentPlacement : public Placement {
 public:
  explicit AgentPlacement(const NodeRegistry* nodes) : nodes_(nodes) {}
  bool Place(const v1::Plan& plan, const DeviceSet& busy, std::vector<RankSlot>* slots,
             std::string* why) const override;

 private:
  const NodeRegistry* nodes_;
};

// The Slurm launcher's (docs/slurm.md): rank r on plan.rank_nodes(r),
// which must be an agent bound to `job` in the allocation `allocation_id`
// (the plan is made on those agents' topologies). Waits while one is not
// connected.
class BoundAgentPlacement : public Placement {
 public:
  BoundAgentPlacement(const NodeRegistry* nodes, std::string job, std::string allocation_id)
      : nodes_(nodes), job_(std::move(job)), allocation_id_(std::move(allocation_id)) {}
  bool Place(const v1::Plan& plan, const DeviceSet& busy, std::vector<RankSlot>* slots,
             std::string* why) const override;

 private:
  const NodeRegistry* nodes_;
  std::string job_;
  std::string allocation_id_;
};

// GPUs held by the jobs in `jobs` other than `except`: by running jobs, and
// by jobs timing tuning trials (from their first trial to their launch, so
// no other job takes them in between).
DeviceSet BusyDevices(const std::map<std::string, std::unique_ptr<JobRt>>& jobs,
                      const JobRt* except);

// What the CPU ranks of other jobs hold on one node: threads (ranks x the
// plan's threads_per_rank) and host memory (ranks x the plan's predicted
// bytes per rank), and which jobs.
struct CpuLoad {
  int threads = 0;
  double memory_bytes = 0;
  std::set<std::string> jobs;
};

// The CPU load per node of the jobs in `jobs` other than `except`: running
// jobs' ranks that have not exited, and the ranks of tuning trials from the
// first trial to the launch. GPU ranks are not counted (their CPU threads
// feed a GPU; GPUs are what BusyDevices guards).
std::map<std::string, CpuLoad> CpuLoads(const std::map<std::string, std::unique_ptr<JobRt>>& jobs,
                                        const JobRt* except);

// Admission of a CPU plan placed on `slots`: true when, on every node, its
// ranks' threads fit in the node's CPUs (the cgroup limit when lower) beside
// `loads`, and their predicted memory in 90% of its memory (the cgroup
// limit when lower). A node no other CPU job uses admits any plan: a job
// bigger than the node runs alone, as its plan warned, rather than never.
// Otherwise false and *why ("waiting for capacity: node ... ").
bool CpuPlanFits(const v1::Plan& plan, const std::vector<RankSlot>& slots,
                 const std::map<std::string, CpuLoad>& loads, const NodeRegistry& nodes,
                 std::string* why);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_PLACEMENT_H_
