// Agent::Impl, shared by the two halves of the node agent (worker/agent/agent.h):
// agent.cc keeps the connection to the coordinator (registration, heartbeats,
// commands, exit reports), agent_ranks.cc the rank processes (launch,
// adoption, stops, the reaper). Private to worker/agent.
//
// Thread-safety: mu_ guards the children and the agent's state, stream_mu_
// the stream (held while writing); stream_mu_ is taken before mu_.
#ifndef DGCA_WORKER_AGENT_AGENT_IMPL_H_
#define DGCA_WORKER_AGENT_AGENT_IMPL_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "dgca/v1/agent.grpc.pb.h"
#include "worker/agent/agent.h"

namespace dgca {

class Agent::Impl {
 public:
  explicit Impl(AgentOptions o) : opt_(std::move(o)) {}
  ~Impl() { Stop(); }

  absl::Status Start();
  // stop_ranks = false: Detach (agent.h).
  void Stop(bool stop_ranks = true);
  void Execute(const v1::CoordinatorCommand& cmd);
  void RequestCheckpoint(int sig);
  std::vector<v1::RunningRank> Running() const;
  bool connected() const { return connected_.load(); }
  std::string node_name() const { return node_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Child {
    std::string job_id;
    int rank = 0;
    int attempt = 0;
    pid_t pid = 0;
    std::string log_path;
    bool stopping = false;
    Clock::time_point kill_at;  // SIGKILL deadline once stopping
    // Adopted from an earlier agent (not our child): watched through /proc,
    // its exit code read from its exit record.
    bool adopted = false;
    uint64_t start_time = 0;    // /proc/PID/stat start time when adopted
  };

  void ConnectLoop();
  void HeartbeatLoop();
  void ReaperLoop();
  void Launch(const v1::LaunchRank& l);
  // Takes over a rank an earlier agent launched, or reports it gone.
  void Adopt(const v1::RunningRank& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True while an adopted child's process is still the one adopted.
  static bool AdoptedAlive(const Child& c);
  // The report of a child's end: `wait_status` from waitpid for our own
  // children, nullopt for adopted ones (the exit record, if any, says).
  // `leaving`: the agent had announced its stop (AgentLeaving) by then.
  // Appends the agent's line to the rank's log.
  v1::RankExited ExitReport(const Child& c, std::optional<int> wait_status, bool leaving);
  // SIGTERM (SIGKILL after grace_s) to the job's ranks; only those of
  // `attempts` when it is not empty.
  void StopJob(const std::string& job_id, double grace_s, const std::set<int>& attempts = {});
  // Sends on the open stream; false when there is none or it broke.
  bool Send(const v1::AgentMessage& m);
  // Writes an exit report on the stream when it is up (no RememberExit).
  void SendExit(const v1::RankExited& e) ABSL_LOCKS_EXCLUDED(mu_, stream_mu_);
  // Adds an exit report to recent_exits_ (bounded).
  void RememberExit(const v1::RankExited& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    recent_exits_.push_back(e);
    while (recent_exits_.size() > kRecentExits) recent_exits_.pop_front();
  }
  // RememberExit, then SendExit (in order with the registration's replay).
  void ReportExit(const v1::RankExited& e) ABSL_LOCKS_EXCLUDED(mu_, stream_mu_);
  bool SleepFor(double seconds);  // false when stopping

  AgentOptions opt_;
  std::string node_;
  std::string worker_binary_;
  v1::Topology topology_;

  // Lock order: stream_mu_ before mu_.
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(stream_mu_);
  absl::CondVar cv_;  // children_ or stopping_ changed
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_called_ ABSL_GUARDED_BY(mu_) = false;
  // Stop() has told the coordinator this agent is leaving (AgentLeaving):
  // exit reports written from here on follow that message on the stream.
  bool leaving_announced_ ABSL_GUARDED_BY(mu_) = false;
  // Exits taken out of children_ but not yet reported.
  int reporting_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<pid_t, Child> children_ ABSL_GUARDED_BY(mu_);
  // The last kRecentExits exit reports, oldest first. All of them are sent
  // again after every registration: those the coordinator has seen it
  // ignores (other attempts, ranks it saw exit, finished jobs), and one that
  // restarted after our Write but before handling it learns them again.
  static constexpr size_t kRecentExits = 256;
  std::deque<v1::RankExited> recent_exits_ ABSL_GUARDED_BY(mu_);

  absl::Mutex stream_mu_;  // held while writing on the stream
  grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorCommand>* stream_
      ABSL_GUARDED_BY(stream_mu_) = nullptr;
  std::shared_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(stream_mu_);
  std::atomic<bool> connected_{false};

  std::thread connect_thread_, heartbeat_thread_, reaper_thread_;
};

// mkdir -p (model/core/files.h), mode 0755.
absl::Status MakeDirs(const std::string& path);

}  // namespace dgca

#endif  // DGCA_WORKER_AGENT_AGENT_IMPL_H_
