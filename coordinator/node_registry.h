// The node agents the coordinator knows: each registered node's address,
// topology report, command stream and last heartbeat, connected or not (a
// node stays listed after its agent disconnects, until `dgca nodes forget`).
// Also the ranks of stopped attempts that never reported their end because
// their node was away ("orphans"): its agent adopts and stops them when it
// registers again.
//
// Thread-safety: AgentConnection is thread-safe. NodeRegistry is plain data:
// the scheduler guards it with its mutex.
#ifndef DGCA_COORDINATOR_NODE_REGISTRY_H_
#define DGCA_COORDINATOR_NODE_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/clock.h"
#include "dgca/v1/agent.pb.h"
#include "dgca/v1/topology.pb.h"

namespace dgca {

// One agent's command stream. Send() is safe from any thread until Close().
class AgentConnection {
 public:
  using Writer = std::function<bool(const v1::CoordinatorCommand&)>;
  explicit AgentConnection(Writer w) : write_(std::move(w)) {}
  // False when the stream is closed or the write failed.
  bool Send(const v1::CoordinatorCommand& cmd);
  void Close();

 private:
  absl::Mutex mu_;
  Writer write_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = true;
};

struct Node {
  std::string name;
  std::string address;
  v1::Topology topology;
  std::shared_ptr<AgentConnection> conn;  // null while disconnected
  Clock::TimePoint last_heartbeat;
  // An agent a cluster scheduler started for one job (RegisterAgent
  // .bound_job), in the allocation `allocation_id`; "" for shared agents.
  std::string bound_job;
  std::string allocation_id;
  // The agent said it is stopping (AgentLeaving): no rank is placed on it
  // until it registers again, though its stream still carries the exits of
  // the ranks it stops.
  bool leaving = false;
  // Connected, yet no heartbeat for longer than the scheduler's timeout (a
  // frozen agent: SIGSTOP, a hung host): nothing is placed on it until it is
  // heard again (MarkSilent, Heartbeat).
  bool silent = false;
  // Connected, heard from and not leaving: ranks may be placed on it.
  bool Available() const { return conn != nullptr && !leaving && !silent; }
  // "connected", "silent", "leaving" or "disconnected".
  const char* State() const {
    return conn == nullptr ? "disconnected" : leaving ? "leaving" : silent ? "silent" : "connected";
  }
};

class NodeRegistry {
 public:
  // Records a registration; a reconnect replaces (and closes) the node's
  // older stream.
  void Register(const v1::RegisterAgent& reg, const std::string& peer,
                std::shared_ptr<AgentConnection> conn, Clock::TimePoint now);
  // Records a heartbeat; true when the node was silent until now.
  bool Heartbeat(const std::string& node, Clock::TimePoint now);
  // Marks silent the connected nodes whose last heartbeat is more than
  // `timeout_s` before `now`; returns those that were not silent before.
  std::vector<std::string> MarkSilent(Clock::TimePoint now, double timeout_s);
  // Moves every node's last heartbeat `gap` later: the coordinator itself
  // did not run for that long (stopped, starved), so their silence then was
  // not theirs.
  void Excuse(std::chrono::steady_clock::duration gap);
  // Forgets `conn` as the node's stream; true when it was the current one (a
  // replaced stream's end changes nothing).
  bool Disconnect(const std::string& node, const std::shared_ptr<AgentConnection>& conn);

  // Marks the node leaving (Node::leaving) when `conn` is its current
  // stream; true then.
  bool MarkLeaving(const std::string& node, const std::shared_ptr<AgentConnection>& conn);
  const Node* Find(const std::string& node) const;
  // The node's stream, null when unknown or disconnected.
  std::shared_ptr<AgentConnection> ConnectionOf(const std::string& node) const;
  bool Connected(const std::string& node) const { return ConnectionOf(node) != nullptr; }
  // The first available (Node::Available) shared node by name ("" when none).
  std::string FirstConnected() const;
  // Topologies of the available shared nodes (not bound to a job), each
  // named as the node registered.
  std::vector<v1::Topology> ConnectedTopologies() const;
  // Topologies of the available agents bound to `job` in `allocation_id`.
  std::vector<v1::Topology> BoundTopologies(const std::string& job,
                                            const std::string& allocation_id) const;
  // Connected agents bound to `job` (any allocation).
  std::vector<std::string> BoundNodes(const std::string& job) const;
  const std::map<std::string, Node>& nodes() const { return nodes_; }
  // Removes a node and its orphans.
  void Erase(const std::string& node);

  void AddOrphan(const std::string& node, const v1::RunningRank& rank);
  std::vector<v1::RunningRank> TakeOrphans(const std::string& node);

 private:
  std::map<std::string, Node> nodes_;
  std::map<std::string, std::vector<v1::RunningRank>> orphans_;
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_NODE_REGISTRY_H_
