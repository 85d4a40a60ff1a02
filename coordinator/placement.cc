#include "coordinator/placement.h"

#include "absl/strings/str_cat.h"

namespace dgca {
namespace {

// Rank `r` on `node` with GPU `dev` (-1 = CPU), unless another job holds
// that GPU.
bool TakeSlot(const std::string& node, int dev, int r, const DeviceSet& busy,
              std::vector<RankSlot>* slots, std::string* why) {
  if (dev >= 0 && busy.count({node, dev})) {
    *why = absl::StrCat("waiting for capacity: GPU ", dev, " on node ", node,
                        " is used by another job");
    return false;
  }
  (*slots)[r].node = node;
  (*slots)[r].local_device = dev;
  return true;
}

// Why ranks cannot be placed on `n` now (!n.Available()).
std::string Unavailable(const Node& n) {
  if (n.conn == nullptr) return "is not connected";
  if (n.leaving) return "is leaving (its agent is stopping)";
  return "is silent (its agent sent no heartbeat within --agent-timeout: frozen or hung)";
}

}  // namespace

bool AgentPlacement::Place(const v1::Plan& plan, const DeviceSet& busy,
                           std::vector<RankSlot>* slots, std::string* why) const {
  const int world = plan.ranks();
  const std::string first = nodes_->FirstConnected();
  slots->assign(world, RankSlot());
  for (int r = 0; r < world; ++r) {
    const std::string node =
        r < plan.rank_nodes_size() && !plan.rank_nodes(r).empty() ? plan.rank_nodes(r) : first;
    const Node* n = nodes_->Find(node);
    if (n == nullptr || !n->Available()) {
      *why = absl::StrCat("waiting for capacity: node ", node, " (rank ", r, ") ",
                          n == nullptr ? "is not connected" : Unavailable(*n));
      return false;
    }
    if (!TakeSlot(node, PlannedDevice(plan, r), r, busy, slots, why)) return false;
  }
  return true;
}

bool BoundAgentPlacement::Place(const v1::Plan& plan, const DeviceSet& busy,
                                std::vector<RankSlot>* slots, std::string* why) const {
  slots->assign(plan.ranks(), RankSlot());
  for (int r = 0; r < plan.ranks(); ++r) {
    const std::string node = r < plan.rank_nodes_size() ? plan.rank_nodes(r) : "";
    const Node* n = nodes_->Find(node);
    if (n == nullptr || !n->Available() || n->bound_job != job_ ||
        n->allocation_id != allocation_id_) {
      *why = absl::StrCat("waiting for capacity: the agent on node ", node.empty() ? "?" : node,
                          " (rank ", r, ") of Slurm job ", allocation_id_, " ",
                          n == nullptr || n->bound_job != job_ || n->allocation_id != allocation_id_
                              ? "is not connected"
                              : Unavailable(*n));
      return false;
    }
    if (!TakeSlot(node, PlannedDevice(plan, r), r, busy, slots, why)) return false;
  }
  return true;
}

DeviceSet BusyDevices(const std::map<std::string, std::unique_ptr<JobRt>>& jobs,
                      const JobRt* except) {
  DeviceSet busy;
  for (const auto& [id, other] : jobs) {
    if (other.get() == except) continue;
    if (other->state == v1::RUNNING) {
      for (const auto& r : other->ranks) {
        if (r.local_device >= 0) busy.insert({r.node, r.local_device});
      }
    } else if (other->trials && !other->trials->done) {
      for (const auto& r : other->trials->placement) {
        if (r.second >= 0) busy.insert(r);
      }
    }
  }
  return busy;
}

}  // namespace dgca
