// Scheduler: the coordinator's core. Owns the job lifecycle (PENDING ->
// PLANNING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED), the connected node
// agents, the per-rank runtime state, restarts, cancellation, and the fan-out
// of events, metric samples and snapshots to WatchJob subscribers. The gRPC
// services (server.h) are thin shells over it.
//
// Lifecycle (one background thread ticks every 200 ms and on every change):
//  - Submit stores the job PENDING (nothing is stored for validate_only or
//    dry_run). While no agent is connected it stays PENDING ("waiting for a
//    node agent"). Then PLANNING: MakePlan(spec, topologies of the connected
//    nodes); a planner error -> FAILED "planning failed: ...". The plan is
//    stored with the job. tuning.mode trial: the job is planned on a thread
//    of its own instead (StartTrials), whose planner times its candidates as
//    short attempts of the job on its ranks (RunTrial: TrialSpec, 6 steps,
//    the last 4 timed on every rank, no eval or checkpoints; events "trial";
//    a failed or over-budget candidate is noted and skipped; each success
//    stores a step measurement JOB/trial-N for later plans); the job stays
//    PLANNING meanwhile and its attempt counts the trials, and cancel stops
//    a trial's ranks. Placement: rank r goes to plan.rank_nodes(r) (or
//    the first connected node when the plan names none), device
//    plan.rank_local_devices(r) (or -1). A job waits in PLANNING ("waiting for
//    capacity: ...") while a named node is not connected or one of its GPUs
//    is used by another running job. Then one LaunchRank per rank (attempt 0,
//    env = plan.env overlaid with spec.comm.env, coordinator "" = the
//    agent's own address, log_dir "" = agent's STATE_DIR/jobs/JOB) and
//    RUNNING.
//  - Rank exits (RankExited from the agent): all ranks exit 0 -> SUCCEEDED.
//    A non-zero exit or a signal, or a rank with neither a heartbeat nor a
//    step for heartbeat_timeout_s (counted from launch), stops the job's
//    other ranks (StopRanks, grace stop_grace_s) and, once they have exited
//    (or grace + 5 s passed), restarts every rank from the last checkpoint
//    (attempt + 1, dgca_rank_restarts_total, event "restart") while
//    restarts < train.max_restarts, else FAILED with a message naming the
//    rank, node, exit code or signal, and the rank's last output lines:
//      "rank R on node N exited with code C" | "... was killed by signal S (name)"
//      | "rank R on node N made no progress for T s (no heartbeat or step; ...)"
//      [" (after K restarts; train.max_restarts is M)"]
//      ["; other ranks: rank Q on node N was killed by signal 9 (Killed)"]
//      ["; last output:\n<the agent's last log lines of rank R>"]
//    ("other ranks" lists ranks that died on their own while the job was
//    being stopped, which is often the root cause.) Exits reported for an
//    old attempt are ignored. A restart whose node is not connected (an
//    agent restarting, a host rebooting) waits in PLANNING ("waiting for
//    capacity ...; restart K of M waits for it (up to N s)"), for up to
//    restart_node_wait_s, then fails "cannot restart"; the restart is
//    counted (and stored) at once, its "restart" event comes at the launch.
//    Ranks of the stopped attempt on a node that was away are adopted and
//    stopped when its agent registers again (orphans_).
//  - Progress: Job.step = min over ranks, samples_per_second = sum over
//    running ranks, loss = mean, eta = (steps - step) x mean step_seconds.
//    Persisted (with per-rank RankProgress and eval) every 5 s, on each eval
//    and at the end, so `dgca status` shows ranks after a restart too. The
//    /metrics series of a job are dropped once 64 newer jobs have finished.
//  - Cancel: PENDING/PLANNING -> CANCELLED at once; RUNNING -> StopRanks,
//    then CANCELLED once every rank has exited (or grace + 5 s passed).
//  - Rank heartbeats answer stop=true when the job is not RUNNING, is being
//    stopped, or the rank's attempt is not the current one.
//  - Rank processes: their pids (from agent heartbeats, and polled from the
//    embedded local agent) are recorded in the job store (pgid = pid: the
//    agent starts each rank in its own process group).
//
// Coordinator restart (kill -9, then start on the same state dir): no job
// is lost and running ranks are re-adopted (Recover):
//  - PENDING and PLANNING jobs are queued again (PENDING, event "coordinator
//    restarted; queued again") and planned afresh.
//  - RUNNING jobs keep running. Launch stores each rank's node and attempt
//    (the ranks table; the pid follows from the agents), so the job comes
//    back at its attempt with its plan, restarts, evaluation and per-rank
//    progress, each rank "recovering" until its next heartbeat or step
//    (ranks keep training through a coordinator outage shorter than their
//    heartbeat timeout, retrying their calls). Remote agents reconnect and
//    re-register with their running ranks and the exits they saw meanwhile;
//    the embedded agent, which died with the coordinator, adopts this node's
//    ranks (RecoveredRanks, AgentOptions::adopt). A rank nobody vouches for
//    stalls out after heartbeat_timeout_s and the job restarts from its last
//    checkpoint as after any failure. A rank's clean exit is persisted at
//    once, so it is never waited for twice.
//  - A stop that was under way (its "stop" event is the newest of the
//    stop/restart/state events: cancel, failure or restart) is carried on:
//    agents get StopRanks as they register again.
//  - A RUNNING job whose ranks cannot be known (no plan, ranks missing, mixed
//    attempts) is FAILED "coordinator restarted; cannot re-adopt: WHY" after
//    its recorded rank processes whose /proc/PID/cmdline mentions the job id
//    are killed (SIGKILL to the process group; event "info" per kill).
// What is lost: the rendezvous store (a crash during a rendezvous makes it
// time out and the job restart), the plan check's steps before the restart,
// and /metrics counters (they restart from zero, which Prometheus' rate()
// handles).
//
// Event kinds: "state" (every state change), "plan" (plan summary),
// "rank_exit" (an abnormal rank exit or stall, the reason), "restart",
// "stop" (StopRanks sent: cancel or failure), "eval" (evaluation metrics
// summary), "trial" (a tuning trial's start and result), "info".
//
// Thread-safety: all public methods are thread-safe.
#ifndef DGCA_COORDINATOR_SCHEDULER_H_
#define DGCA_COORDINATOR_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_store.h"
#include "coordinator/loss_curve.h"
#include "coordinator/metrics_hub.h"
#include "planner/diagnosis.h"
#include "planner/planner.h"
#include "coordinator/rendezvous_store.h"
#include "dgca/v1/agent.pb.h"
#include "dgca/v1/coordinator.pb.h"
#include "dgca/v1/rank.pb.h"

namespace dgca {

struct SchedulerOptions {
  std::string state_dir;            // absolute
  double heartbeat_timeout_s = 30;  // rank stall and agent liveness
  double stop_grace_s = 3;          // StopRanks grace (SIGTERM -> SIGKILL)
  double tick_s = 0.2;
  // A restart whose node is not connected waits this long for it (an agent
  // restarting, a host rebooting), then the job fails "cannot restart".
  double restart_node_wait_s = 300;
};

// One agent stream. Send() is safe from any thread until Close().
class AgentConnection {
 public:
  using Writer = std::function<bool(const v1::CoordinatorCommand&)>;
  explicit AgentConnection(Writer w) : write_(std::move(w)) {}
  bool Send(const v1::CoordinatorCommand& cmd);
  void Close();

 private:
  std::mutex mu_;
  Writer write_;
  bool open_ = true;
};

// A WatchJob subscription: a bounded queue of updates.
class WatchSubscription {
 public:
  // Blocks up to `timeout` for the next update; false when none.
  bool Next(v1::WatchJobResponse* out, std::chrono::milliseconds timeout);
  void Push(v1::WatchJobResponse u);

 private:
  static constexpr size_t kMaxQueued = 4096;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::WatchJobResponse> q_;
};

class Scheduler {
 public:
  // Opens STATE_DIR/dgca.db and recovers (see header comment).
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(SchedulerOptions options,
                                                           MetricsHub* hub);
  ~Scheduler();

  // What a compute-time measurement depends on besides the micro-batch:
  // node set, device, ranks, threads per rank, precision, sequence length,
  // MFT and the model (init_from excluded; dropout as trained: unset is the
  // default, none keys as specs from before model.dropout did). Jobs with
  // equal keys share c(m). A pure function.
  static std::string StepKey(const v1::JobSpec& spec, const v1::Plan& plan,
                             const std::string& node_set);
  // What a memory measurement depends on: StepKey and the attention kernels
  // (the GEMM version keeps [heads, L, L] probabilities per sample).
  // `kept`: the kernels an "auto" plan's ranks reported running ("" when
  // planning, or not reported).
  static std::string MemoryKey(const v1::JobSpec& spec, const v1::Plan& plan,
                               const std::string& node_set, const std::string& kept = "") {
    // "auto" keys as "fused" when planning: which one a plan says depends on
    // its micro-batch, which this measurement changes (the fused kernels are
    // the default of both). A finished "auto" job's peak is stored under the
    // kernels its ranks ran, so a GEMM run's peak never reads as the fused
    // kernels' (older ones unreported: "fused", on the safe side).
    std::string attention = plan.attention();
    if (attention == "auto") attention = kept.empty() ? "fused" : kept;
    return StepKey(spec, plan, node_set) + " attention=" + attention;
  }

  void Start();  // the tick thread
  // Marks active jobs FAILED "coordinator shut down", stops their ranks, and
  // stops the tick thread; later agent reports are ignored.
  void Shutdown();
  // Shuts down without ending any job, for the next coordinator on this
  // state dir to recover (as after kill -9, with progress persisted and an
  // event saying so): RUNNING jobs' ranks train on (re-adopted if it comes
  // back within their heartbeat timeout, restarted from a checkpoint if
  // later), PENDING and PLANNING jobs stay queued. Tuning trials are stopped
  // (planning starts over). Stops the tick thread; later agent reports are
  // ignored. Shutdown() after Detach() (or the reverse) does nothing.
  void Detach();
  bool shutting_down() const { return shutting_down_.load(); }

  // --- Coordinator API. Problems come back in the response (non-empty
  // problems = rejected); errors are statuses.
  absl::StatusOr<v1::SubmitJobResponse> Submit(const v1::SubmitJobRequest& req);
  absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::PlanJobRequest& req);
  absl::StatusOr<v1::GetJobResponse> GetJob(const std::string& id);
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const v1::ListJobsRequest& req);
  // Waits up to `wait` for CANCELLED once ranks are told to stop.
  absl::StatusOr<v1::Job> Cancel(const std::string& id, std::chrono::milliseconds wait);
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

  // --- AgentService.
  absl::Status AgentRegistered(const v1::RegisterAgent& reg, const std::string& peer,
                               std::shared_ptr<AgentConnection> conn);
  void AgentHeartbeat(const std::string& node, const v1::AgentHeartbeat& hb);
  void RankExited(const std::string& node, const v1::RankExited& e);
  void AgentDisconnected(const std::string& node, const std::shared_ptr<AgentConnection>& conn);

  // --- RankService.
  absl::StatusOr<v1::GetAssignmentResponse> GetAssignment(const v1::GetAssignmentRequest& req);
  v1::RankHeartbeatResponse RankHeartbeat(const v1::RankHeartbeatRequest& req);
  // One streamed sample; `job_hint` is the job of earlier samples of the
  // same stream (log lines carry none). Returns the sample's job id.
  std::string IngestSample(const v1::MetricSample& s, const std::string& job_hint, int rank_hint);
  RendezvousStore& rendezvous() { return rendezvous_; }

  // The ranks Recover re-adopted that have not exited (node, attempt, pid):
  // the embedded agent adopts those of its node (AgentOptions::adopt).
  std::vector<StoredRank> RecoveredRanks();

  // Pids of ranks the embedded agent supervises (polled by the server).
  void RecordRunning(const std::string& node, const std::vector<v1::RunningRank>& running);

  // For tests: runs one scheduling pass now.
  void TickForTest() { Tick(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct RankRt {
    std::string node;
    int local_device = -1;
    v1::RankProgress progress;
    bool exited = false;
    Clock::time_point last_progress;
    int step_samples = 0;  // step metrics received from this rank (this attempt)
  };
  // One rank's step, kept for the plan check (predicted vs measured) and
  // `dgca diagnose` (planner/diagnosis.h).
  using StepSample = ::dgca::StepSample;
  static StepSample SampleOf(const v1::StepMetrics& m);
  // Medians over rank-steps: seconds per optimizer step, exposed
  // communication share, all-reduce seconds, compute per micro-step (the
  // step less its data wait and exposed communication, over `accumulation`).
  struct StepMedians {
    double step = 0, comm_share = 0, allreduce = 0, compute = 0;
  };
  static StepMedians MediansOf(const std::vector<StepSample>& samples, int accumulation);
  enum class StopAction { kNone, kRestart, kFail, kCancel };
  // tuning.mode trial: the planner's candidates, each timed as a short run
  // of the job on its ranks (attempt = the job's attempt then), from a
  // planning thread of its own (TrialPlanning). Guarded by mu_.
  struct Trials {
    bool active = false;     // a trial's ranks run now
    bool done = false;       // the planning thread has finished
    bool cancelled = false;  // the job ended (cancel, shutdown): no more trials
    int index = 0;           // trials started
    v1::Plan plan;           // the candidate being timed
    std::vector<StepSample> steps;  // its timed steps (after the warmup), every rank
    std::string failure;     // why it failed ("" while none)
    // Measured exposed-communication share (median) per timed candidate,
    // by CandidateLabel: the kept one's becomes the plan's prediction.
    std::map<std::string, double> comm_share;
    Clock::time_point wall_deadline;   // spec.tuning.budget_s from the first trial
    // Node and GPU (-1: none) of each rank, held from the first trial to
    // the job's launch.
    std::vector<std::pair<std::string, int>> placement;
  };
  struct JobRt {
    std::string id;
    v1::JobSpec spec;
    v1::Plan plan;
    bool planned = false;
    v1::JobState state = v1::PENDING;
    std::string message;
    int attempt = 0;
    int restarts = 0;
    std::vector<RankRt> ranks;
    StopAction stop = StopAction::kNone;
    std::string stop_message;
    Clock::time_point stop_started;
    // Abnormal exits of other ranks that arrived while stopping and were
    // not caused by our StopRanks (e.g. the rank whose death made the
    // reported one fail): named in the final message.
    std::vector<std::string> other_failures;
    Clock::time_point stop_deadline;
    Clock::time_point launched;
    std::map<std::string, double> eval;
    // Steady-state steps, every rank: the latest kMaxStepSamples (a ring
    // once full; step_samples_seen counts every one).
    std::vector<StepSample> step_samples;
    size_t step_samples_seen = 0;
    double step_seconds_seen = 0;  // the step time of every one, summed
    // What the ranks report running (StepMetrics.attention_kernels: "fused"
    // or "gemm"; every rank takes rank 0's choice): an "auto" plan's peak
    // memory is stored under the kernels that ran. "" = not reported.
    std::string attention_kernels;
    // The ranks reported both over the job (a restarted attempt timed the
    // attention again and kept the other): its peak is not filed under
    // either.
    bool attention_mixed = false;
    LossCurve loss_curve;                  // Job.loss_curve
    v1::PlanCheck plan_check;
    bool live_checked = false;  // LiveCheck done for this job
    // A restart waiting for capacity (a node of the plan not connected when
    // the stop completed): its "restart" event, recorded at the launch.
    std::string restart_pending;
    Clock::time_point restart_wait_deadline;
    Clock::time_point last_persist;
    Clock::time_point last_snapshot;
    bool dirty = false;
    std::shared_ptr<Trials> trials;  // tuning.mode trial, while planning
  };
  // Rank `rank` of rt's current attempt, as an agent lists or adopts it.
  static v1::RunningRank RunningRankOf(const JobRt& rt, int rank);
  struct Node {
    std::string name;
    std::string address;
    v1::Topology topology;
    std::shared_ptr<AgentConnection> conn;
    Clock::time_point last_heartbeat;
  };
  using Outbox = std::vector<std::pair<std::shared_ptr<AgentConnection>, v1::CoordinatorCommand>>;

  // A stop under way when the coordinator died, read back from the events.
  struct InterruptedStop {
    StopAction action = StopAction::kNone;
    std::string message;
  };

  Scheduler(SchedulerOptions options, MetricsHub* hub, std::unique_ptr<JobStore> store);
  absl::Status Recover();
  static std::optional<InterruptedStop> InterruptedStopOf(const std::vector<v1::JobEvent>& events);
  // Kills the recorded rank processes of a job that cannot go on (those
  // whose /proc/PID/cmdline still names the job), an "info" event per kill
  // ("killed orphaned WHAT R (pid P, attempt A)"), and forgets the records.
  void KillOrphans(const std::string& job_id, const std::vector<StoredRank>& ranks,
                   const std::string& what);
  // `reason` plus "(after K restarts; train.max_restarts is M)" when
  // restarts are allowed: the message of a job that failed for good.
  static std::string FailureMessage(const JobRt& rt, const std::string& reason);
  void Loop();
  void Tick();
  void Flush(Outbox* out);
  // Shutdown/Detach after stop_thread_ is set: sends `out`, joins the tick
  // and trial threads. Called without mu_.
  void StopThreads(Outbox* out);

  // All below: mu_ held.
  void Event(JobRt* rt, v1::JobState state, const std::string& kind, const std::string& message,
             bool set_state);
  // Logs a recorded event and sends it to the job's watchers.
  void Announce(JobRt* rt, const absl::StatusOr<v1::JobEvent>& ev);
  void Publish(const std::string& id, const v1::WatchJobResponse& u);
  void Finish(JobRt* rt, v1::JobState state, const std::string& message);
  // Keeps `snap` among the last kRememberFinished finished jobs; the /metrics
  // series of the one it pushes out are dropped.
  void RememberFinished(const v1::Job& snap);
  void Schedule(JobRt* rt, Outbox* out);
  // Where `plan`'s ranks of rt go (node, GPU), or why not yet ("waiting for
  // capacity: ..."): a named node not connected, or a GPU held by a running
  // job or by a job timing tuning trials. mu_ held.
  bool Place(const JobRt* rt, const v1::Plan& plan, std::vector<RankRt>* placed,
             std::string* why);
  // Launches `plan`'s ranks of rt at rt->attempt (rt->plan for the job
  // itself, a candidate for a trial).
  bool Launch(JobRt* rt, const v1::Plan& plan, Outbox* out, std::string* why);
  // True while a trial of rt runs its ranks (they are then welcome though
  // the job is PLANNING).
  static bool TrialRunning(const JobRt& rt) { return rt.trials && rt.trials->active; }
  // True while rt's ranks may call in (assignment, heartbeats, exits): the
  // job runs, or one of its tuning trials does.
  static bool RanksWelcome(const JobRt& rt) {
    return rt.state == v1::RUNNING || TrialRunning(rt);
  }
  // Starts the planning thread of a tuning.mode trial job. mu_ held.
  void StartTrials(JobRt* rt, const std::vector<v1::Topology>& topo,
                   const std::vector<RankRt>& placement);
  // The planning thread: plans with the trials, then hands the plan to the
  // job (or fails it). mu_ NOT held.
  void TrialPlanning(std::string id, v1::JobSpec spec, std::vector<v1::Topology> topo,
                     std::shared_ptr<Trials> st);
  // One trial (the TrialRunner of the planning thread): launches `candidate`
  // as a short run of the job (TrialSpec), waits for its ranks to end (or
  // stops them at the budget), returns the median of their timed steps.
  // mu_ NOT held.
  absl::StatusOr<double> RunTrial(const std::string& id, const std::shared_ptr<Trials>& st,
                                  const v1::Plan& candidate, double budget_s);
  class JobTrialRunner;
  // Joins the trial planning threads that are done (all: every one; the
  // jobs must have been cancelled first). mu_ NOT held.
  void JoinTrialThreads(bool all);
  void BeginStop(JobRt* rt, StopAction action, const std::string& message, Outbox* out);
  // Queues a stop of rt to each connected node that holds one of its ranks
  // (live_only: a rank that has not exited); returns those nodes.
  std::set<std::string> QueueStop(const JobRt& rt, bool live_only, Outbox* out);
  // Queues StopRanks for job `job_id` to each of `nodes` that is connected
  // (only its ranks of `attempts` when not empty).
  void QueueStopOn(const std::string& job_id, const std::set<std::string>& nodes, Outbox* out,
                   const std::set<int>& attempts = {});
  // "rank R on node N made no progress for T s ..." for the first rank of rt
  // that has not exited and was last heard from more than
  // heartbeat_timeout_s before `now`; "" when none. mu_ held.
  std::string StallOf(const JobRt& rt, Clock::time_point now) const;
  void CompleteStop(JobRt* rt, Outbox* out);
  void RankFailed(JobRt* rt, int rank, const std::string& reason, Outbox* out);
  v1::Job Snapshot(const JobRt& rt);
  void FillProgress(const JobRt& rt, v1::Job* job);
  void Persist(JobRt* rt);
  std::vector<v1::Topology> ConnectedTopologies();
  // Plans `spec`; when the store holds a `dgca diagnose comm` measurement
  // for the plan's node set, backend and ranks, plans again with it (the
  // reasons then cite it). With `trials` (tuning.mode trial), the final plan
  // times its candidates through it. Needs no lock (the store is
  // thread-safe). Added by R2-A.
  absl::StatusOr<v1::Plan> PlanMeasured(const v1::JobSpec& spec,
                                        const std::vector<v1::Topology>& topo,
                                        TrialRunner* trials = nullptr);
  // Adds the newest `dgca diagnose comm` rows for (node_set, backend,
  // ranks) to *meas; false when there are none.
  bool AddCommMeasurement(const std::string& node_set, const v1::Plan& plan,
                          PlannerMeasurements* meas);
  static std::string NodeSetKey(const JobRt& rt);
  // "node_set|backend|ranks": the all-reduce measurements' key.
  static std::string CommKey(const std::string& node_set, const v1::Plan& plan);
  // Medians of the job's steady-state steps against its plan; stores the
  // compute time for later plans and logs a "plan" event. mu_ held.
  void CheckPlan(JobRt* rt, v1::JobState final_state);
  // The plan re-checked from live metrics, once, as soon as the job has
  // LiveCheckSamples steady-state rank-steps covering at least
  // kLiveCheckSecondsPerRank of step time per rank: measured step time against
  // the prediction, exposed communication against kTargetCommShare, and
  // what would meet the target (the global batch: at a fixed global batch
  // accumulation moves compute between micro-steps but not the share). An
  // event "plan" ("live check ..."), with the memory finding when a rank
  // is above its target. mu_ held.
  void LiveCheck(JobRt* rt);
  std::string CheckpointDir(const std::string& id) const;

  SchedulerOptions opt_;
  MetricsHub* hub_;
  std::unique_ptr<JobStore> store_;
  RendezvousStore rendezvous_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::unique_ptr<JobRt>> jobs_;       // active jobs
  std::map<std::string, v1::Job> finished_;                    // recent finished snapshots
  std::deque<std::string> finished_order_;
  std::map<std::string, Node> nodes_;
  // Node -> ranks of stopped attempts that never reported their end (their
  // node was away when the stop completed); sent to the node's agent to
  // adopt and stop when it registers again. Guarded by mu_.
  std::map<std::string, std::vector<v1::RunningRank>> orphans_;
  std::vector<StoredRank> recovered_ranks_;
  // Trial planning threads; joined once done (Tick) or at Shutdown.
  std::vector<std::pair<std::shared_ptr<Trials>, std::thread>> trial_threads_;
  std::condition_variable trial_cv_;  // trial ranks' samples and exits
  std::map<std::string, std::list<std::shared_ptr<WatchSubscription>>> watchers_;
  std::atomic<bool> shutting_down_{false};
  bool stop_thread_ = false;
  bool wake_ = false;
  std::thread thread_;
  Clock::time_point last_counts_;
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_SCHEDULER_H_
