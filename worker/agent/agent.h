// Agent: the node daemon (`dgca-worker agent`, and the coordinator's embedded
// local agent). It keeps one AgentService.Connect stream open to the
// coordinator: registers with the node's topology, sends heartbeats, executes
// LaunchRank / StopRanks and reports RankExited. When the coordinator goes
// away it reconnects with exponential backoff (0.2 s doubling to 5 s) and
// re-registers with the ranks it still supervises, so a restarted coordinator
// can re-adopt them, then sends its last 256 exit reports again (the
// coordinator ignores those it has; one that restarted after they were
// written but before it handled them learns them again).
//
// Ranks are started with fork/exec of
//   <worker_binary> rank --coordinator ADDR --token-file F --job J --rank R
//                   --attempt A
// where F is LOG_DIR/rank-R.A.token (mode 0600), holding the LaunchRank's
// rank_token: the rank's own credential, good for that job and attempt
// only; it is removed when the rank has exited, and by a sweep (at start,
// then every 30 s) once a minute old: a rank reads it only as it starts. A LaunchRank without one is
// refused (exit 127, "sent no rank token").
// in their own process group, with the agent's environment (less where its
// own token is: CREDENTIALS_DIRECTORY, DGCA_AGENT_TOKEN_FILE, DGCA_TOKEN_FILE) plus the
// allow-listed LaunchRank.env entries (NCCL_*, CUDA_*, OMP_*, DGCA_*; others
// are refused and logged), plus DGCA_LOCAL_DEVICE (LaunchRank.local_device,
// -1 = CPU), DGCA_WORLD_SIZE, DGCA_NODE, and DGCA_RANK_ID / DGCA_EXIT_FILE
// (rank_process.h: what lets a later agent adopt the rank). stdout and
// stderr are appended to STATE_DIR/jobs/J/rank-R.log (LaunchRank.log_dir
// replaces STATE_DIR/jobs/J when set). A reaper thread waitpid()s them and
// reports each exit with the last ~20 lines of the log when the exit was not
// clean.
//
// Adoption (AgentOptions::adopt, the embedded agent of a coordinator that
// restarted after kill -9): each listed rank of this node whose pid is alive
// and carries the rank's DGCA_RANK_ID (pid 0, never recorded: the process
// that carries it, looked up in /proc) is supervised as if launched here
// (stopped, listed in Running(), reported when it ends), but watched through
// /proc instead of waitpid: its exit code comes from its exit record, and
// one that left none is reported with status_unknown. A listed rank that is
// already gone is reported at once the same way, so the coordinator learns
// about exits that happened while nobody was watching. The AdoptRanks
// command does the same for a standalone agent that restarted: the
// coordinator lists the ranks it placed on the node that the agent did not
// register with.
//
// Thread-safety: Start() and Stop() may be called from any thread; Stop() is
// idempotent and is also called by the destructor. The agent runs its own
// threads (stream reader/writer, heartbeats, reaper).
#ifndef DGCA_WORKER_AGENT_AGENT_H_
#define DGCA_WORKER_AGENT_AGENT_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dgca/v1/agent.pb.h"

namespace dgca {

struct AgentOptions {
  std::string coordinator_address;   // "host:port"
  std::string token;                 // the agent token (coordinator's STATE_DIR/agent-token)
  std::string node_name;             // "" = hostname
  std::string state_dir;             // logs go to STATE_DIR/jobs/J/rank-R.log
  std::string worker_binary;         // path of dgca-worker ("" = /proc/self/exe)
  std::string topology_root = "/";   // root of the topology probe
  double heartbeat_interval_s = 2;
  // PEM root CA: TLS to the coordinator (and passed to ranks as --tls-ca).
  // "" = plaintext (loopback, unix socket, trusted network).
  std::string tls_ca_file;

  // Ranks to supervise again (see the header comment); entries of other
  // nodes are ignored. Their logs are STATE_DIR/jobs/J/rank-R.log.
  struct AdoptRank {
    std::string node;
    v1::RunningRank rank;  // job_id, rank, attempt, pid (0 = never known)
  };
  std::vector<AdoptRank> adopt;

  // An agent a cluster scheduler started for one job (`--bound-job`,
  // docs/slurm.md): it registers with the job and `allocation_id` (Slurm's
  // job id of its allocation, SLURM_JOB_ID), refuses other jobs' ranks, and
  // is released by the coordinator when the job is done with it. Its node
  // name defaults to HOSTNAME-slurmALLOCATION, unique per allocation.
  std::string bound_job;
  std::string allocation_id;
  // Called (from the stream's thread) when the coordinator releases this
  // agent, after its ranks were told to stop; the program then stops the
  // agent and exits. Unset: the agent stops taking commands and waits.
  std::function<void(const std::string& reason)> on_release;

  // Test hook: when non-empty, replaces the argv built for a rank. The
  // strings may contain {job}, {rank}, {attempt}, {coordinator},
  // {token_file}, which are substituted.
  std::vector<std::string> rank_argv_override;
};

// The environment names a LaunchRank may set: NCCL_*, CUDA_*, OMP_*, DGCA_*,
// less those that load code into the rank or write files on the node
// (RankEnvRefusal, spec/rank_env.h; the rank's log says why each was refused).
bool IsAllowedRankEnv(const std::string& name);

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Probes the topology and starts the connection, heartbeat and reaper
  // threads. Returns at once (the first connection may still be under way).
  // Errors: FAILED_PRECONDITION when already started, INVALID_ARGUMENT for
  // bad options.
  absl::Status Start();

  // Stops every rank (SIGTERM, SIGKILL after 5 s), closes the stream and
  // joins the threads.
  void Stop();
  // Closes the stream and joins the threads without stopping the ranks:
  // they run on unsupervised (nobody waits for them; their exit records
  // say how they ended), for an agent started with `adopt` listing them to
  // supervise again. Stop() after Detach() (or the reverse) does nothing.
  void Detach();

  // A bound agent's answer to the cluster scheduler's time-limit warning
  // (SIGUSR1 `sig`): asks the coordinator to pick a step at which every rank
  // of the job saves a checkpoint (docs/slurm.md). Unbound agents do nothing.
  void RequestCheckpoint(int sig);

  // The name this agent registers under.
  std::string node_name() const;
  // True while the stream to the coordinator is open and registered.
  bool connected() const;
  // Ranks now supervised (for tests and the coordinator's embedded agent).
  std::vector<v1::RunningRank> Running() const;

  // Executes a command as if it had arrived on the stream (used by tests and
  // by the embedded local agent). Thread-safe.
  void Execute(const v1::CoordinatorCommand& cmd);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dgca

#endif  // DGCA_WORKER_AGENT_AGENT_H_
