#include "coordinator/node_registry.h"

#include <utility>

namespace dgca {

bool AgentConnection::Send(const v1::CoordinatorCommand& cmd) {
  absl::MutexLock l(&mu_);
  if (!open_) return false;
  return write_(cmd);
}

void AgentConnection::Close() {
  absl::MutexLock l(&mu_);
  open_ = false;
}

void NodeRegistry::Register(const v1::RegisterAgent& reg, const std::string& peer,
                            std::shared_ptr<AgentConnection> conn, Clock::TimePoint now) {
  Node& n = nodes_[reg.node()];
  if (n.conn && n.conn != conn) n.conn->Close();  // a reconnect replaces the old stream
  n.name = reg.node();
  n.address = peer;
  n.topology = reg.topology();
  n.conn = std::move(conn);
  n.last_heartbeat = now;
  n.bound_job = reg.bound_job();
  n.allocation_id = reg.allocation_id();
  n.leaving = false;
  n.silent = false;
}

bool NodeRegistry::Heartbeat(const std::string& node, Clock::TimePoint now) {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return false;
  it->second.last_heartbeat = now;
  const bool was = it->second.silent;
  it->second.silent = false;
  return was;
}

void NodeRegistry::Excuse(std::chrono::steady_clock::duration gap) {
  for (auto& [name, n] : nodes_) n.last_heartbeat += gap;
}

std::vector<std::string> NodeRegistry::MarkSilent(Clock::TimePoint now, double timeout_s) {
  std::vector<std::string> out;
  for (auto& [name, n] : nodes_) {
    if (!n.conn || n.silent || SecondsBetween(n.last_heartbeat, now) <= timeout_s) continue;
    n.silent = true;
    out.push_back(name);
  }
  return out;
}

bool NodeRegistry::Disconnect(const std::string& node,
                              const std::shared_ptr<AgentConnection>& conn) {
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.conn != conn) return false;
  it->second.conn.reset();
  return true;
}

bool NodeRegistry::MarkLeaving(const std::string& node,
                               const std::shared_ptr<AgentConnection>& conn) {
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.conn != conn) return false;
  it->second.leaving = true;
  return true;
}

const Node* NodeRegistry::Find(const std::string& node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::shared_ptr<AgentConnection> NodeRegistry::ConnectionOf(const std::string& node) const {
  const Node* n = Find(node);
  return n ? n->conn : nullptr;
}

std::string NodeRegistry::FirstConnected() const {
  for (const auto& [name, n] : nodes_) {
    if (n.Available() && n.bound_job.empty()) return name;
  }
  return "";
}

std::vector<v1::Topology> NodeRegistry::ConnectedTopologies() const {
  std::vector<v1::Topology> out;
  for (const auto& [name, n] : nodes_) {
    if (!n.Available() || !n.bound_job.empty()) continue;
    v1::Topology t = n.topology;
    t.set_node(name);  // placement (plan.rank_nodes) uses registered names
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<v1::Topology> NodeRegistry::BoundTopologies(const std::string& job,
                                                        const std::string& allocation_id) const {
  std::vector<v1::Topology> out;
  for (const auto& [name, n] : nodes_) {
    if (!n.Available() || n.bound_job != job || n.allocation_id != allocation_id) continue;
    v1::Topology t = n.topology;
    t.set_node(name);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<std::string> NodeRegistry::BoundNodes(const std::string& job) const {
  std::vector<std::string> out;
  for (const auto& [name, n] : nodes_) {
    if (n.conn && n.bound_job == job) out.push_back(name);
  }
  return out;
}

void NodeRegistry::Erase(const std::string& node) {
  nodes_.erase(node);
  orphans_.erase(node);
}

void NodeRegistry::AddOrphan(const std::string& node, const v1::RunningRank& rank) {
  orphans_[node].push_back(rank);
}

std::vector<v1::RunningRank> NodeRegistry::TakeOrphans(const std::string& node) {
  auto it = orphans_.find(node);
  if (it == orphans_.end()) return {};
  std::vector<v1::RunningRank> out = std::move(it->second);
  orphans_.erase(it);
  return out;
}

}  // namespace dgca
