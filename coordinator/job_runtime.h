// The runtime state of an active job as the scheduler keeps it in memory
// (what the job store does not hold: where each rank runs, when it was last
// heard from, the stop under way, the step samples of the plan check), and
// pure functions over it.
//
// Thread-safety: plain data. The scheduler guards every JobRt with its
// mutex (coordinator/scheduler.h); the functions here take no locks.
#ifndef DGCA_COORDINATOR_JOB_RUNTIME_H_
#define DGCA_COORDINATOR_JOB_RUNTIME_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/clock.h"
#include "coordinator/loss_curve.h"
#include "dgca/v1/agent.pb.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/plan.pb.h"
#include "planner/diagnosis.h"

namespace dgca {

// kReplan: a stop at a checkpoint to move the job to a new plan
// (coordinator/replan.h); not a failure, not counted against max_restarts.
// kResume: a restart after ranks lost this coordinator for longer than their
// outage limit (exit code 3 after training steps); not counted in restarts.
enum class StopAction { kNone, kRestart, kFail, kCancel, kReplan, kResume };
// "cancel", "restart", "failure", "re-plan", "resume" (the word in "stop"
// events).
const char* StopActionName(StopAction a);

struct RankRt {
  std::string node;
  int local_device = -1;  // GPU on its node; -1 for CPU ranks
  v1::RankProgress progress;
  bool exited = false;
  Clock::TimePoint last_progress;  // last heartbeat, step or assignment
  int step_samples = 0;            // step metrics received from this rank (this attempt)
  // Its training thread's phase as its last heartbeat said (UNSPECIFIED
  // until one does; never persisted: after a coordinator restart it waits
  // for the next heartbeat), received at phase_at; the interval it sends
  // heartbeats at. coordinator/hang_check.h.
  v1::RankPhase phase;
  Clock::TimePoint phase_at;
  double heartbeat_interval_s = 0;
  // When its last step metrics came (they stream every step, heartbeats
  // every 2 s: a rank frozen between two heartbeats finished steps its last
  // phase report does not know of).
  Clock::TimePoint last_step_at;

  // Moves every "last heard of" time above `gap` later (those set): the
  // coordinator itself did not run for that long (Scheduler::ExcuseOwnPause),
  // so neither the stall check nor the hang check counts it against the rank.
  void Excuse(std::chrono::steady_clock::duration gap) {
    for (Clock::TimePoint* t : {&last_progress, &phase_at, &last_step_at}) {
      if (*t != Clock::TimePoint()) *t += gap;
    }
  }
};

// A stop of the job's ranks under way (cancel, failure, restart).
struct StopState {
  StopAction action = StopAction::kNone;
  std::string message;
  Clock::TimePoint started;
  Clock::TimePoint deadline;  // complete the stop by then even if ranks are silent
  // Abnormal exits of other ranks that arrived while stopping and were not
  // caused by our StopRanks (e.g. the rank whose death made the reported
  // one fail): named in the final message.
  std::vector<std::string> other_failures;
};

// Steady-state steps of every rank, for the plan check and `dgca diagnose`:
// the latest kMaxStepSamples (a ring once full).
struct StepStats {
  static constexpr size_t kMaxStepSamples = 20000;
  std::vector<StepSample> samples;
  size_t seen = 0;            // every sample ever added
  double seconds_seen = 0;    // their step times, summed
  // What the ranks report running (StepMetrics.attention_kernels: "fused"
  // or "gemm"; every rank takes rank 0's choice): an "auto" plan's peak
  // memory is stored under the kernels that ran. "" = not reported.
  std::string attention_kernels;
  // The ranks reported both over the job (a restarted attempt timed the
  // attention again and kept the other): its peak is filed under neither.
  bool attention_mixed = false;

  void Add(const StepSample& s, double step_seconds, const std::string& kernels);
};

// tuning.mode trial: the planner's candidates, each timed as a short run of
// the job on its ranks (attempt = the job's attempt then), from a planning
// thread of its own (coordinator/scheduler_trials.cc). Shared between that
// thread and the scheduler; every field is read and written under the
// scheduler's mutex.
struct TrialState {
  bool active = false;     // a trial's ranks run now
  bool done = false;       // the planning thread has finished
  bool cancelled = false;  // the job ended (cancel, shutdown): no more trials
  int index = 0;           // trials started
  v1::Plan plan;           // the candidate being timed
  std::vector<StepSample> steps;  // its timed steps (after the warmup), every rank
  std::string failure;     // why it failed ("" while none)
  // Measured exposed-communication share (median) per timed candidate, by
  // CandidateLabel: the kept one's becomes the plan's prediction.
  std::map<std::string, double> comm_share;
  Clock::TimePoint wall_deadline;  // spec.tuning.budget_s from the first trial
  // Node and GPU (-1: none) of each rank, held from the first trial to the
  // job's launch.
  std::vector<std::pair<std::string, int>> placement;
};

struct JobRt {
  std::string id;
  v1::JobSpec spec;
  // The files its ranks read, located in its spec (spec/spec_files.h);
  // every LaunchRank carries them for the agent to check.
  std::vector<v1::InputFile> inputs;
  v1::Plan plan;
  bool planned = false;
  v1::JobState state = v1::PENDING;
  std::string message;
  int attempt = 0;
  int restarts = 0;
  std::vector<RankRt> ranks;
  StopState stop;
  StepStats steps;
  std::map<std::string, double> eval;
  LossCurve loss_curve;     // Job.loss_curve
  v1::PlanCheck plan_check;
  bool live_checked = false;  // the live plan check ran
  // A restart waiting for capacity (a node of the plan not connected when
  // the stop completed): its "restart" event, recorded at the launch.
  std::string restart_pending;
  Clock::TimePoint restart_wait_deadline;
  Clock::TimePoint launched;
  Clock::TimePoint last_persist;
  Clock::TimePoint last_snapshot;
  bool dirty = false;                   // progress not persisted yet
  std::shared_ptr<TrialState> trials;   // tuning.mode trial, while planning
  // launcher: slurm (docs/slurm.md): the attempt whose allocation the job
  // uses now (-1 before its first), and what Slurm last said of it.
  int allocation_attempt = -1;
  v1::LauncherStatus launcher;
  // A step every rank checkpoints after (a time limit's warning, a
  // re-plan); 0 = none.
  int64_t checkpoint_at = 0;
  // The plan the job moves to once the checkpoint at checkpoint_at is
  // written (coordinator/replan.h); at most once per job (replanned).
  std::optional<v1::Plan> replan;
  bool replanned = false;
  // Job.final_loss and its N and ranks, from the ranks' TrainFinished.
  std::optional<double> final_loss;
  int final_loss_steps = 0;
  int final_loss_ranks = 0;
  // The first rank of the current attempt whose end was a failure (not
  // our own stop): the job's exit if it fails (Job.exit). Cleared by each
  // launch.
  std::optional<v1::JobExit> rank_failure;
  // Job.exit, set when the job ends (ExitOf).
  std::optional<v1::JobExit> exit;
  double peak_memory_bytes = 0;  // Job.peak_memory_bytes
};

// The memory a step sample says its rank holds: the GPU's used memory for
// a rank with a GPU (local_device >= 0) when reported, else the process's
// peak resident set; 0 when neither is reported.
double RankMemoryOf(const v1::StepMetrics& m, int local_device);

// Job.exit of a job ending in `state`: rank -1 code 0 for SUCCEEDED; the
// recorded rank failure (rt.rank_failure) for FAILED when there is one;
// else rank -1 with failed set.
v1::JobExit ExitOf(const JobRt& rt, v1::JobState state);

// Whether the job's ranks run in a Slurm allocation (resources.launcher).
bool UsesSlurm(const v1::JobSpec& spec);
// The node set its measurements are filed under: the ranks' nodes for local
// jobs; for Slurm jobs "slurm:PARTITION:N" (allocations land on different
// nodes of one partition, whose measurements carry over).
std::string MeasurementNodeSet(const JobRt& rt);
std::string SlurmNodeSet(const v1::JobSpec& spec);

// The GPU (on its node) the plan gives rank r; -1 for CPU ranks.
int PlannedDevice(const v1::Plan& plan, int r);
// Rank `rank` of rt's current attempt, as an agent lists or adopts it.
v1::RunningRank RunningRankOf(const JobRt& rt, int rank);
// True while a trial of rt runs its ranks (they are then welcome though the
// job is PLANNING).
bool TrialRunning(const JobRt& rt);
// True while rt's ranks may call in (assignment, heartbeats, exits): the
// job runs, or one of its tuning trials does.
bool RanksWelcome(const JobRt& rt);
bool AllRanksExited(const JobRt& rt);
// Sorted unique node names of rt's ranks, ","-joined.
std::string NodeSetKey(const JobRt& rt);
// `reason` with "(after K restarts; train.max_restarts is M)" when restarts
// are allowed, after its headline and before any "; last output:" lines:
// the message of a job that failed for good.
std::string FailureMessage(const JobRt& rt, const std::string& reason);
// "rank R on node N made no progress for T s ..., last in <phase>" for the
// first rank of rt that has not exited and was last heard from more than
// `timeout_s` before `now`; "" when none.
std::string StallOf(const JobRt& rt, Clock::TimePoint now, double timeout_s);
// The job's progress as Job carries it: step = min over ranks,
// samples_per_second = sum over running ranks, loss = mean,
// eta = (steps - step) x mean step_seconds, and every rank's progress
// (heartbeat age and phase against `now`), eval, plan check, loss curve,
// final loss, exit (once ended) and peak memory.
void FillProgress(const JobRt& rt, Clock::TimePoint now, v1::Job* job);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_JOB_RUNTIME_H_
