// Scheduler: the lifecycle (coordinator/scheduler.h). Submit, the tick,
// planning and placement, launches, stops, restarts and the end of a job.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "coordinator/hang_check.h"
#include "coordinator/measured_planning.h"
#include "coordinator/plan_checks.h"
#include "coordinator/recovery.h"
#include "coordinator/tuning_trials.h"
#include "planner/plan_format.h"
#include "spdlog/spdlog.h"
#include "spec/spec.h"
#include "spec/spec_files.h"

namespace dgca {
namespace {

// Finished jobs whose per-rank progress and /metrics series are kept.
constexpr size_t kRememberFinished = 64;

}  // namespace

Scheduler::Scheduler(SchedulerOptions options, MetricsHub* hub, std::unique_ptr<JobStore> store)
    : opt_(std::move(options)),
      clock_(opt_.clock ? opt_.clock : Clock::Real()),
      hub_(hub),
      store_(std::move(store)) {
  absl::MutexLock l(&mu_);
  placement_ = std::make_unique<AgentPlacement>(&nodes_);
  slurm_ = std::make_unique<SlurmLauncher>(
      Slurm(opt_.slurm), store_.get(),
      [this] {
        absl::MutexLock wake(&mu_);
        Wake();
      },
      opt_.slurm_poll_s);
}

void Scheduler::ConfigureLaunchers(LauncherOptions options) {
  absl::MutexLock l(&mu_);
  launchers_ = std::move(options);
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(SchedulerOptions options,
                                                             MetricsHub* hub) {
  auto store = JobStore::Open(options.state_dir + "/dgca.db");
  if (!store.ok()) return store.status();
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(options), hub, std::move(*store)));
  absl::Status st = s->Recover();
  if (!st.ok()) return st;
  return s;
}

Scheduler::~Scheduler() {
  slurm_.reset();  // its thread first: it calls back into the scheduler
  {
    absl::MutexLock l(&mu_);
    stop_thread_ = true;
    for (auto& [id, rt] : jobs_) {
      if (rt->trials) rt->trials->cancelled = true;
    }
    wake_cv_.SignalAll();
    trial_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  JoinTrialThreads(/*all=*/true);
}

absl::Status Scheduler::Recover() {
  auto recovered = RecoverJobs(store_.get(), Now());
  if (!recovered.ok()) return recovered.status();
  absl::MutexLock l(&mu_);
  const auto now = Now();
  for (RecoveredJob& r : *recovered) {
    if (r.kind == RecoveredJob::kFail) {
      spdlog::warn("job {} was RUNNING when the coordinator stopped and cannot be re-adopted "
                   "({}); marked FAILED", r.stored.id(), r.fail_reason);
      hub_->SetJobState(r.stored.id(), v1::FAILED);  // DgcaJobFailed sees it
      RememberFinished(r.stored);
      continue;
    }
    JobRt* rt = r.rt.get();
    jobs_[rt->id] = std::move(r.rt);
    if (UsesSlurm(rt->spec)) {
      // Its allocations are in the store: the newest is polled again, never
      // asked for twice (docs/slurm.md).
      auto allocations = store_->Allocations(rt->id);
      if (allocations.ok() && !allocations->empty()) {
        const AllocationRecord& last = allocations->back();
        rt->allocation_attempt = last.attempt;
        rt->attempt = std::max(rt->attempt, last.attempt);
        slurm_->Track(rt->id, last.attempt, last.allocation_id, last.script);
        rt->launcher.set_kind("slurm");
        rt->launcher.set_job_id(last.allocation_id);
        rt->launcher.set_script(last.script);
      }
    }
    if (r.kind == RecoveredJob::kRequeue) {
      Event(rt, v1::PENDING, r.stored_state == v1::PLANNING ? "state" : "info",
            "coordinator restarted; queued again", true);
      continue;
    }
    std::vector<std::string> adopted;
    for (const StoredRank& sr : r.adopted) {
      recovered_ranks_.push_back(sr);
      adopted.push_back(absl::StrCat(sr.rank, "@", sr.node, ":", sr.pid));
    }
    hub_->SetJobState(rt->id, v1::RUNNING);
    Event(rt, v1::RUNNING, "info",
          absl::StrCat("coordinator restarted; re-adopting attempt ", rt->attempt,
                       " (rank@node:pid ", adopted.empty() ? "none" : absl::StrJoin(adopted, " "),
                       "); a rank with no heartbeat or step within ", opt_.heartbeat_timeout_s,
                       " s counts as stalled"),
          false);
    if (!r.stop.has_value() && adopted.empty()) {
      Finish(rt, v1::SUCCEEDED, absl::StrCat("all ", rt->ranks.size(), " ranks exited 0"));
      continue;
    }
    if (!r.stop.has_value()) continue;
    // A stop that was under way (cancel, failure, restart) goes on: each
    // agent gets StopRanks when it registers again (AgentRegistered), and
    // it completes once every rank has exited.
    rt->stop.action = r.stop->action;
    rt->stop.message =
        r.stop->action == StopAction::kFail ? FailureMessage(*rt, r.stop->message) : r.stop->message;
    rt->stop.started = now;
    // Time for the agents to come back, then the usual grace.
    rt->stop.deadline = now + Seconds(opt_.heartbeat_timeout_s + opt_.stop_grace_s + 5);
    Event(rt, rt->state, "info",
          absl::StrCat("the coordinator restarted while stopping the job (",
                       StopActionName(r.stop->action),
                       "); its ranks are stopped again as their agents reconnect"),
          false);
  }
  return absl::OkStatus();
}

std::vector<StoredRank> Scheduler::RecoveredRanks() {
  absl::MutexLock l(&mu_);
  return recovered_ranks_;
}

void Scheduler::Start() {
  slurm_->Start();
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Shutdown() {
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    if (shutting_down_.exchange(true)) return;
    std::vector<JobRt*> active;
    for (auto& [id, rt] : jobs_) active.push_back(rt.get());
    for (JobRt* rt : active) {
      QueueStop(*rt, /*live_only=*/false, &out);
      Finish(rt, v1::FAILED, "coordinator shut down");
    }
    out.insert(out.end(), deferred_.begin(), deferred_.end());
    deferred_.clear();
    stop_thread_ = true;
  }
  StopThreads(&out);
  slurm_->CancelAll();  // the ended jobs' allocations, now rather than later
}

void Scheduler::Detach() {
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    if (shutting_down_.exchange(true)) return;
    for (auto& [id, rt] : jobs_) {
      if (rt->trials) {
        rt->trials->cancelled = true;
        // Its trial ranks; recovery would kill them, planning starts over.
        if (rt->trials->active) QueueStop(*rt, /*live_only=*/true, &out);
      }
      if (rt->state != v1::RUNNING) continue;
      Persist(rt.get());
      Event(rt.get(), rt->state, "info",
            absl::StrCat("coordinator shutting down, keeping the job: its ranks train on and are "
                         "re-adopted by a coordinator started on this state dir within ",
                         opt_.heartbeat_timeout_s, " s (later, they stop by themselves, which "
                         "counts as a rank failure: a restart from the last checkpoint while "
                         "train.max_restarts allows)"),
            false);
    }
    stop_thread_ = true;
  }
  StopThreads(&out);
}

void Scheduler::StopThreads(Outbox* out) {
  {
    absl::MutexLock l(&mu_);
    wake_cv_.SignalAll();
    trial_cv_.SignalAll();
  }
  Flush(out);
  if (thread_.joinable()) thread_.join();
  JoinTrialThreads(/*all=*/true);
}

void Scheduler::Flush(Outbox* out) {
  for (auto& [conn, cmd] : *out) {
    if (!conn->Send(cmd)) spdlog::warn("could not send a command to an agent (stream closed)");
  }
  out->clear();
}

void Scheduler::Loop() {
  // Real time, whatever clock_ is: a pause of this process (ExcuseOwnPause).
  auto last = std::chrono::steady_clock::now();
  mu_.Lock();
  while (!stop_thread_) {
    if (!wake_) wake_cv_.WaitWithTimeout(&mu_, absl::Seconds(opt_.tick_s));
    if (stop_thread_) break;
    wake_ = false;
    const auto real_now = std::chrono::steady_clock::now();
    ExcuseOwnPause(real_now - last);
    last = real_now;
    mu_.Unlock();
    Tick();
    mu_.Lock();
  }
  mu_.Unlock();
}

JobRt* Scheduler::FindJob(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

std::string Scheduler::CheckpointDir(const std::string& id) const {
  return absl::StrCat(opt_.state_dir, "/jobs/", id, "/checkpoints");
}

void Scheduler::Event(JobRt* rt, v1::JobState state, const std::string& kind,
                      const std::string& message, bool set_state) {
  absl::StatusOr<v1::JobEvent> ev = set_state ? store_->SetState(rt->id, state, message, kind)
                                              : store_->AppendEvent(rt->id, kind, message);
  if (ev.ok() && set_state) {
    rt->state = state;
    rt->message = message;
    hub_->SetJobState(rt->id, state);
  }
  Announce(rt, ev);
}

void Scheduler::Announce(JobRt* rt, const absl::StatusOr<v1::JobEvent>& ev) {
  if (!ev.ok()) {
    spdlog::error("job {}: cannot record event: {}", rt->id, ev.status().ToString());
    return;
  }
  spdlog::info("job {}: [{}] {} {}", rt->id, ev->kind(), v1::JobState_Name(rt->state),
               ev->message());
  v1::WatchJobResponse u;
  *u.mutable_event() = *ev;
  watch_.Publish(rt->id, u);
  last_counts_ = Clock::TimePoint();  // refresh dgca_jobs soon
}

v1::Job Scheduler::Snapshot(const JobRt& rt) {
  auto stored = store_->GetJob(rt.id);
  v1::Job j = stored.ok() ? stored->job : v1::Job();
  j.set_id(rt.id);
  j.set_state(rt.state);
  j.set_message(rt.message);
  FillProgress(rt, Now(), &j);
  return j;
}

void Scheduler::Persist(JobRt* rt) {
  v1::Job p;
  FillProgress(*rt, Now(), &p);
  absl::Status s = store_->SetProgress(rt->id, p);
  if (!s.ok()) spdlog::warn("job {}: cannot persist progress: {}", rt->id, s.ToString());
  rt->last_persist = Now();
  rt->dirty = false;
  int64_t total = std::max<int64_t>(1, p.total_steps());
  hub_->SetJobProgress(rt->id, std::min(1.0, static_cast<double>(p.step()) / total),
                       p.eta_seconds(), p.samples_per_second(), p.total_steps());
}

void Scheduler::RememberFinished(const v1::Job& snap) {
  finished_[snap.id()] = snap;
  finished_order_.push_back(snap.id());
  while (finished_order_.size() > kRememberFinished) {
    finished_.erase(finished_order_.front());
    hub_->RemoveJob(finished_order_.front());  // bounded /metrics series
    finished_order_.erase(finished_order_.begin());
  }
}

void Scheduler::Finish(JobRt* rt, v1::JobState state, const std::string& message) {
  if (rt->trials) {
    rt->trials->cancelled = true;  // its planning thread stops trying
    trial_cv_.SignalAll();
  }
  if (rt->planned && rt->spec.kind() != "comm_probe") {
    const PlanReview review =
        ReviewPlan(rt->id, rt->spec, rt->plan, rt->steps.samples, MeasurementNodeSet(*rt), state,
                   rt->steps.attention_kernels, rt->steps.attention_mixed, NowUnixMs());
    if (review.check.samples() > 0) {
      rt->plan_check = review.check;
      Event(rt, rt->state, "plan", RecordReview(store_.get(), review), false);
    }
  }
  // The job has ended: a rank whose exit was not seen (a shutdown or a
  // cancel stops the ranks without waiting for them) is stored "stopped",
  // not "running" with a fresh heartbeat for ever.
  for (RankRt& r : rt->ranks) {
    if (r.exited) continue;
    r.exited = true;
    r.progress.set_state("stopped");
  }
  // Its allocation is given back below (ReleaseAllocation): what Slurm said
  // last is history from here on.
  if (UsesSlurm(rt->spec) && rt->launcher.kind() == "slurm") {
    rt->launcher.set_state("RELEASED");
    rt->launcher.clear_reason();
  }
  rt->exit = ExitOf(*rt, state);
  Persist(rt);
  Event(rt, state, "state", message, true);
  rendezvous_.ClearJob(rt->id);
  (void)store_->ClearRanks(rt->id);
  v1::Job snap = Snapshot(*rt);
  v1::WatchJobResponse u;
  *u.mutable_snapshot() = snap;
  watch_.Publish(rt->id, u);
  // The state series follows even when the store could not record it (a
  // full disk): the job has ended here either way, and a RUNNING series
  // whose steps stopped would read as a stalled job.
  hub_->SetJobState(rt->id, state);
  // Its live series (steps, samples/s, step time, ETA...) go; its final
  // loss and peak memory stay as gauges of the ended job (docs/metrics.md).
  hub_->EndJob(rt->id, rt->final_loss, rt->peak_memory_bytes);
  if (UsesSlurm(rt->spec)) {
    ReleaseAllocation(rt, absl::StrCat("job ", rt->id, " is ", v1::JobState_Name(state)));
  }
  RememberFinished(snap);
  const std::string id = rt->id;
  jobs_.erase(id);  // rt is gone from here on
}

// --- Submit ------------------------------------------------------------------

absl::StatusOr<v1::SubmitJobResponse> Scheduler::Submit(const v1::SubmitJobRequest& req) {
  v1::SubmitJobResponse resp;
  auto parsed = ParseJobSpec(req.spec_yaml(), req.spec_path());
  if (!parsed.ok()) return parsed.status();
  parsed->spec.set_base_dir(req.base_dir());
  *resp.mutable_spec() = parsed->spec;
  if (!parsed->ok()) {
    for (auto& p : parsed->problems) *resp.add_problems() = p;
    return resp;
  }
  // The files the spec names (spec/spec_files.h). Where only this node runs
  // ranks, a missing one is refused now, with the rest of them and each
  // one's line:column, rather than failing the job's ranks one NOT_FOUND at
  // a time; the agents check them again before each launch (the only check
  // for ranks on other nodes, and for Slurm's, which never run here).
  // Only while this node is the only one connected: with others, the job
  // may run where its files are (a GPU node's /scratch), and their agents
  // check there before the ranks start.
  std::vector<v1::InputFile> inputs = SpecInputFiles(req.spec_yaml(), parsed->spec);
  bool only_here = !opt_.input_check_node.empty();
  if (only_here) {
    absl::MutexLock l(&mu_);
    for (const v1::Topology& t : nodes_.ConnectedTopologies()) {
      only_here = only_here && t.node() == opt_.input_check_node;
    }
  }
  if (only_here && !UsesSlurm(parsed->spec)) {
    for (auto& p : CheckInputFiles(
             inputs, absl::StrCat("on node ", opt_.input_check_node, ", the coordinator's"))) {
      *resp.add_problems() = std::move(p);
    }
    if (resp.problems_size() > 0) return resp;
  }
  if (req.validate_only()) return resp;
  if (UsesSlurm(parsed->spec)) {
    if (req.dry_run()) {
      if (absl::Status st = DryRunSlurm(parsed->spec, &resp); !st.ok()) return st;
      return resp;
    }
    if (absl::Status st = CheckSlurmSpec(parsed->spec); !st.ok()) return st;
  } else if (req.dry_run()) {
    std::vector<v1::Topology> topo;
    {
      absl::MutexLock l(&mu_);
      topo = nodes_.ConnectedTopologies();
    }
    if (topo.empty()) {
      return absl::FailedPreconditionError(
          "no node agent is connected, so there is nothing to plan against; start dgca-worker "
          "agent or the local agent");
    }
    auto plan = PlanMeasured(store_.get(), parsed->spec, topo, nullptr, "", nullptr, BaseMeasurements());
    if (!plan.ok()) return plan.status();
    *resp.mutable_plan() = *plan;
    return resp;
  }
  if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
  auto job = store_->CreateJob(parsed->spec, req.spec_yaml());
  if (!job.ok()) return job.status();
  resp.set_job_id(job->id());
  {
    absl::MutexLock l(&mu_);
    auto rt = std::make_unique<JobRt>();
    rt->id = job->id();
    rt->spec = parsed->spec;
    rt->inputs = std::move(inputs);
    rt->state = v1::PENDING;
    rt->message = "submitted";
    hub_->SetJobState(rt->id, rt->state);
    jobs_[rt->id] = std::move(rt);
    last_counts_ = Clock::TimePoint();
    Wake();
  }
  spdlog::info("job {} submitted ({})", job->id(), parsed->spec.name());
  return resp;
}

absl::StatusOr<v1::PlanJobResponse> Scheduler::PlanJob(const v1::PlanJobRequest& req) {
  v1::SubmitJobRequest s;
  s.set_spec_yaml(req.spec_yaml());
  s.set_spec_path(req.spec_path());
  s.set_base_dir(req.base_dir());
  s.set_dry_run(true);
  auto r = Submit(s);
  if (!r.ok()) return r.status();
  v1::PlanJobResponse out;
  *out.mutable_plan() = r->plan();
  *out.mutable_problems() = r->problems();
  *out.mutable_spec() = r->spec();
  out.set_launcher_script(r->launcher_script());
  *out.mutable_launcher_notes() = r->launcher_notes();
  return out;
}

absl::StatusOr<v1::Job> Scheduler::Cancel(const std::string& id, std::chrono::milliseconds wait,
                                           bool* already_ended) {
  if (already_ended != nullptr) *already_ended = false;
  auto stored = store_->GetJob(id);
  if (!stored.ok()) return stored.status();
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    JobRt* rt = FindJob(id);
    if (rt == nullptr) {
      // Ended already: nothing to cancel, and no error (scripts cancel what
      // may have finished meanwhile).
      if (already_ended != nullptr) *already_ended = true;
      return stored->job;
    }
    if (rt->state != v1::RUNNING) {
      if (TrialRunning(*rt)) QueueStop(*rt, /*live_only=*/true, &out);  // a trial's ranks
      Finish(rt, v1::CANCELLED, "cancelled by user");
    } else if (rt->stop.action != StopAction::kCancel) {
      BeginStop(rt, StopAction::kCancel, "cancelled by user", &out);
    }
  }
  Flush(&out);
  // The caller's deadline is real time, whatever clock the scheduler keeps.
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline && !IsTerminal(id)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto job = GetJob(id);
  if (!job.ok()) return job.status();
  return job->job();
}

bool Scheduler::IsTerminal(const std::string& id) {
  absl::MutexLock l(&mu_);
  return FindJob(id) == nullptr;
}

absl::Status Scheduler::CheckCurrentAttempt(const std::string& id, int32_t attempt) {
  absl::MutexLock l(&mu_);
  const JobRt* rt = FindJob(id);
  if (rt == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is not running; its rendezvous store is gone"));
  }
  if (rt->attempt != attempt) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attempt ", attempt, " of job ", id, " is over (the job runs attempt ", rt->attempt,
        "); its rendezvous store is gone"));
  }
  return absl::OkStatus();
}

// --- The tick ----------------------------------------------------------------

void Scheduler::ExcuseOwnPause(std::chrono::steady_clock::duration gap) {
  // Loop wakes every tick_s; a gap of seconds is this process not running
  // (SIGSTOP, a VM paused, swapped out). Ranks and agents kept beating into
  // a socket nobody read: their silence is excused, not counted as a stall.
  const double s = std::chrono::duration<double>(gap).count();
  if (s < std::max(5.0, 20 * opt_.tick_s)) return;
  spdlog::warn("the coordinator did not run for {:.1f} s (stopped or starved); ranks' and "
               "agents' silence over that time is not counted",
               s);
  for (auto& [id, rt] : jobs_) {
    for (RankRt& rr : rt->ranks) rr.Excuse(gap);
  }
  nodes_.Excuse(gap);
}

void Scheduler::Tick() {
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    if (shutting_down_) return;
    out.swap(deferred_);
    const auto now = Now();
    std::vector<std::string> ids;
    for (auto& [id, rt] : jobs_) ids.push_back(id);
    for (const std::string& id : ids) {
      JobRt* rt = FindJob(id);
      if (rt == nullptr) continue;
      if (rt->state == v1::PENDING || rt->state == v1::PLANNING) {
        Schedule(rt, &out);
        continue;
      }
      if (rt->state != v1::RUNNING) continue;
      if (rt->stop.action != StopAction::kNone) {
        if (AllRanksExited(*rt) || now >= rt->stop.deadline) CompleteStop(rt, &out);
        continue;
      }
      if (std::string stall = StallOf(*rt, now, opt_.heartbeat_timeout_s); !stall.empty()) {
        RankFailed(rt, stall, &out);
      } else if (std::string hang = TrialRunning(*rt) ? std::string()
                                    : ProgressStallOf(*rt, now, ProgressTimeoutOf(rt->spec.train()));
                 !hang.empty()) {
        // train.progress_timeout_s: a rank stopped advancing (hang_check.h).
        RankFailed(rt, hang, &out);
      } else if (ReplanCheckpointWritten(*rt)) {
        BeginStop(rt, StopAction::kReplan,
                  absl::StrCat("re-plan at the checkpoint of step ", rt->checkpoint_at), &out);
      } else if (UsesSlurm(rt->spec)) {
        // Slurm took the allocation back (a node failed, an agent was
        // killed, the time limit): its ranks went with it.
        const auto a = slurm_->Get(rt->id, rt->allocation_attempt);
        if (a.has_value()) SyncLauncher(rt, *a);
        if (a.has_value() && a->submitted && a->gone) {
          RankFailed(rt,
                     absl::StrCat("Slurm job ", a->id, " ended (", a->state.empty() ? "gone" : a->state,
                                  ") while the job ran: its agents and ranks are gone (Slurm's "
                                  "output: ", launchers_.state_dir, "/jobs/", rt->id, "/slurm-",
                                  a->id, ".out)"),
                     &out);
        }
      }
      rt = FindJob(id);
      if (rt == nullptr) continue;
      if (now - rt->last_snapshot > std::chrono::seconds(1)) {
        rt->last_snapshot = now;
        if (watch_.HasWatchers(id)) {
          v1::WatchJobResponse u;
          *u.mutable_snapshot() = Snapshot(*rt);
          watch_.Publish(id, u);
        }
      }
      if (rt->dirty && now - rt->last_persist > std::chrono::seconds(5)) Persist(rt);
    }
    for (const std::string& name : nodes_.MarkSilent(now, opt_.agent_timeout_s)) {
      spdlog::warn("node {} has sent no heartbeat for more than {:.0f} s (frozen or hung?): no "
                   "ranks are placed on it until it is heard again (--agent-timeout)",
                   name, opt_.agent_timeout_s);
    }
    for (const auto& [name, n] : nodes_.nodes()) {
      hub_->SetHeartbeatAge(name, SecondsBetween(n.last_heartbeat, now), n.conn != nullptr);
    }
    if (now - last_counts_ > std::chrono::seconds(2)) {
      last_counts_ = now;
      auto counts = store_->CountByState();
      if (counts.ok()) hub_->SetJobCounts(*counts);
    }
  }
  Flush(&out);
  JoinTrialThreads(/*all=*/false);
}

void Scheduler::Schedule(JobRt* rt, Outbox* out) {
  if (UsesSlurm(rt->spec)) {
    ScheduleSlurm(rt, out);
    return;
  }
  if (!rt->restart_pending.empty()) {
    // A restart waiting for a node of its plan (CompleteStop).
    std::string why;
    if (Launch(rt, rt->plan, out, &why)) {
      Event(rt, v1::RUNNING, "state", absl::StrCat("running ", rt->plan.ranks(), " ranks"), true);
      Announce(rt, store_->RecordRestart(rt->id, rt->restarts, rt->restart_pending));
      rt->restart_pending.clear();
    } else if (Now() >= rt->restart_wait_deadline) {
      Finish(rt, v1::FAILED,
             absl::StrFormat("cannot restart after: %s; %s for %.0f s", rt->stop.message, why,
                             opt_.restart_node_wait_s));
    }
    return;
  }
  std::vector<v1::Topology> topo = nodes_.ConnectedTopologies();
  if (topo.empty()) {
    if (rt->message != "waiting for a node agent") {
      Event(rt, v1::PENDING, "info", "waiting for a node agent", true);
    }
    return;
  }
  if (rt->state == v1::PENDING) Event(rt, v1::PLANNING, "state", "planning", true);
  if (rt->trials && !rt->trials->done) return;  // its planning thread decides (TrialPlanning)
  if (!rt->planned) {
    absl::StatusOr<v1::Plan> plan;
    try {
      plan = PlanMeasured(store_.get(), rt->spec, topo, nullptr, "", nullptr, BaseMeasurements());
    } catch (const std::exception& e) {
      plan = absl::InternalError(absl::StrCat("planner threw: ", e.what()));
    }
    if (!plan.ok()) {
      Finish(rt, v1::FAILED, absl::StrCat("planning failed: ", plan.status().message()));
      return;
    }
    if (plan->ranks() <= 0) {
      Finish(rt, v1::FAILED, "planning failed: the plan has no ranks");
      return;
    }
    if (WantsTrials(rt->spec)) {
      // Timed on a thread of its own once its ranks have room (the trials
      // use the model plan's placement; only micro-batch, accumulation and
      // bucket differ); that thread sets rt->plan, or fails the job.
      std::vector<RankSlot> placed;
      std::string why;
      if (Place(rt, *plan, &placed, &why)) {
        StartTrials(rt, topo, placed);
      } else if (rt->message != why) {
        Event(rt, v1::PLANNING, "info", why, true);
      }
      return;
    }
    rt->plan = *plan;
    rt->planned = true;
    (void)store_->SetPlan(rt->id, rt->plan);
    Event(rt, v1::PLANNING, "plan", PlanSummary(rt->plan), false);
  }
  std::string why;
  if (Launch(rt, rt->plan, out, &why)) {
    Event(rt, v1::RUNNING, "state", absl::StrCat("running ", rt->plan.ranks(), " ranks"), true);
  } else if (rt->message != why) {
    Event(rt, v1::PLANNING, "info", why, true);
  }
}

bool Scheduler::Place(const JobRt* rt, const v1::Plan& plan, std::vector<RankSlot>* slots,
                      std::string* why) {
  if (UsesSlurm(rt->spec)) {
    const auto a = slurm_->Get(rt->id, rt->allocation_attempt);
    if (!a.has_value() || a->id.empty()) {
      *why = "waiting for capacity: no Slurm allocation yet";
      return false;
    }
    return BoundAgentPlacement(&nodes_, rt->id, a->id).Place(plan, BusyDevices(jobs_, rt), slots,
                                                            why);
  }
  if (!placement_->Place(plan, BusyDevices(jobs_, rt), slots, why)) return false;
  // CPU ranks queue rather than oversubscribe a node's CPUs or memory (a
  // Slurm allocation is the cluster's to admit).
  return CpuPlanFits(plan, *slots, CpuLoads(jobs_, rt), nodes_, why);
}

bool Scheduler::Launch(JobRt* rt, const v1::Plan& plan, Outbox* out, std::string* why) {
  const int world = plan.ranks();
  std::vector<RankSlot> slots;
  if (!Place(rt, plan, &slots, why)) return false;
  const auto now = Now();
  std::map<std::string, std::string> env(plan.env().begin(), plan.env().end());
  for (const auto& [k, v] : rt->spec.comm().env()) env[k] = v;
  std::vector<RankRt> ranks(world);
  for (int r = 0; r < world; ++r) {
    RankRt& rr = ranks[r];
    rr.node = slots[r].node;
    rr.local_device = slots[r].local_device;
    rr.last_progress = now;
    rr.progress.set_rank(r);
    rr.progress.set_node(rr.node);
    rr.progress.set_state("starting");
    rr.progress.set_total_steps(rt->spec.train().steps());
    v1::CoordinatorCommand c;
    v1::LaunchRank* l = c.mutable_launch();
    l->set_job_id(rt->id);
    l->set_rank(r);
    l->set_world_size(world);
    l->set_attempt(rt->attempt);
    for (const auto& [k, v] : env) (*l->mutable_env())[k] = v;
    l->set_local_device(rr.local_device);
    for (const v1::InputFile& f : rt->inputs) *l->add_inputs() = f;
    if (opt_.rank_token) l->set_rank_token(opt_.rank_token(rt->id, rt->attempt));
    out->emplace_back(nodes_.ConnectionOf(rr.node), c);
  }
  rt->ranks = std::move(ranks);
  // A new attempt: the last one's failure is history, and its final loss
  // is this attempt's to report.
  rt->rank_failure.reset();
  rt->final_loss.reset();
  rt->launched = now;
  rt->last_persist = now;
  // The attempt and placement are durable from here (pids follow as the
  // agents report them), so a restarted coordinator can re-adopt the ranks.
  // (Cleared first: an earlier attempt may have had more ranks.)
  (void)store_->ClearRanks(rt->id);
  for (int r = 0; r < world; ++r) {
    absl::Status s = store_->RecordRank({rt->id, r, rt->attempt, rt->ranks[r].node, 0, 0});
    if (!s.ok()) spdlog::warn("job {}: cannot record rank {}: {}", rt->id, r, s.ToString());
  }
  // And the ranks' states of this attempt replace the last one's, which a
  // restarted coordinator would otherwise take for this attempt's.
  Persist(rt);
  return true;
}

// --- Stops and restarts ------------------------------------------------------

std::set<std::string> Scheduler::QueueStop(const JobRt& rt, bool live_only, Outbox* out) {
  std::set<std::string> nodes;
  for (const auto& r : rt.ranks) {
    if (!live_only || !r.exited) nodes.insert(r.node);
  }
  QueueStopOn(rt.id, nodes, out);
  return nodes;
}

void Scheduler::QueueStopOn(const std::string& job_id, const std::set<std::string>& nodes,
                            Outbox* out, const std::set<int>& attempts) {
  for (const auto& n : nodes) {
    std::shared_ptr<AgentConnection> conn = nodes_.ConnectionOf(n);
    if (!conn) continue;
    v1::CoordinatorCommand c;
    c.mutable_stop()->set_job_id(job_id);
    c.mutable_stop()->set_grace_seconds(opt_.stop_grace_s);
    for (int a : attempts) c.mutable_stop()->add_attempts(a);
    out->emplace_back(std::move(conn), c);
  }
}

void Scheduler::BeginStop(JobRt* rt, StopAction action, const std::string& message, Outbox* out) {
  rt->stop.action = action;
  rt->stop.message = message;
  rt->stop.started = Now();
  rt->stop.other_failures.clear();
  rt->stop.deadline = Now() + Seconds(opt_.stop_grace_s + 5);
  const std::set<std::string> nodes = QueueStop(*rt, /*live_only=*/true, out);
  Event(rt, rt->state, "stop",
        absl::StrCat("stopping ",
                     nodes.size() ? absl::StrCat("ranks on ", absl::StrJoin(nodes, ", "))
                                  : std::string("(no ranks running)"),
                     " (", StopActionName(action), ")"),
        false);
  Wake();
}

void Scheduler::CompleteStop(JobRt* rt, Outbox* out) {
  const StopAction a = rt->stop.action;
  rt->stop.action = StopAction::kNone;
  if (!rt->stop.other_failures.empty() && a != StopAction::kCancel) {
    // Headline first, then the other ranks, then the first rank's output.
    std::string msg = rt->stop.message;
    size_t cut = msg.find("; last output:");
    std::string tail = cut == std::string::npos ? "" : msg.substr(cut);
    msg = msg.substr(0, cut);
    absl::StrAppend(&msg, "; other ranks: ", absl::StrJoin(rt->stop.other_failures, "; "), tail);
    rt->stop.message = msg;
  }
  if (a == StopAction::kCancel) {
    Finish(rt, v1::CANCELLED, rt->stop.message);
    return;
  }
  if (a == StopAction::kFail) {
    Finish(rt, v1::FAILED, rt->stop.message);
    return;
  }
  // Ranks of the stopped attempt that never reported their end because
  // their node is away: when it registers again, its agent adopts them and
  // stops them (they may still hold a GPU), before a new attempt runs there.
  for (size_t r = 0; r < rt->ranks.size(); ++r) {
    RankRt& rr = rt->ranks[r];
    if (rr.exited) continue;
    rr.exited = true;
    if (nodes_.Connected(rr.node)) continue;  // told to stop; reports on its own
    nodes_.AddOrphan(rr.node, RunningRankOf(*rt, static_cast<int>(r)));
  }
  // Restart from the last checkpoint. The new attempt's ranks are stored
  // (Launch) before the restart count and its event, which go together: a
  // coordinator that dies in between carries the stop on (recovery) and
  // counts this restart once. A re-plan is no failure: the count stays, the
  // job moves to its new plan, and the plan check reviews the new plan's
  // steps alone.
  const bool replan = a == StopAction::kReplan && rt->replan.has_value();
  const bool resume = a == StopAction::kResume;
  if (!replan && !resume) {
    rt->restarts++;
    hub_->IncRankRestarts(rt->id);
  }
  rt->attempt++;
  rendezvous_.ClearAttemptsBefore(rt->id, rt->attempt);
  std::string restart =
      absl::StrCat("restart ", rt->restarts, " of ", rt->spec.train().max_restarts(),
                   " (attempt ", rt->attempt, ") after: ", rt->stop.message);
  if (replan) {
    rt->plan = *rt->replan;
    rt->replan.reset();
    rt->checkpoint_at = 0;
    rt->steps = StepStats();
    (void)store_->SetPlan(rt->id, rt->plan);
    restart = absl::StrCat("attempt ", rt->attempt, " on the new plan (", PlanSummary(rt->plan),
                           "), resuming from its checkpoint (", rt->stop.message, ")");
  } else if (resume) {
    restart = absl::StrCat("attempt ", rt->attempt,
                           " resumes from the last checkpoint, not counted as a failure (restarts ",
                           rt->restarts, " of ", rt->spec.train().max_restarts(),
                           "), after: ", rt->stop.message);
  }
  std::string why;
  if (UsesSlurm(rt->spec)) {
    RestartSlurm(rt, restart, out);
    return;
  }
  if (!Launch(rt, rt->plan, out, &why)) {
    if (absl::StartsWith(why, "waiting for capacity") && opt_.restart_node_wait_s > 0) {
      // A node of the plan is away for now (its agent restarting, the host
      // rebooting: often what made the ranks fail): wait for it, up to
      // restart_node_wait_s; Schedule launches and records the restart's
      // event then. The count is stored now, so that a coordinator restart
      // meanwhile (which queues the job again) keeps it.
      rt->restart_pending = restart;
      rt->restart_wait_deadline = Now() + Seconds(opt_.restart_node_wait_s);
      (void)store_->SetRestarts(rt->id, rt->restarts);
      Event(rt, v1::PLANNING, "info",
            absl::StrFormat("%s; restart %d of %d waits for it (up to %.0f s)", why, rt->restarts,
                            rt->spec.train().max_restarts(), opt_.restart_node_wait_s),
            true);
      return;
    }
    Finish(rt, v1::FAILED, absl::StrCat("cannot restart after: ", rt->stop.message, "; ", why));
    return;
  }
  Announce(rt, store_->RecordRestart(rt->id, rt->restarts, restart));
}

void Scheduler::RankFailed(JobRt* rt, const std::string& reason, Outbox* out) {
  Event(rt, rt->state, "rank_exit", reason, false);
  if (rt->restarts < rt->spec.train().max_restarts()) {
    BeginStop(rt, StopAction::kRestart, reason, out);
  } else {
    BeginStop(rt, StopAction::kFail, FailureMessage(*rt, reason), out);
  }
}

}  // namespace dgca
