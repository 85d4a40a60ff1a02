#include "coordinator/placement.h"

#include "absl/strings/str_cat.h"

namespace dgca {

bool AgentPlacement::Place(const v1::Plan& plan, const DeviceSet& busy,
                           std::vector<RankSlot>* slots, std::string* why) const {
  const int world = plan.ranks();
  const std::string first = nodes_->FirstConnected();
  slots->assign(world, RankSlot());
  for (int r = 0; r < world; ++r) {
    const std::string node =
        r < plan.rank_nodes_size() && !plan.rank_nodes(r).empty() ? plan.rank_nodes(r) : first;
    const int dev = PlannedDevice(plan, r);
    if (!nodes_->Connected(node)) {
      *why = absl::StrCat("waiting for capacity: node ", node, " (rank ", r, ") is not connected");
      return false;
    }
    if (dev >= 0 && busy.count({node, dev})) {
      *why = absl::StrCat("waiting for capacity: GPU ", dev, " on node ", node,
                          " is used by another job");
      return false;
    }
    (*slots)[r].node = node;
    (*slots)[r].local_device = dev;
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
