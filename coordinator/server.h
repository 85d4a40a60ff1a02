// CoordinatorServer: dgca-coordinator as a library. One gRPC server carries
// the three services of proto/dgca/v1 (Coordinator for the CLI,
// AgentService for node agents, RankService for ranks), the /metrics
// endpoint, the durable job store and the scheduler (scheduler.h), and the
// embedded local agent, which adopts the ranks a killed predecessor's agent
// left running on this node (Scheduler::RecoveredRanks).
//
// Behaviour at the edge (what clients can rely on):
//  - Every RPC requires "authorization: Bearer <token>" of its service's
//    role (coordinator/credentials.h): the Coordinator service takes
//    STATE_DIR/token, AgentService STATE_DIR/agent-token, RankService the
//    rank token of the request's own job and attempt (minted into each
//    LaunchRank). A token none of ours: UNAUTHENTICATED; another role's, or
//    a rank token for another job or attempt: PERMISSION_DENIED. The
//    rendezvous calls (Store*) serve only the job's current attempt
//    (FAILED_PRECONDITION). Messages are limited to 4 MiB both ways.
//  - SubmitJob / PlanJob with a bad spec: INVALID_ARGUMENT; the status
//    message is "invalid job spec (N problems):\n" + one
//    "file:line:col: field: message" line per problem (capped at ~3 KB), and
//    the status' binary error details (grpc::Status::error_details()) hold a
//    serialized dgca.v1.SubmitJobResponse (PlanJobResponse for PlanJob) with
//    the structured problems (as many as fit in ~3 KB; trailers are
//    bounded). validate_only returns OK with the parsed spec (defaults
//    filled, base_dir set) and stores nothing; dry_run also returns the plan.
//    dry_run/PlanJob with no agent connected: FAILED_PRECONDITION.
//  - GetJob/CancelJob/WatchJob/GetLogs on an unknown id: NOT_FOUND.
//    CancelJob on a finished job: FAILED_PRECONDITION. CancelJob waits (up to
//    the call deadline, at most 8 s) for CANCELLED and returns the job.
//  - WatchJob: the job's events after after_event_seq, then a snapshot, then
//    live events, metric samples and a snapshot every second, until the job
//    is SUCCEEDED/FAILED/CANCELLED (the final event and a final snapshot are
//    sent, then the stream ends OK) or the client leaves.
//  - GetLogs reads STATE_DIR/jobs/JOB/rank-R.log (written by the agent; for
//    the embedded agent that is this machine; logs of ranks on remote agents
//    stay on their node's state dir and are NOT served: NOT_FOUND "no log").
//    Chunks of max_bytes (default and max 1 MiB); with follow it keeps
//    streaming until the job has finished and the file is fully read, then
//    sends eof=true.
//  - ListNodes/GetTopology: from the agents' registrations (GetTopology of
//    an unknown node: NOT_FOUND).
//  - STATE_DIR/coordinator.json: {"listen": "HOST:PORT", "metrics":
//    "HOST:PORT", "pid": N} with the actual bound ports (port 0 allowed).
//  - Job ids on GetJob/CancelJob/WatchJob/GetLogs/DiagnoseJob that cannot
//    name a job (CheckJobId in proto/rpc/rpc_util.h: over 128 bytes, or not
//    [A-Za-z0-9._-]): INVALID_ARGUMENT, the id not echoed.
//  - Start refuses a listen/metrics_listen that is not HOST:PORT with PORT
//    0..65535 (INVALID_ARGUMENT) and a state_dir that is not a directory;
//    the gRPC port is bound without SO_REUSEPORT, so a port another process
//    holds fails Start ("cannot listen on ADDR: the address is in use ...").
//  - The job store (STATE_DIR/dgca.db): Start fails, naming the file and how
//    to recover, on damaged pages (DATA_LOSS), and on a missing or empty
//    file in a state dir used before (STATE_DIR/coordinator.json, or job
//    folders in STATE_DIR/jobs) unless new_store. Damaged rows found later
//    fail their RPC with DATA_LOSS (coordinator/job_store.h).
//  - A state dir or token file open to group or others (mode & 077) is warned
//    about at every start, with the chmod that fixes it; not changed.
//  - One coordinator per state dir: STATE_DIR/coordinator.lock is flock()ed
//    for the server's life (released by the kernel on kill -9); a second
//    Start on the same dir fails with FAILED_PRECONDITION.
//  - With TLS (tls_cert/tls_key), the TCP port serves TLS and the embedded
//    agent (and its ranks) reach the coordinator over the unix socket
//    STATE_DIR/coordinator.sock (insecure channel, token still required).
//
// Thread-safety: Start/Shutdown from one thread; the server runs its own.
#ifndef DGCA_COORDINATOR_SERVER_H_
#define DGCA_COORDINATOR_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/credentials.h"
#include "coordinator/metrics_hub.h"
#include "coordinator/scheduler.h"

namespace grpc {
class Server;
class ServerCredentials;
class Service;
}  // namespace grpc

namespace dgca {

class Agent;

struct CoordinatorServerOptions {
  std::string listen = "127.0.0.1:7600";
  std::string metrics_listen = "127.0.0.1:7601";  // "" = no /metrics endpoint
  std::string state_dir = ".dgca";
  bool local_agent = true;
  std::string tls_cert;
  std::string tls_key;
  double heartbeat_timeout_s = 30;
  double agent_timeout_s = 30;  // SchedulerOptions::agent_timeout_s
  double rank_outage_limit_s = 600;  // SchedulerOptions::rank_outage_limit_s
  double stop_grace_s = 3;
  // SchedulerOptions::restart_node_wait_s.
  double restart_node_wait_s = 300;
  // SchedulerOptions::link_prior_busbw.
  double link_prior_busbw = 0;
  // dgca-worker for the embedded agent; "" = dgca-worker next to this
  // program (/proc/self/exe's directory).
  std::string worker_binary;
  std::string node_name;  // embedded agent's node name; "" = hostname
  // What Shutdown() does to active jobs: false = end them (FAILED
  // "coordinator shut down", ranks stopped); true = keep them for the next
  // coordinator on this state dir (Scheduler::Detach; the embedded agent
  // leaves its ranks running). `--on-shutdown keep-jobs`.
  bool keep_jobs_on_shutdown = false;
  // Test hook passed to the embedded agent (AgentOptions::rank_argv_override).
  std::vector<std::string> rank_argv_override;
  // resources.launcher: slurm (docs/slurm.md): the HOST:PORT Slurm's agents
  // call back on ("" = the listen address, its host replaced by this
  // machine's name when it listens on every address), the PEM CA they trust
  // with TLS, and the directory of sbatch & co ("" = PATH).
  std::string advertise;
  std::string slurm_tls_ca;
  std::string slurm_bin_dir;
  // Start with an empty job store although the state dir was used before
  // (`--new-store`, after moving a damaged dgca.db aside). Without it a
  // missing or empty STATE_DIR/dgca.db in such a dir fails Start
  // (JobStore::RequireExisting). It never removes a store that is there.
  bool new_store = false;
};

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(CoordinatorServerOptions options);
  ~CoordinatorServer();

  // Stops the embedded agent, marks running jobs FAILED "coordinator shut
  // down" (or, with keep_jobs_on_shutdown, leaves jobs and ranks running
  // for the next coordinator), and stops the gRPC server. Idempotent.
  void Shutdown();

  const std::string& address() const { return address_; }          // bound host:port
  const std::string& metrics_address() const { return metrics_address_; }  // "" when none
  // The user token (STATE_DIR/token), the agent token, and the token a
  // rank of `job_id`'s attempt `attempt` is given.
  const std::string& token() const { return creds_->user_token(); }
  const std::string& agent_token() const { return creds_->agent_token(); }
  std::string RankToken(const std::string& job_id, int attempt) const {
    return creds_->RankToken(job_id, attempt);
  }
  const std::string& state_dir() const { return state_dir_; }
  Scheduler* scheduler() { return scheduler_.get(); }
  MetricsHub* metrics() { return hub_.get(); }

 private:
  CoordinatorServer() = default;
  // Builds and starts the gRPC server (the three services) on opt_.listen,
  // and on `unix_socket` too when not empty; returns the bound port.
  absl::StatusOr<int> Serve(std::shared_ptr<grpc::ServerCredentials> creds,
                            const std::string& unix_socket);
  // The embedded agent, reaching this server at `coordinator_address`, and
  // the thread that reports its ranks' pids.
  absl::Status StartLocalAgent(const std::string& coordinator_address);

  CoordinatorServerOptions opt_;
  std::string state_dir_;
  std::unique_ptr<Credentials> creds_;
  std::string address_;
  std::string metrics_address_;
  std::unique_ptr<MetricsHub> hub_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<grpc::Service>> services_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Agent> agent_;
  std::thread poller_;
  std::atomic<bool> stopping_{false};
  bool shut_down_ = false;
  // Set once Start has done everything. A start that fails half-way (a busy
  // port, a bad TLS file) must not end the jobs it recovered from the store:
  // they belong to the next coordinator started on this state dir.
  bool started_ = false;
  int lock_fd_ = -1;  // flock on STATE_DIR/coordinator.lock
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_SERVER_H_
