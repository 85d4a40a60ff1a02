#include "coordinator/placement.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/units.h"

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

std::map<std::string, CpuLoad> CpuLoads(const std::map<std::string, std::unique_ptr<JobRt>>& jobs,
                                        const JobRt* except) {
  std::map<std::string, CpuLoad> out;
  auto add = [&](const std::string& node, const v1::Plan& plan, const std::string& job) {
    CpuLoad& l = out[node];
    l.threads += std::max(1, plan.threads_per_rank());
    l.memory_bytes += std::max(0.0, plan.predicted_memory_bytes());
    l.jobs.insert(job);
  };
  for (const auto& [id, other] : jobs) {
    if (other.get() == except) continue;
    if (other->state == v1::RUNNING) {
      if (other->plan.device() != "cpu") continue;
      for (const auto& r : other->ranks) {
        if (!r.exited && r.local_device < 0) add(r.node, other->plan, id);
      }
    } else if (other->trials && !other->trials->done && other->trials->plan.device() == "cpu") {
      for (const auto& r : other->trials->placement) add(r.first, other->trials->plan, id);
    }
  }
  return out;
}

bool CpuPlanFits(const v1::Plan& plan, const std::vector<RankSlot>& slots,
                 const std::map<std::string, CpuLoad>& loads, const NodeRegistry& nodes,
                 std::string* why) {
  if (plan.device() != "cpu") return true;
  std::map<std::string, int> ranks_on;
  for (const RankSlot& s : slots) ++ranks_on[s.node];
  const int threads = std::max(1, plan.threads_per_rank());
  const double memory = std::max(0.0, plan.predicted_memory_bytes());
  for (const auto& [node, ranks] : ranks_on) {
    auto it = loads.find(node);
    if (it == loads.end() || it->second.jobs.empty()) continue;  // alone on the node
    const CpuLoad& used = it->second;
    const Node* n = nodes.Find(node);
    if (n == nullptr) continue;  // Place checked it is connected
    const v1::Topology& t = n->topology;
    int cpus = t.cpu_count();
    if (t.cgroup_cpu_limit() > 0) {
      cpus = std::min(cpus, std::max(1, static_cast<int>(std::floor(t.cgroup_cpu_limit()))));
    }
    double mem = static_cast<double>(t.memory_bytes());
    if (t.cgroup_memory_limit_bytes() > 0 && (mem <= 0 || t.cgroup_memory_limit_bytes() < mem)) {
      mem = static_cast<double>(t.cgroup_memory_limit_bytes());
    }
    const std::string others = absl::StrJoin(used.jobs, ", ");
    if (cpus > 0 && used.threads + ranks * threads > cpus) {
      *why = absl::StrFormat(
          "waiting for capacity: node %s has %d CPUs; job%s %s hold%s %d thread%s, and this "
          "job's %d rank%s there need %d more (%d x %d threads per rank)",
          node, cpus, used.jobs.size() > 1 ? "s" : "", others, used.jobs.size() > 1 ? "" : "s",
          used.threads, used.threads == 1 ? "" : "s", ranks, ranks == 1 ? "" : "s",
          ranks * threads, ranks, threads);
      return false;
    }
    if (mem > 0 && memory > 0 && used.memory_bytes + ranks * memory > 0.9 * mem) {
      *why = absl::StrFormat(
          "waiting for capacity: node %s has %s of memory (90%% usable by ranks); job%s %s %s "
          "predicted to hold %s, and this job's %d rank%s there %s more",
          node, FormatBytes(mem), used.jobs.size() > 1 ? "s" : "", others,
          used.jobs.size() > 1 ? "are" : "is",
          FormatBytes(used.memory_bytes), ranks, ranks == 1 ? "" : "s",
          FormatBytes(ranks * memory));
      return false;
    }
  }
  return true;
}

}  // namespace dgca
