// Scheduler: the coordinator's core and the front of the job lifecycle
// (PENDING -> PLANNING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED). It owns
// the active jobs' runtime state, the connected node agents, restarts,
// stops and cancellation, and feeds WatchJob subscribers and /metrics. The
// gRPC services (coordinator/server.h) are thin shells over it.
//
// The parts it delegates, each with its own header and tests:
//   coordinator/job_runtime.h        the state of an active job
//   coordinator/recovery.h           what a restarted coordinator re-adopts
//   coordinator/node_registry.h      connected agents and their streams
//   coordinator/placement.h          where ranks go (the launcher interface)
//   coordinator/measured_planning.h  plans with earlier jobs' measurements
//   coordinator/plan_checks.h        the live check and the end-of-job review
//   coordinator/rank_calls.h         assignments, heartbeats, steps, exits
//   coordinator/tuning_trials.h      tuning.mode trial (scheduler_trials.cc)
//   coordinator/watch_fanout.h       WatchJob subscriptions
// and its methods are grouped by caller: scheduler.cc (lifecycle: submit,
// schedule, launch, stop, restart, finish), scheduler_queries.cc (GetJob,
// ListJobs, DiagnoseJob, Watch, nodes), scheduler_agents.cc (AgentService),
// scheduler_ranks.cc (RankService), scheduler_trials.cc.
//
// One background thread ticks every tick_s and on every change: it plans
// and places waiting jobs, notices stalled ranks, completes stops and
// persists progress. docs/operations.md describes the lifecycle, restarts,
// stalls and coordinator restarts as a user sees them.
//
// Event kinds: "state" (every state change), "plan" (plan summary, live
// check, end-of-job review), "rank_exit" (an abnormal rank exit or stall),
// "restart", "stop" (StopRanks sent: cancel or failure), "eval", "trial",
// "probe" (a `dgca diagnose comm` row), "info".
//
// Thread-safety: all public methods are thread-safe. One mutex (mu_)
// guards every job's runtime state and the node registry; the job store,
// the metrics hub, the rendezvous store and the watch fan-out are
// thread-safe on their own and are called with or without it (their locks
// are always taken inside mu_, never the other way round). Agent commands
// are queued while mu_ is held and sent after it is released (Outbox).
#ifndef DGCA_COORDINATOR_SCHEDULER_H_
#define DGCA_COORDINATOR_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/clock.h"
#include "coordinator/job_runtime.h"
#include "coordinator/job_store.h"
#include "coordinator/metrics_hub.h"
#include "coordinator/node_registry.h"
#include "coordinator/placement.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/slurm.h"
#include "coordinator/slurm_launcher.h"
#include "coordinator/watch_fanout.h"
#include "dgca/v1/agent.pb.h"
#include "dgca/v1/coordinator.pb.h"
#include "dgca/v1/rank.pb.h"
#include "planner/planner.h"

namespace dgca {

struct SchedulerOptions {
  std::string state_dir;            // absolute
  double heartbeat_timeout_s = 30;  // rank stall
  // An agent whose stream is open but that sent no heartbeat for this long
  // is "silent" (frozen, hung): no ranks are placed on its node until it is
  // heard again. Its own knob: agents beat every 2 s by default, whatever
  // the ranks' timeout is.
  double agent_timeout_s = 30;
  // Ranks train on while this coordinator is unreachable for up to this long
  // (GetAssignmentResponse.coordinator_outage_limit_seconds), then stop at
  // exit code 3; such an exit resumes the job, not counted as a failure.
  double rank_outage_limit_s = 600;
  double stop_grace_s = 3;          // StopRanks grace (SIGTERM -> SIGKILL)
  double tick_s = 0.2;
  // A restart whose node is not connected waits this long for it (an agent
  // restarting, a host rebooting), then the job fails "cannot restart".
  double restart_node_wait_s = 300;
  // PlannerMeasurements.link_prior_busbw for every plan (0 = the topology's
  // prior): dgca-coordinator --link-prior-busbw.
  double link_prior_busbw = 0;
  // The clock of every timeout; null = the steady clock. Tests pass a
  // FakeClock and call Tick() themselves instead of Start().
  const Clock* clock = nullptr;
  // resources.launcher: slurm (docs/slurm.md): Slurm's tools, how often the
  // allocations are polled, and how long released agents get to end on
  // their own before their allocation is cancelled.
  SlurmOptions slurm;
  double slurm_poll_s = 2;
  double release_delay_s = 10;
  // The coordinator's own node when its embedded agent runs ranks there:
  // Submit (and PlanJob) then refuse a spec whose files (spec/spec_files.h)
  // cannot be read on this machine, as problems with the spec's
  // line:column. "" = no check at submit (no embedded agent: the files live
  // where the agents are), and launcher: slurm jobs are never checked here.
  // Either way every agent checks them again before it starts a rank
  // (LaunchRank.inputs).
  std::string input_check_node;
  // The credential each LaunchRank carries for its rank (LaunchRank.
  // rank_token; coordinator/credentials.h): called with the job id and the
  // attempt. Null = none sent (scheduler tests with a fake agent).
  std::function<std::string(const std::string& job_id, int32_t attempt)> rank_token;
};

// What the agents a cluster scheduler starts on other machines need to call
// this coordinator back (Scheduler::ConfigureLaunchers).
struct LauncherOptions {
  std::string advertise_address;  // HOST:PORT reachable from the compute nodes
  std::string token_file;         // the token they present (a shared filesystem's path)
  std::string tls_ca_file;        // "" = plaintext
  std::string worker_binary;      // dgca-worker on the compute nodes
  std::string state_dir;          // where scripts, Slurm's output and rank logs go
};

class Scheduler {
 public:
  // Opens STATE_DIR/dgca.db and recovers the jobs a previous coordinator
  // left active (coordinator/recovery.h).
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(SchedulerOptions options,
                                                           MetricsHub* hub);
  ~Scheduler();

  // Where launcher: slurm jobs' agents call back; before Start(). Without
  // it such jobs fail, saying so.
  void ConfigureLaunchers(LauncherOptions options);
  void Start();  // the tick thread (and the Slurm launcher's)
  // Marks active jobs FAILED "coordinator shut down", stops their ranks, and
  // stops the tick thread; later agent reports are ignored.
  void Shutdown();
  // Shuts down without ending any job, for the next coordinator on this
  // state dir to recover (as after kill -9, with progress persisted and an
  // event saying so). Tuning trials are stopped (planning starts over).
  // Shutdown() after Detach() (or the reverse) does nothing.
  void Detach();
  bool shutting_down() const { return shutting_down_.load(); }
  // One scheduling pass now (what the tick thread does every tick_s).
  void Tick();

  // --- Coordinator API. Problems come back in the response (non-empty
  // problems = rejected); errors are statuses.
  absl::StatusOr<v1::SubmitJobResponse> Submit(const v1::SubmitJobRequest& req);
  absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::PlanJobRequest& req);
  absl::StatusOr<v1::GetJobResponse> GetJob(const std::string& id);
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const v1::ListJobsRequest& req);
  // Waits up to `wait` (real time) for CANCELLED once ranks are told to stop.
  // *already_ended (optional) says the job had ended before: it is returned
  // as stored, nothing cancelled.
  absl::StatusOr<v1::Job> Cancel(const std::string& id, std::chrono::milliseconds wait,
                                 bool* already_ended = nullptr);
  // `dgca delete JOB` (DeleteJobRequest in coordinator.proto).
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const std::string& id);
  std::vector<v1::NodeInfo> ListNodes();
  // Drops a disconnected node from ListNodes and /metrics (see
  // ForgetNodeRequest in coordinator.proto for the refusals).
  absl::Status ForgetNode(const std::string& node);
  // `dgca diagnose JOB` (DiagnoseJobRequest in coordinator.proto): a
  // running job's steady-state steps so far, else the breakdown stored with
  // a finished job's plan check, read through DiagnoseSteps.
  absl::StatusOr<v1::DiagnoseJobResponse> DiagnoseJob(const std::string& id);
  // Subscribes to a job: events after `after_seq` (replayed), then live
  // updates. NOT_FOUND for unknown jobs.
  absl::StatusOr<std::shared_ptr<WatchSubscription>> Watch(const std::string& id,
                                                           int64_t after_seq);
  void Unwatch(const std::string& id, const std::shared_ptr<WatchSubscription>& sub);
  // Path of a rank's log; NOT_FOUND for unknown jobs.
  absl::StatusOr<std::string> LogPath(const std::string& id, int rank);
  // True when the job is SUCCEEDED, FAILED or CANCELLED (or unknown).
  bool IsTerminal(const std::string& id);
  // OK when `id` is running at `attempt`: the rendezvous store serves only
  // the current attempt (a stopped attempt's ranks, and whoever holds their
  // token, cannot open namespaces of their own). FAILED_PRECONDITION naming
  // the job's state or its current attempt otherwise.
  absl::Status CheckCurrentAttempt(const std::string& id, int32_t attempt);

  // --- AgentService.
  absl::Status AgentRegistered(const v1::RegisterAgent& reg, const std::string& peer,
                               std::shared_ptr<AgentConnection> conn);
  void AgentHeartbeat(const std::string& node, const v1::AgentHeartbeat& hb);
  void RankExited(const std::string& node, const v1::RankExited& e);
  void AgentDisconnected(const std::string& node, const std::shared_ptr<AgentConnection>& conn);
  // The agent on `conn` is stopping (AgentLeaving): nothing more is placed
  // on its node until it registers again; the exits of its ranks follow.
  void AgentLeaving(const std::string& node, const std::shared_ptr<AgentConnection>& conn,
                    const v1::AgentLeaving& leaving);
  // Pids of the ranks an agent supervises (from its heartbeats; the server
  // polls the embedded agent's).
  void RecordRunning(const std::string& node, const std::vector<v1::RunningRank>& running);
  // A bound agent's warning from its cluster scheduler (a time limit near):
  // every rank of the job checkpoints at a step far enough ahead.
  void CheckpointRequested(const std::string& node, const v1::CheckpointRequest& request);

  // --- RankService.
  absl::StatusOr<v1::GetAssignmentResponse> GetAssignment(const v1::GetAssignmentRequest& req);
  v1::RankHeartbeatResponse RankHeartbeat(const v1::RankHeartbeatRequest& req);
  // One streamed sample; `job_hint` is the job of earlier samples of the
  // same stream (log lines carry none). Returns the sample's job id.
  std::string IngestSample(const v1::MetricSample& s, const std::string& job_hint);
  RendezvousStore& rendezvous() { return rendezvous_; }

  // The ranks recovery re-adopted that have not exited (node, attempt,
  // pid): the embedded agent adopts those of its node (AgentOptions::adopt).
  std::vector<StoredRank> RecoveredRanks();

 private:
  using Outbox = std::vector<std::pair<std::shared_ptr<AgentConnection>, v1::CoordinatorCommand>>;
  using Jobs = std::map<std::string, std::unique_ptr<JobRt>>;

  Scheduler(SchedulerOptions options, MetricsHub* hub, std::unique_ptr<JobStore> store);
  Clock::TimePoint Now() const { return clock_->Now(); }
  absl::Status Recover();
  void Loop();
  // Sends queued agent commands. Called without mu_.
  void Flush(Outbox* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Shutdown/Detach after stop_thread_ is set: sends `out`, joins the tick
  // and trial threads.
  void StopThreads(Outbox* out) ABSL_LOCKS_EXCLUDED(mu_);
  JobRt* FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the tick thread for a pass now.
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    wake_ = true;
    wake_cv_.Signal();
  }
  std::string CheckpointDir(const std::string& id) const;

  // Events: recorded in the store, logged and sent to watchers.
  void Event(JobRt* rt, v1::JobState state, const std::string& kind, const std::string& message,
             bool set_state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Announce(JobRt* rt, const absl::StatusOr<v1::JobEvent>& ev)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job: its plan review, the final state and snapshot, forgotten
  // from the active jobs (rt is gone afterwards).
  void Finish(JobRt* rt, v1::JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `snap` among the last kRememberFinished finished jobs; the /metrics
  // series of the one it pushes out are dropped.
  void RememberFinished(const v1::Job& snap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Job Snapshot(const JobRt& rt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Persist(JobRt* rt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Plans, places and launches a PENDING or PLANNING job (or a restart
  // waiting for capacity).
  void Schedule(JobRt* rt, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where `plan`'s ranks of rt go, or why not yet.
  bool Place(const JobRt* rt, const v1::Plan& plan, std::vector<RankSlot>* slots,
             std::string* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Launches `plan`'s ranks of rt at rt->attempt (rt->plan for the job
  // itself, a candidate for a trial).
  bool Launch(JobRt* rt, const v1::Plan& plan, Outbox* out, std::string* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BeginStop(JobRt* rt, StopAction action, const std::string& message, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a stop of rt to each connected node that holds one of its ranks
  // (live_only: a rank that has not exited); returns those nodes.
  std::set<std::string> QueueStop(const JobRt& rt, bool live_only, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues StopRanks for job `job_id` to each of `nodes` that is connected
  // (only its ranks of `attempts` when not empty).
  void QueueStopOn(const std::string& job_id, const std::set<std::string>& nodes, Outbox* out,
                   const std::set<int>& attempts = {}) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every rank of a stopping job has exited (or the deadline passed):
  // CANCELLED, FAILED, or the restart from the last checkpoint.
  void CompleteStop(JobRt* rt, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job -> attempts among `running` (an agent's report) that no active
  // attempt owns: a job that ended or is not running, or another attempt.
  std::map<std::string, std::set<int>> UnwantedRanks(
      const google::protobuf::RepeatedPtrField<v1::RunningRank>& running)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RankFailed(JobRt* rt, const std::string& reason, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live plan check, once (coordinator/plan_checks.h).
  void LiveCheck(JobRt* rt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the live check: re-plan from the job's measurements when they
  // disagree with the plan (coordinator/replan.h); coordinator/
  // scheduler_replan.cc.
  void MaybeReplan(JobRt* rt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the checkpoint a pending re-plan waits for is written.
  bool ReplanCheckpointWritten(const JobRt& rt) const;
  // The step every rank can still learn of before reaching it (heartbeats
  // every 2 s), past the ranks' latest.
  int64_t CheckpointStepAhead(const JobRt& rt) const;
  // What every plan starts from: the operator's overrides.
  PlannerMeasurements BaseMeasurements() const;

  // launcher: slurm (scheduler_slurm.cc, docs/slurm.md).
  // Schedule's path for a Slurm job: an allocation, its agents, the plan on
  // their topologies, the launch (or a restart's).
  void ScheduleSlurm(JobRt* rt, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the sbatch script of rt's current attempt and asks for it.
  // resources.slurm.time auto for `spec`: the steps left after
  // `steps_done` at `step_seconds` each, plus the margin, as a Slurm time
  // ("" when step_seconds is 0: nothing measured); *note says how.
  static std::string AutoTimeLimit(const v1::JobSpec& spec, double step_seconds,
                                   int64_t steps_done, std::string* note);
  // Copies what the launcher last saw of the job's allocation into
  // rt->launcher (what `dgca status` shows), never back from RUNNING.
  void SyncLauncher(JobRt* rt, const SlurmLauncher::Allocation& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RequestAllocation(JobRt* rt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // resources.slurm.time as sbatch gets it ("auto" resolved; "" = none);
  // *note says how "auto" was resolved.
  std::string SlurmTimeFor(const JobRt& rt, std::string* note) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A restart of a Slurm job: in its allocation while every agent of it is
  // connected; otherwise the old allocation goes and a new one is asked for.
  void RestartSlurm(JobRt* rt, const std::string& restart, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job is over: its bound agents are released (they exit, ending the
  // allocation) and what Slurm still holds is cancelled a little later.
  void ReleaseAllocation(JobRt* rt, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues ReleaseAgent to every connected agent bound to `job` (only those
  // of `allocation_id` when not empty).
  void ReleaseAgents(const std::string& job, const std::string& allocation_id,
                     const std::string& reason, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sbatch script of `spec` for (job, attempt) with --time `time`.
  std::string SbatchFor(const v1::JobSpec& spec, const std::string& job_id, int attempt,
                        const std::string& time) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a Slurm job is accepted: the launcher is configured, the
  // partition exists and has the nodes asked for (sinfo). Without mu_.
  absl::Status CheckSlurmSpec(const v1::JobSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);
  // A dry run of a Slurm spec: its script, and a plan against the topology
  // its partition's last allocation reported when there is one.
  absl::Status DryRunSlurm(const v1::JobSpec& spec, v1::SubmitJobResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Tuning trials (scheduler_trials.cc).
  class JobTrialRunner;
  // Starts the planning thread of a tuning.mode trial job.
  void StartTrials(JobRt* rt, const std::vector<v1::Topology>& topo,
                   const std::vector<RankSlot>& placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The planning thread: plans with the trials, then hands the plan to the
  // job (or fails it).
  void TrialPlanning(std::string id, v1::JobSpec spec, std::vector<v1::Topology> topo,
                     std::shared_ptr<TrialState> st) ABSL_LOCKS_EXCLUDED(mu_);
  // One trial: launches `candidate` as a short run of the job, waits for its
  // ranks to end (or stops them at the budget), returns the median of their
  // timed steps.
  absl::StatusOr<double> RunTrial(const std::string& id, const std::shared_ptr<TrialState>& st,
                                  const v1::Plan& candidate, double budget_s)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Joins the trial planning threads that are done (all: every one; the
  // jobs must have been cancelled first).
  void JoinTrialThreads(bool all) ABSL_LOCKS_EXCLUDED(mu_);

  const SchedulerOptions opt_;
  const Clock* const clock_;
  MetricsHub* const hub_;
  const std::unique_ptr<JobStore> store_;
  RendezvousStore rendezvous_;
  WatchFanout watch_;

  absl::Mutex mu_;
  absl::CondVar wake_cv_;   // the tick thread: a change to act on, or stop
  absl::CondVar trial_cv_;  // trial ranks' samples and exits
  Jobs jobs_ ABSL_GUARDED_BY(mu_);                           // active jobs
  // A gap of `gap` between two turns of Loop: when seconds long, moves every
  // rank's last progress and node's last heartbeat that much later.
  void ExcuseOwnPause(std::chrono::steady_clock::duration gap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, v1::Job> finished_ ABSL_GUARDED_BY(mu_);  // recent finished snapshots
  std::vector<std::string> finished_order_ ABSL_GUARDED_BY(mu_);
  NodeRegistry nodes_ ABSL_GUARDED_BY(mu_);
  // Where ranks go. Reads nodes_: call with mu_ held.
  std::unique_ptr<Placement> placement_;
  LauncherOptions launchers_ ABSL_GUARDED_BY(mu_);
  // Slurm allocations (thread-safe; its lock is taken inside mu_).
  std::unique_ptr<SlurmLauncher> slurm_;
  // Agent commands queued where no Outbox is at hand (Finish's releases);
  // the next Tick sends them.
  Outbox deferred_ ABSL_GUARDED_BY(mu_);
  std::vector<StoredRank> recovered_ranks_ ABSL_GUARDED_BY(mu_);
  // Trial planning threads; joined once done (Tick) or at shutdown.
  std::vector<std::pair<std::shared_ptr<TrialState>, std::thread>> trial_threads_
      ABSL_GUARDED_BY(mu_);
  std::atomic<bool> shutting_down_{false};
  bool stop_thread_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  Clock::TimePoint last_counts_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_SCHEDULER_H_
