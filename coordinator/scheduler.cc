#include "coordinator/scheduler.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "planner/planner.h"
#include "spec/spec.h"
#include "spdlog/spdlog.h"

namespace dgca {
namespace {

// A rank's exit code when it stopped on request (worker/rank/rank_main.h
// kExitStopped; the coordinator does not link the rank runtime).
constexpr int kRankExitStopped = 5;
// Finished jobs whose per-rank progress and /metrics series are kept.
constexpr size_t kRememberFinished = 64;
// Plan check and dgca diagnose: the latest this many (rank, step) samples
// per job are kept (the medians need no more); fewer than kMinStepSamples
// make no check and no diagnosis.
constexpr size_t kMaxStepSamples = 20000;
constexpr size_t kMinStepSamples = 5;
// Step measurements (distinct micro-batches) fed to one plan.
constexpr int kMaxStepPoints = 6;
// Micro-batches whose newest peak memory the next plan's memory line fits.
constexpr int kMaxMemoryPoints = 4;
// Jobs whose all-reduce skew is taken into a plan (median).
constexpr int kMaxSkewJobs = 5;
// A tuning trial runs this many optimizer steps; the first kTrialWarmupSteps
// (allocation, first touch, loader warm-up) are not timed.
constexpr int kTrialWarmupSteps = 2;
constexpr int kTrialTimedSteps = 4;

bool WantsTrials(const v1::JobSpec& spec) {
  return spec.tuning().mode() == "trial" && spec.kind() != "comm_probe";
}

// What a trial's ranks run: the job, cut to the trial's steps, with no
// evaluation, no checkpoints and no tuning of its own.
v1::JobSpec TrialSpec(const v1::JobSpec& spec) {
  v1::JobSpec t = spec;
  t.mutable_train()->set_steps(kTrialWarmupSteps + kTrialTimedSteps);
  t.mutable_train()->set_eval_every(0);
  t.mutable_train()->set_checkpoint_every(0);
  t.mutable_data()->clear_eval();
  t.mutable_tuning()->set_mode("off");
  return t;
}

// The GPU (on its node) the plan gives rank r; -1 for CPU ranks.
int PlannedDevice(const v1::Plan& plan, int r) {
  if (plan.device() != "cuda" || r >= plan.rank_local_devices_size()) return -1;
  return plan.rank_local_devices(r);
}

std::string CandidateLabel(const v1::Plan& p) {
  return absl::StrFormat("micro_batch %d x accumulation %d, bucket %g MB", p.micro_batch(),
                         p.accumulation(), p.bucket_mb());
}

// At most max_bytes of `path` ("" when it cannot be read): never an
// unbounded read of whatever the path names (a `latest` linked to
// /dev/zero would otherwise take the coordinator's memory).
std::string ReadFileOrEmpty(const std::string& path, size_t max_bytes = size_t{1} << 20) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::string text(max_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(in.gcount() > 0 ? static_cast<size_t>(in.gcount()) : 0);
  return text;
}

// Kills the process group of a recorded rank when /proc/PID/cmdline still
// mentions the job id (so a reused pid is never hit).
bool KillOrphan(const StoredRank& r) {
  if (r.pid <= 1) return false;
  std::string cmdline = ReadFileOrEmpty(absl::StrCat("/proc/", r.pid, "/cmdline"));
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  if (cmdline.find(r.job_id) == std::string::npos) return false;
  if (r.pgid > 1 && getpgid(r.pid) == r.pgid) {
    kill(-r.pgid, SIGKILL);
  } else {
    kill(r.pid, SIGKILL);
  }
  return true;
}

std::string SignalName(int sig) {
  const char* d = strsignal(sig);
  return absl::StrCat(sig, d ? absl::StrCat(" (", d, ")") : "");
}

std::string PlanSummary(const v1::Plan& p) {
  return absl::StrCat("ranks=", p.ranks(), " device=", p.device(), " backend=", p.backend(),
                      " micro_batch=", p.micro_batch(), " accumulation=", p.accumulation(),
                      " bucket_mb=", p.bucket_mb(), " precision=", p.precision(),
                      p.warnings_size() ? absl::StrCat(" warnings: ", absl::StrJoin(p.warnings(), "; "))
                                        : "");
}

}  // namespace

bool AgentConnection::Send(const v1::CoordinatorCommand& cmd) {
  std::lock_guard<std::mutex> l(mu_);
  if (!open_) return false;
  return write_(cmd);
}

void AgentConnection::Close() {
  std::lock_guard<std::mutex> l(mu_);
  open_ = false;
}

bool WatchSubscription::Next(v1::WatchJobResponse* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, timeout, [&] { return !q_.empty(); })) return false;
  *out = std::move(q_.front());
  q_.pop_front();
  return true;
}

void WatchSubscription::Push(v1::WatchJobResponse u) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (q_.size() >= kMaxQueued) {
      // Drop the oldest metric sample (events are never dropped).
      auto it = std::find_if(q_.begin(), q_.end(),
                             [](const v1::WatchJobResponse& x) { return !x.has_event(); });
      if (it != q_.end()) q_.erase(it);
    }
    q_.push_back(std::move(u));
  }
  cv_.notify_all();
}

Scheduler::Scheduler(SchedulerOptions options, MetricsHub* hub, std::unique_ptr<JobStore> store)
    : opt_(std::move(options)), hub_(hub), store_(std::move(store)) {}

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
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_thread_ = true;
    for (auto& [id, rt] : jobs_) {
      if (rt->trials) rt->trials->cancelled = true;
    }
  }
  cv_.notify_all();
  trial_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  JoinTrialThreads(/*all=*/true);
}

std::optional<Scheduler::InterruptedStop> Scheduler::InterruptedStopOf(
    const std::vector<v1::JobEvent>& events) {
  // The newest of the events that start a stop ("stop") or show the job
  // running ("restart", "state"): a "stop" means a stop was under way. Its
  // reason is the newest "rank_exit" event before it.
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    const std::string& kind = it->kind();
    if (kind == "restart" || kind == "state") return std::nullopt;
    if (kind != "stop") continue;
    InterruptedStop stop;
    const std::string& m = it->message();
    if (absl::EndsWith(m, "(cancel)")) {
      stop.action = StopAction::kCancel;
      stop.message = "cancelled by user";
      return stop;
    }
    stop.action = absl::EndsWith(m, "(restart)") ? StopAction::kRestart : StopAction::kFail;
    for (auto r = it + 1; r != events.rend(); ++r) {
      if (r->kind() == "rank_exit") {
        stop.message = r->message();
        break;
      }
      if (r->kind() == "restart" || r->kind() == "state") break;
    }
    if (stop.message.empty()) stop.message = "a rank failed before the coordinator restarted";
    return stop;
  }
  return std::nullopt;
}

absl::Status Scheduler::Recover() {
  auto active = store_->ListJobs({v1::PENDING, v1::PLANNING, v1::RUNNING}, 0);
  if (!active.ok()) return active.status();
  std::lock_guard<std::mutex> l(mu_);
  const auto now = Clock::now();
  std::vector<v1::Job> listed(active->begin(), active->end());
  std::sort(listed.begin(), listed.end(),
            [](const v1::Job& a, const v1::Job& b) { return a.id() < b.id(); });  // submission order
  for (const v1::Job& entry : listed) {
    auto stored = store_->GetJob(entry.id());
    if (!stored.ok()) return stored.status();
    const v1::Job& j = stored->job;
    auto owned = std::make_unique<JobRt>();
    JobRt* rt = owned.get();
    rt->id = j.id();
    rt->spec = j.spec();
    rt->state = j.state();
    rt->message = j.message();
    rt->restarts = j.restarts();
    for (const auto& [k, v] : j.eval()) rt->eval[k] = v;
    rt->loss_curve.Restore(j.loss_curve());
    if (j.state() != v1::RUNNING) {
      // Nothing of the job itself was launched yet: queued again, planned
      // afresh against the nodes that connect now. A tuning trial's ranks
      // (PLANNING) are killed; the trials start over.
      auto trial_ranks = store_->ListRanks(j.id());
      if (trial_ranks.ok()) {
        KillOrphans(j.id(), *trial_ranks, "trial rank");
        // Later attempts stay distinct from the killed trial's, also after
        // another restart: its attempts stay recorded, without pids.
        for (const StoredRank& r : *trial_ranks) {
          rt->attempt = std::max(rt->attempt, r.attempt + 1);
          (void)store_->RecordRank({j.id(), r.rank, r.attempt, r.node, 0, 0});
        }
      }
      jobs_[rt->id] = std::move(owned);
      Event(rt, v1::PENDING, j.state() == v1::PLANNING ? "state" : "info",
            "coordinator restarted; queued again", true);
      continue;
    }
    // RUNNING: its ranks are re-adopted when the store knows them all.
    auto ranks = store_->ListRanks(j.id());
    std::string why;
    if (!ranks.ok()) {
      why = absl::StrCat("cannot read its ranks: ", ranks.status().message());
    } else if (!stored->has_plan || stored->plan.ranks() <= 0) {
      why = "no plan stored";
    } else if (static_cast<int>(ranks->size()) != stored->plan.ranks()) {
      why = absl::StrCat(ranks->size(), " of ", stored->plan.ranks(), " ranks recorded");
    } else {
      for (size_t i = 0; i < ranks->size(); ++i) {
        if ((*ranks)[i].rank != static_cast<int>(i)) why = "its recorded ranks are not 0..N-1";
        if ((*ranks)[i].attempt != (*ranks)[0].attempt) why = "its ranks are of different attempts";
      }
    }
    if (!why.empty()) {
      if (ranks.ok()) KillOrphans(j.id(), *ranks, "rank");
      const std::string message = absl::StrCat("coordinator restarted; cannot re-adopt: ", why);
      auto ev = store_->SetState(j.id(), v1::FAILED, message);
      if (!ev.ok()) return ev.status();
      spdlog::warn("job {} was RUNNING when the coordinator stopped and cannot be re-adopted "
                   "({}); marked FAILED", j.id(), why);
      v1::Job failed = j;
      failed.set_state(v1::FAILED);
      failed.set_message(message);
      hub_->SetJobState(j.id(), v1::FAILED);  // DgcaJobFailed sees it
      RememberFinished(failed);
      continue;
    }
    rt->plan = stored->plan;
    rt->planned = true;
    rt->attempt = (*ranks)[0].attempt;
    rt->launched = now;
    rt->last_persist = now;
    rt->ranks.resize(ranks->size());
    std::vector<std::string> adopted;
    for (const StoredRank& r : *ranks) {
      RankRt& rr = rt->ranks[r.rank];
      rr.node = r.node;
      rr.local_device = PlannedDevice(rt->plan, r.rank);
      if (r.rank < j.ranks_size()) rr.progress = j.ranks(r.rank);
      rr.progress.set_rank(r.rank);
      rr.progress.set_node(r.node);
      rr.progress.set_pid(r.pid);
      if (rr.progress.total_steps() == 0) rr.progress.set_total_steps(rt->spec.train().steps());
      // Exits are stored at once (RankExited); any other rank is confirmed
      // by its next heartbeat or step, or reported by its agent.
      rr.exited = rr.progress.state() == "exited" || rr.progress.state() == "failed";
      rr.last_progress = now;
      if (rr.exited) continue;
      rr.progress.set_state("recovering");
      recovered_ranks_.push_back(r);
      adopted.push_back(absl::StrCat(r.rank, "@", r.node, ":", r.pid));
    }
    jobs_[rt->id] = std::move(owned);
    hub_->SetJobState(rt->id, v1::RUNNING);
    Event(rt, v1::RUNNING, "info",
          absl::StrCat("coordinator restarted; re-adopting attempt ", rt->attempt,
                       " (rank@node:pid ", adopted.empty() ? "none" : absl::StrJoin(adopted, " "),
                       "); a rank with no heartbeat or step within ", opt_.heartbeat_timeout_s,
                       " s counts as stalled"),
          false);
    // A stop that was under way (cancel, failure, restart) goes on: each
    // agent gets StopRanks when it registers again (AgentRegistered), and
    // it completes once every rank has exited.
    auto events = store_->ListEvents(rt->id, 0);
    std::optional<InterruptedStop> stop = events.ok() ? InterruptedStopOf(*events) : std::nullopt;
    if (!stop.has_value()) {
      for (const RankRt& rr : rt->ranks) {
        if (rr.progress.state() != "failed") continue;
        // Its failure was stored, the stop it led to was not.
        stop = InterruptedStop{
            rt->restarts < rt->spec.train().max_restarts() ? StopAction::kRestart
                                                           : StopAction::kFail,
            absl::StrCat("rank ", rr.progress.rank(), " on node ", rr.node,
                         " failed (exit code ", rr.progress.exit_code(),
                         ") just before the coordinator restarted")};
        break;
      }
    }
    if (!stop.has_value() && adopted.empty()) {
      Finish(rt, v1::SUCCEEDED, absl::StrCat("all ", rt->ranks.size(), " ranks exited 0"));
      continue;
    }
    if (stop.has_value()) {
      rt->stop = stop->action;
      rt->stop_message =
          stop->action == StopAction::kFail ? FailureMessage(*rt, stop->message) : stop->message;
      rt->stop_started = now;
      // Time for the agents to come back, then the usual grace.
      rt->stop_deadline = now + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(opt_.heartbeat_timeout_s +
                                                                  opt_.stop_grace_s + 5));
      const char* what = stop->action == StopAction::kCancel    ? "cancel"
                         : stop->action == StopAction::kRestart ? "restart"
                                                                : "failure";
      Event(rt, rt->state, "info",
            absl::StrCat("the coordinator restarted while stopping the job (", what,
                         "); its ranks are stopped again as their agents reconnect"),
            false);
    }
  }
  return absl::OkStatus();
}

void Scheduler::KillOrphans(const std::string& job_id, const std::vector<StoredRank>& ranks,
                            const std::string& what) {
  for (const StoredRank& r : ranks) {
    if (KillOrphan(r)) {
      (void)store_->AppendEvent(job_id, "info",
                                absl::StrCat("killed orphaned ", what, " ", r.rank, " (pid ", r.pid,
                                             ", attempt ", r.attempt, ")"));
    }
  }
  (void)store_->ClearRanks(job_id);
}

std::vector<StoredRank> Scheduler::RecoveredRanks() {
  std::lock_guard<std::mutex> l(mu_);
  return recovered_ranks_;
}

void Scheduler::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Shutdown() {
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shutting_down_.exchange(true)) return;
    std::vector<JobRt*> active;
    for (auto& [id, rt] : jobs_) active.push_back(rt.get());
    for (JobRt* rt : active) {
      QueueStop(*rt, /*live_only=*/false, &out);
      Finish(rt, v1::FAILED, "coordinator shut down");
    }
    stop_thread_ = true;
  }
  StopThreads(&out);
}

void Scheduler::Detach() {
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shutting_down_.exchange(true)) return;
    for (auto& [id, rt] : jobs_) {
      if (rt->trials) {
        rt->trials->cancelled = true;
        // Its trial ranks; Recover would kill them, planning starts over.
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
  cv_.notify_all();
  trial_cv_.notify_all();
  Flush(out);
  if (thread_.joinable()) thread_.join();
  JoinTrialThreads(/*all=*/true);
}

void Scheduler::JoinTrialThreads(bool all) {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = trial_threads_.begin(); it != trial_threads_.end();) {
      if (all || it->first->done) {
        done.push_back(std::move(it->second));
        it = trial_threads_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::thread& t : done) t.join();
}

void Scheduler::Flush(Outbox* out) {
  for (auto& [conn, cmd] : *out) {
    if (!conn->Send(cmd)) spdlog::warn("could not send a command to an agent (stream closed)");
  }
  out->clear();
}

void Scheduler::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_thread_) {
    cv_.wait_for(l, std::chrono::duration<double>(opt_.tick_s), [&] { return stop_thread_ || wake_; });
    if (stop_thread_) break;
    wake_ = false;
    l.unlock();
    Tick();
    l.lock();
  }
}

std::string Scheduler::CheckpointDir(const std::string& id) const {
  return absl::StrCat(opt_.state_dir, "/jobs/", id, "/checkpoints");
}

std::vector<v1::Topology> Scheduler::ConnectedTopologies() {
  std::vector<v1::Topology> out;
  for (auto& [name, n] : nodes_) {
    if (!n.conn) continue;
    v1::Topology t = n.topology;
    t.set_node(name);  // placement (plan.rank_nodes) uses registered names
    out.push_back(std::move(t));
  }
  return out;
}

void Scheduler::Event(JobRt* rt, v1::JobState state, const std::string& kind,
                      const std::string& message, bool set_state) {
  absl::StatusOr<v1::JobEvent> ev =
      set_state ? store_->SetState(rt->id, state, message, kind)
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
  Publish(rt->id, u);
  last_counts_ = Clock::time_point();  // refresh dgca_jobs soon
}

void Scheduler::Publish(const std::string& id, const v1::WatchJobResponse& u) {
  auto it = watchers_.find(id);
  if (it == watchers_.end()) return;
  for (auto& w : it->second) w->Push(u);
}

void Scheduler::FillProgress(const JobRt& rt, v1::Job* job) {
  job->clear_ranks();
  int64_t min_step = -1;
  double sps = 0, loss = 0, step_s = 0;
  int n_loss = 0, n_step_s = 0;
  auto now = Clock::now();
  for (const RankRt& r : rt.ranks) {
    v1::RankProgress p = r.progress;
    p.set_restarts(rt.restarts);
    if (!r.exited) {
      p.set_heartbeat_age_seconds(std::chrono::duration<double>(now - r.last_progress).count());
    }
    *job->add_ranks() = p;
    min_step = min_step < 0 ? p.step() : std::min(min_step, p.step());
    if (!r.exited) sps += p.samples_per_second();
    if (p.step() > 0) { loss += p.loss(); ++n_loss; }
    if (p.step_seconds() > 0) { step_s += p.step_seconds(); ++n_step_s; }
  }
  int64_t total = rt.spec.train().steps();
  job->set_step(std::max<int64_t>(0, min_step));
  job->set_total_steps(total);
  job->set_samples_per_second(sps);
  job->set_loss(n_loss ? loss / n_loss : 0);
  double eta = 0;
  if (n_step_s && job->step() < total) eta = (total - job->step()) * (step_s / n_step_s);
  job->set_eta_seconds(eta);
  job->set_restarts(rt.restarts);
  job->clear_eval();
  for (const auto& [k, v] : rt.eval) (*job->mutable_eval())[k] = v;
  if (rt.plan_check.samples() > 0) *job->mutable_plan_check() = rt.plan_check;
  job->mutable_loss_curve()->Assign(rt.loss_curve.points().begin(), rt.loss_curve.points().end());
}

v1::Job Scheduler::Snapshot(const JobRt& rt) {
  auto stored = store_->GetJob(rt.id);
  v1::Job j = stored.ok() ? stored->job : v1::Job();
  j.set_id(rt.id);
  j.set_state(rt.state);
  j.set_message(rt.message);
  FillProgress(rt, &j);
  return j;
}

void Scheduler::Persist(JobRt* rt) {
  v1::Job p;
  FillProgress(*rt, &p);
  absl::Status s = store_->SetProgress(rt->id, p);
  if (!s.ok()) spdlog::warn("job {}: cannot persist progress: {}", rt->id, s.ToString());
  rt->last_persist = Clock::now();
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
    finished_order_.pop_front();
  }
}

void Scheduler::Finish(JobRt* rt, v1::JobState state, const std::string& message) {
  if (rt->trials) {
    rt->trials->cancelled = true;  // its planning thread stops trying
    trial_cv_.notify_all();
  }
  if (rt->planned && rt->spec.kind() != "comm_probe") CheckPlan(rt, state);
  // The job has ended: a rank whose exit was not seen (a shutdown or a
  // cancel stops the ranks without waiting for them) is stored "stopped",
  // not "running" with a fresh heartbeat for ever.
  for (RankRt& r : rt->ranks) {
    if (r.exited) continue;
    r.exited = true;
    r.progress.set_state("stopped");
  }
  Persist(rt);
  Event(rt, state, "state", message, true);
  rendezvous_.ClearJob(rt->id);
  (void)store_->ClearRanks(rt->id);
  v1::Job snap = Snapshot(*rt);
  v1::WatchJobResponse u;
  *u.mutable_snapshot() = snap;
  Publish(rt->id, u);
  // The state series follows even when the store could not record it (a
  // full disk): the job has ended here either way, and a RUNNING series
  // whose steps stopped would read as a stalled job.
  hub_->SetJobState(rt->id, state);
  RememberFinished(snap);
  std::string id = rt->id;
  jobs_.erase(id);  // rt is gone from here on
}

// --- Coordinator API -------------------------------------------------------

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
  if (req.validate_only()) return resp;
  if (req.dry_run()) {
    std::vector<v1::Topology> topo;
    {
      std::lock_guard<std::mutex> l(mu_);
      topo = ConnectedTopologies();
    }
    if (topo.empty()) {
      return absl::FailedPreconditionError("no node agent is connected, so there is nothing to plan "
                                           "against; start dgca-worker agent or the local agent");
    }
    auto plan = PlanMeasured(parsed->spec, topo);
    if (!plan.ok()) return plan.status();
    *resp.mutable_plan() = *plan;
    return resp;
  }
  if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
  auto job = store_->CreateJob(parsed->spec, req.spec_yaml());
  if (!job.ok()) return job.status();
  resp.set_job_id(job->id());
  {
    std::lock_guard<std::mutex> l(mu_);
    auto rt = std::make_unique<JobRt>();
    rt->id = job->id();
    rt->spec = parsed->spec;
    rt->state = v1::PENDING;
    rt->message = "submitted";
    hub_->SetJobState(rt->id, rt->state);
    jobs_[rt->id] = std::move(rt);
    wake_ = true;
    last_counts_ = Clock::time_point();
  }
  cv_.notify_all();
  spdlog::info("job {} submitted ({})", job->id(), parsed->spec.name());
  return resp;
}

// Node set of a plan or a running job: sorted unique node names, ","-joined.
std::string Scheduler::NodeSetKey(const JobRt& rt) {
  std::set<std::string> nodes;
  for (const auto& r : rt.ranks) nodes.insert(r.node);
  return absl::StrJoin(nodes, ",");
}

absl::StatusOr<v1::Plan> Scheduler::PlanMeasured(const v1::JobSpec& spec,
                                                 const std::vector<v1::Topology>& topo,
                                                 TrialRunner* trials) {
  auto plan = MakePlan(spec, topo, PlannerMeasurements{});
  if (!plan.ok() || spec.kind() == "comm_probe") return plan;
  std::set<std::string> nodes(plan->rank_nodes().begin(), plan->rank_nodes().end());
  nodes.erase("");
  if (nodes.empty() && !topo.empty()) nodes.insert(topo[0].node());
  const std::string node_set = absl::StrJoin(nodes, ",");
  PlannerMeasurements meas;
  bool measured = false;
  if (plan->ranks() >= 2 && AddCommMeasurement(node_set, *plan, &meas)) {
    measured = true;
    // How much longer the all-reduce took inside earlier jobs than the
    // probe predicted, per second of compute (median of the newest few).
    auto skews = store_->AllReduceSkews(CommKey(node_set, *plan), kMaxSkewJobs);
    if (skews.ok() && !skews->empty()) {
      std::vector<double> r;
      std::vector<std::string> from;
      for (const AllReduceSkew& x : *skews) {
        r.push_back(x.skew);
        from.push_back(absl::StrFormat("%s %.3f", x.job_id, x.skew));
      }
      meas.allreduce_skew_per_compute = std::max(0.0, MedianOf(r));
      meas.allreduce_skew_source = absl::StrCat(
          "the median of (measured all-reduce - probe) / compute over the newest ", r.size(),
          " job(s) on these nodes: ", absl::StrJoin(from, ", "));
    }
  }
  // Compute time per micro-step from earlier jobs of the same key (per
  // micro-batch, the median of its newest three jobs).
  auto steps = store_->StepMeasurements(StepKey(spec, *plan, node_set), kMaxStepPoints);
  if (steps.ok() && !steps->empty()) {
    std::vector<std::string> from;
    for (const StepMeasurement& m : *steps) {
      meas.step_points.emplace_back(m.micro_batch, m.compute_seconds);
      if (m.jobs.size() <= 1) {
        from.push_back(absl::StrFormat("job %s m=%d %.1f ms (median of %d steps)", m.job_id,
                                       m.micro_batch, m.compute_seconds * 1e3, m.samples));
      } else {
        std::vector<std::string> js;
        for (const auto& [job, c] : m.jobs) js.push_back(absl::StrFormat("%s %.1f", job, c * 1e3));
        from.push_back(absl::StrFormat("m=%d %.1f ms (median of the newest %d jobs: %s ms)",
                                       m.micro_batch, m.compute_seconds * 1e3, m.jobs.size(),
                                       absl::StrJoin(js, ", ")));
      }
    }
    absl::Time t = absl::FromUnixMillis((*steps)[0].time_unix_ms);
    meas.step_source = absl::StrCat(
        "compute per micro-step measured by earlier jobs of this model on these nodes, newest ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone()), ": ",
        absl::StrJoin(from, "; "));
    measured = true;
  }
  // Peak memory from earlier jobs of the same key (per micro-batch, the
  // newest job's); `what` follows each in the source.
  auto memory_points = [&](const v1::Plan& keyed, const std::string& what,
                           std::vector<std::pair<int, double>>* points, std::string* source) {
    auto mem = store_->MemoryMeasurements(MemoryKey(spec, keyed, node_set), kMaxMemoryPoints);
    if (!mem.ok()) return;
    std::vector<std::string> from;
    for (const MemoryMeasurement& m : *mem) {
      if (m.micro_batch <= 0 || m.peak_bytes <= 0) continue;
      points->emplace_back(m.micro_batch, m.peak_bytes);
      from.push_back(absl::StrFormat("job %s held %s at micro-batch %d%s", m.job_id, FormatBytes(m.peak_bytes),
                                     m.micro_batch, what));
    }
    if (from.empty()) return;
    *source = absl::StrJoin(from, ", ");
    measured = true;
  };
  memory_points(*plan, "", &meas.memory_points, &meas.memory_source);
  // The GEMM attention's, for a plan that may keep it ("auto", or the
  // planner's "fused" that may become "auto" at the new micro-batch; not the
  // user's "fused").
  const std::string asked = absl::AsciiStrToLower(spec.train().attention());
  if ((plan->attention() == "auto" || plan->attention() == "fused") && (asked.empty() || asked == "auto")) {
    v1::Plan gemm_plan = *plan;  // the key's other parts as this plan's
    gemm_plan.set_attention("gemm");
    memory_points(gemm_plan, " with the GEMM attention", &meas.gemm_memory_points, &meas.gemm_memory_source);
  }
  if (!measured && trials == nullptr) return plan;
  auto again = MakePlan(spec, topo, meas, trials);
  return again.ok() ? again : plan;
}

bool Scheduler::AddCommMeasurement(const std::string& node_set, const v1::Plan& plan,
                                   PlannerMeasurements* meas) {
  auto m = store_->LatestCommMeasurement(node_set, plan.backend(), plan.ranks());
  if (!m.ok() || m->rows.empty()) return false;
  // Bandwidth from the largest size (bandwidth-bound, like the buckets the
  // planner sizes) and latency from the smallest (latency-bound). A least-
  // squares fit over all sizes is dominated by the largest points and gave a
  // latency of 0 on this machine's sweeps.
  const v1::CommProbeRow* big = nullptr;
  const v1::CommProbeRow* small = nullptr;
  for (const auto& r : m->rows) {
    if (r.seconds_per_op() <= 0 || r.busbw_bytes_per_second() <= 0) continue;
    if (!big || r.bytes() > big->bytes()) big = &r;
    if (!small || r.bytes() < small->bytes()) small = &r;
  }
  if (!big) return false;
  meas->allreduce_bus_bandwidth = big->busbw_bytes_per_second();
  if (small != big) meas->allreduce_latency_s = small->seconds_per_op();
  for (const auto& r : m->rows) {
    if (r.bytes() > 0 && r.seconds_per_op() > 0) {
      meas->allreduce_points.emplace_back(static_cast<double>(r.bytes()), r.seconds_per_op());
    }
  }
  absl::Time t = absl::FromUnixMillis(m->time_unix_ms);
  meas->allreduce_source =
      absl::StrCat("measured by dgca diagnose comm at ",
                   absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone()),
                   " (job ", m->job_id, "; busbw at ", big->bytes(), " B",
                   small != big ? absl::StrCat(", latency at ", small->bytes(), " B") : "", ")");
  return true;
}

std::string Scheduler::CommKey(const std::string& node_set, const v1::Plan& plan) {
  return absl::StrCat(node_set, "|", plan.backend(), "|", plan.ranks());
}

std::string Scheduler::StepKey(const v1::JobSpec& spec, const v1::Plan& plan,
                               const std::string& node_set) {
  v1::ModelSpec model = spec.model();
  model.clear_init_from();  // the starting weights do not change the timing
  // Dropout as the ranks train it: unset means the default; none at all
  // keys as specs from before model.dropout did (their measurements were
  // taken without dropout).
  const SpecDropout dropout = DropoutOf(spec.model());
  model.clear_dropout();
  if (dropout.hidden > 0 || dropout.attention > 0) {
    model.mutable_dropout()->set_hidden(dropout.hidden);
    model.mutable_dropout()->set_attention(dropout.attention);
  }
  return absl::StrCat("nodes=", node_set, " device=", plan.device(), " ranks=", plan.ranks(),
                      " threads=", plan.threads_per_rank(), " precision=", plan.precision(),
                      " seq=", spec.data().max_seq_len(), " mft=",
                      spec.data().mft().ShortDebugString(), " model=", model.ShortDebugString());
}

namespace {
double RelativeError(double predicted, double measured) {
  return measured > 0 ? (predicted - measured) / measured : 0;
}

// The live check waits for enough steady-state rank-steps for a median that
// one slow step does not move, and for this much step time per rank: the
// first second of a job is not its steady state (the quickstart's 30 ms
// steps gave 40 rank-steps in 0.6 s, whose median named a +10% straggler
// that the whole run's put at +2%). A job whose ring of samples fills
// first is checked then.
size_t LiveCheckSamples(int ranks) {
  return std::min(kMaxStepSamples, std::max<size_t>(40, 10 * std::max(1, ranks)));
}
constexpr double kLiveCheckSecondsPerRank = 10;
bool LiveCheckDue(size_t samples, double step_seconds, int ranks) {
  return samples >= LiveCheckSamples(ranks) &&
         (step_seconds >= kLiveCheckSecondsPerRank * std::max(1, ranks) ||
          samples >= kMaxStepSamples);
}
}  // namespace

Scheduler::StepMedians Scheduler::MediansOf(const std::vector<StepSample>& samples,
                                             int accumulation) {
  const int k = std::max(1, accumulation);
  std::vector<double> step, share, allreduce, compute;
  for (const StepSample& x : samples) {
    if (x.step_seconds <= 0) continue;
    step.push_back(x.step_seconds);
    share.push_back(x.exposed_seconds / x.step_seconds);
    allreduce.push_back(x.allreduce_seconds);
    // A starved loader is not the model's compute: the planner would carry
    // it into every later plan of the model.
    compute.push_back(std::max(0.0, x.step_seconds - x.exposed_seconds - x.data_wait_seconds) /
                      k);
  }
  return {MedianOf(step), MedianOf(share), MedianOf(allreduce), MedianOf(compute)};
}

v1::RunningRank Scheduler::RunningRankOf(const JobRt& rt, int rank) {
  v1::RunningRank out;
  out.set_job_id(rt.id);
  out.set_rank(rank);
  out.set_attempt(rt.attempt);
  out.set_pid(rt.ranks[rank].progress.pid());
  return out;
}

Scheduler::StepSample Scheduler::SampleOf(const v1::StepMetrics& m) {
  StepSample s;
  s.rank = m.rank();
  s.step_seconds = m.step_seconds();
  s.data_wait_seconds = m.data_wait_seconds();
  s.exposed_seconds = m.exposed_comm_seconds();
  s.allreduce_seconds = m.allreduce_seconds();
  s.gpu_memory_bytes = m.gpu_memory_used_bytes();
  s.host_memory_peak_bytes = m.host_memory_peak_bytes();
  return s;
}

void Scheduler::LiveCheck(JobRt* rt) {
  rt->live_checked = true;
  const v1::Plan& p = rt->plan;
  const v1::StepBreakdown b = BreakdownOf(rt->step_samples, p);
  v1::DiagnoseJobResponse d;
  if (!DiagnoseSteps(p, rt->spec, b, &d).ok()) return;  // no step time
  const double step = b.step_seconds();
  std::string text = absl::StrFormat("live check (median of %d rank-steps): step %.4f s",
                                     static_cast<int>(b.samples()), step);
  const double err = RelativeError(p.predicted_step_seconds(), step);
  if (p.predicted_step_seconds() > 0) {
    absl::StrAppendFormat(&text, " vs %.4f s predicted (%+.1f%%)", p.predicted_step_seconds(),
                          100 * err);
  }
  absl::StrAppendFormat(&text, "; exposed communication %.1f%% of the step (target %.0f%%",
                        100 * b.exposed_comm_seconds() / step, 100 * kTargetCommShare);
  if (p.predicted_step_seconds() > 0) {
    absl::StrAppendFormat(&text, ", %.1f%% predicted", 100 * p.predicted_comm_share());
  }
  absl::StrAppendFormat(&text, "), data wait %.1f%%", 100 * b.data_wait_seconds() / step);
  // The limiting stage, as `dgca diagnose JOB` reads it.
  std::vector<std::string> near;
  for (const auto& f : d.findings()) {
    if (f.near_limit()) near.push_back(f.stage());
  }
  for (const auto& f : d.findings()) {
    if (!f.limiting()) continue;
    if (f.stage() == "compute") {
      absl::StrAppend(&text, "; compute-bound: the plan holds", NearLimitNote(near));
    } else {
      // The shares are in the line already; a straggler's finding names it.
      absl::StrAppend(&text, "; limiting stage: ", f.stage());
      if (f.stage() == "straggler") absl::StrAppend(&text, ": ", f.finding());
      if (!f.fix().empty()) absl::StrAppend(&text, "; fix: ", f.fix());
    }
  }
  if (d.memory().above_target()) {
    absl::StrAppend(&text, "; memory above its target: ", d.memory().finding());
    if (!d.memory().fix().empty()) absl::StrAppend(&text, "; fix: ", d.memory().fix());
  }
  if (p.predicted_step_seconds() > 0 && std::fabs(err) > 0.25) {
    text += "; the step prediction is off by more than 25%; this job's measurements correct the "
            "next plan of the model on these nodes";
  }
  absl::StrAppend(&text, " (dgca diagnose ", rt->id, " has the breakdown)");
  Event(rt, rt->state, "plan", text, false);
}

void Scheduler::CheckPlan(JobRt* rt, v1::JobState final_state) {
  const auto& ss = rt->step_samples;
  if (ss.size() < kMinStepSamples) return;
  const int k = std::max(1, rt->plan.accumulation());
  const StepMedians med = MediansOf(ss, k);
  v1::PlanCheck& c = rt->plan_check;
  c.set_samples(static_cast<int64_t>(ss.size()));
  c.set_micro_batch(rt->plan.micro_batch());
  c.set_accumulation(k);
  c.set_predicted_step_seconds(rt->plan.predicted_step_seconds());
  c.set_predicted_comm_share(rt->plan.predicted_comm_share());
  c.set_predicted_allreduce_seconds(rt->plan.predicted_allreduce_seconds());
  c.set_measured_step_seconds(med.step);
  c.set_measured_comm_share(med.comm_share);
  c.set_measured_allreduce_seconds(med.allreduce);
  c.set_measured_compute_seconds(med.compute);
  *c.mutable_breakdown() = BreakdownOf(ss, rt->plan);
  std::string text;
  if (c.predicted_step_seconds() > 0) {
    text = absl::StrFormat(
        "predicted vs measured (median of %d rank-steps): step %.4f s vs %.4f s (%+.1f%%), "
        "comm share %.1f%% vs %.1f%% (%+.1f%%), all-reduce %.4f s vs %.4f s",
        c.samples(), c.predicted_step_seconds(), c.measured_step_seconds(),
        100 * RelativeError(c.predicted_step_seconds(), c.measured_step_seconds()),
        100 * c.predicted_comm_share(), 100 * c.measured_comm_share(),
        100 * RelativeError(c.predicted_comm_share(), c.measured_comm_share()),
        c.predicted_allreduce_seconds(), c.measured_allreduce_seconds());
  } else {
    text = absl::StrFormat(
        "measured (median of %d rank-steps): step %.4f s, comm share %.1f%%; the plan had no "
        "step-time measurement to predict from",
        c.samples(), c.measured_step_seconds(), 100 * c.measured_comm_share());
  }
  // A cancelled or failed job's steps are still real steps; keep them when
  // there are enough of them.
  if (final_state == v1::SUCCEEDED || ss.size() >= 4 * kMinStepSamples) {
    StepMeasurement m;
    m.job_id = rt->id;
    m.key = StepKey(rt->spec, rt->plan, NodeSetKey(*rt));
    m.micro_batch = rt->plan.micro_batch();
    m.compute_seconds = c.measured_compute_seconds();
    m.samples = c.samples();
    m.time_unix_ms = NowUnixMs();
    m.comm_key = CommKey(NodeSetKey(*rt), rt->plan);
    if (rt->plan.allreduce_measured() && rt->plan.predicted_allreduce_probe_seconds() > 0) {
      m.allreduce_probe_seconds = rt->plan.predicted_allreduce_probe_seconds();
      m.allreduce_measured_seconds = c.measured_allreduce_seconds();
    }
    absl::Status st = store_->AddStepMeasurement(m);
    if (st.ok()) {
      text += absl::StrFormat("; stored compute %.4f s per micro-step of %d for later plans",
                              m.compute_seconds, m.micro_batch);
    } else {
      text += absl::StrCat("; cannot store the measurement: ", st.message());
    }
    // The most memory a rank held: the point the next plan's memory line
    // goes through (Planner::Memory). Not a failed job's: one that ran out
    // of memory died before its peak was reported, and a point below what
    // the micro-batch needs would let the next plan pick it again.
    double peak = 0;
    for (const auto& r : c.breakdown().ranks()) peak = std::max(peak, r.peak_memory_bytes());
    if (!std::isfinite(peak)) peak = 0;  // a rank's nonsense is not a measurement
    if (peak > 0 && rt->attention_mixed) {
      absl::StrAppendFormat(&text,
                            "; peak memory %s not stored (the ranks ran both attention kernels "
                            "over the job's attempts, so it is neither's)",
                            FormatBytes(peak));
    } else if (peak > 0 && final_state == v1::FAILED) {
      absl::StrAppendFormat(&text,
                            "; peak memory %s not stored (a failed job, perhaps out of memory, "
                            "may not have reported what its micro-batch needs)",
                            FormatBytes(peak));
    } else if (peak > 0 && rt->plan.micro_batch() > 0) {
      MemoryMeasurement mm;
      mm.job_id = rt->id;
      mm.key = MemoryKey(rt->spec, rt->plan, NodeSetKey(*rt), rt->attention_kernels);
      mm.micro_batch = rt->plan.micro_batch();
      mm.peak_bytes = peak;
      mm.time_unix_ms = m.time_unix_ms;
      absl::Status ms = store_->AddMemoryMeasurement(mm);
      if (ms.ok()) {
        absl::StrAppendFormat(&text, " and peak memory %s at micro-batch %d", FormatBytes(peak),
                              mm.micro_batch);
        if (rt->plan.attention() == "auto" && !rt->attention_kernels.empty())
          absl::StrAppend(&text, " (", rt->attention_kernels, " attention, which the ranks kept)");
      } else {
        absl::StrAppend(&text, "; cannot store the memory measurement: ", ms.message());
      }
    }
  }
  Event(rt, rt->state, "plan", text, false);
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
  return out;
}

absl::StatusOr<v1::GetJobResponse> Scheduler::GetJob(const std::string& id) {
  auto stored = store_->GetJob(id);
  if (!stored.ok()) return stored.status();
  v1::GetJobResponse resp;
  *resp.mutable_job() = stored->job;
  if (stored->has_plan) *resp.mutable_plan() = stored->plan;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = jobs_.find(id);
    if (it != jobs_.end()) {
      FillProgress(*it->second, resp.mutable_job());
    } else {
      auto f = finished_.find(id);
      if (f != finished_.end()) *resp.mutable_job()->mutable_ranks() = f->second.ranks();
    }
  }
  auto events = store_->ListEvents(id, 0);
  if (!events.ok()) return events.status();
  for (auto& e : *events) *resp.add_events() = std::move(e);
  if (stored->job.spec().kind() == "comm_probe") {
    auto rows = store_->CommProbeRows(id);
    if (rows.ok()) {
      for (auto& r : *rows) *resp.add_probe_rows() = std::move(r);
    }
  }
  return resp;
}

absl::StatusOr<v1::DiagnoseJobResponse> Scheduler::DiagnoseJob(const std::string& id) {
  // An active job's samples first; the store after, so that a job that
  // finishes in between is read with the plan check it stored.
  std::optional<v1::Plan> live_plan;
  v1::JobState live_state = v1::PENDING;
  std::vector<StepSample> samples;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = jobs_.find(id);
    if (it != jobs_.end()) {
      const JobRt& rt = *it->second;
      live_state = rt.state;
      live_plan = rt.planned ? rt.plan : v1::Plan();
      samples = rt.step_samples;  // copied: the medians are computed unlocked
    }
  }
  auto stored = store_->GetJob(id);
  if (!stored.ok()) return stored.status();
  const v1::JobSpec& spec = stored->job.spec();
  if (spec.kind() == "comm_probe") {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " is a comm probe: it times all-reduces, not training steps (its table is "
        "what dgca diagnose comm printed; dgca status ", id, " shows it again)"));
  }
  v1::DiagnoseJobResponse out;
  out.set_job_id(id);
  out.set_name(stored->job.name());
  out.set_state(live_plan ? live_state : stored->job.state());
  v1::Plan plan = live_plan ? *live_plan : stored->has_plan ? stored->plan : v1::Plan();
  const std::string state = absl::AsciiStrToLower(v1::JobState_Name(out.state()));
  v1::StepBreakdown breakdown;
  if (live_plan) {
    if (samples.size() < kMinStepSamples) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "job %s (%s) has %d steady-state rank-step(s) so far; dgca diagnose needs at least %d "
          "(each rank's first two steps are warm-up): try again after a few more steps",
          id, state, static_cast<int>(samples.size()), static_cast<int>(kMinStepSamples)));
    }
    breakdown = BreakdownOf(samples, plan);
    out.set_live(true);
  } else if (stored->job.plan_check().breakdown().samples() > 0) {
    breakdown = stored->job.plan_check().breakdown();
  } else {
    return absl::FailedPreconditionError(absl::StrFormat(
        "job %s (%s) left no step breakdown to diagnose: it ran fewer than %d steady-state "
        "rank-steps (each rank's first two steps are warm-up), or finished before its "
        "coordinator kept breakdowns",
        id, state, static_cast<int>(kMinStepSamples)));
  }
  absl::Status st = DiagnoseSteps(plan, spec, breakdown, &out);
  if (!st.ok()) return st;
  *out.mutable_plan() = std::move(plan);
  *out.mutable_breakdown() = std::move(breakdown);
  return out;
}

absl::StatusOr<std::vector<v1::Job>> Scheduler::ListJobs(const v1::ListJobsRequest& req) {
  std::vector<v1::JobState> states;
  for (int st : req.states()) states.push_back(static_cast<v1::JobState>(st));
  // The list omits the spec YAML and ranks to stay small.
  auto jobs = store_->ListJobs(states, req.limit());
  if (!jobs.ok()) return jobs.status();
  std::lock_guard<std::mutex> l(mu_);
  for (v1::Job& j : *jobs) {
    j.clear_spec_yaml();
    auto it = jobs_.find(j.id());
    if (it != jobs_.end()) FillProgress(*it->second, &j);
  }
  return jobs;
}

absl::StatusOr<v1::Job> Scheduler::Cancel(const std::string& id, std::chrono::milliseconds wait) {
  auto stored = store_->GetJob(id);
  if (!stored.ok()) return stored.status();
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is already ", v1::JobState_Name(stored->job.state()), "; nothing to cancel"));
    }
    JobRt* rt = it->second.get();
    if (rt->state != v1::RUNNING) {
      if (TrialRunning(*rt)) QueueStop(*rt, /*live_only=*/true, &out);  // a trial's ranks
      Finish(rt, v1::CANCELLED, "cancelled by user");
    } else if (rt->stop != StopAction::kCancel) {
      BeginStop(rt, StopAction::kCancel, "cancelled by user", &out);
    }
  }
  Flush(&out);
  auto deadline = Clock::now() + wait;
  while (Clock::now() < deadline && !IsTerminal(id)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto job = GetJob(id);
  if (!job.ok()) return job.status();
  return job->job();
}

bool Scheduler::IsTerminal(const std::string& id) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (jobs_.count(id)) return false;
  }
  return true;
}

absl::Status Scheduler::ForgetNode(const std::string& node) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) {
    std::vector<std::string> names;
    for (const auto& [name, n] : nodes_) names.push_back(name);
    return absl::NotFoundError(absl::StrCat("no node named '", node, "' has registered (known: ",
                                            names.empty() ? "none" : absl::StrJoin(names, ", "),
                                            ")"));
  }
  if (it->second.conn) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", node, " is connected; stop its agent first (a connected agent stays listed)"));
  }
  std::vector<std::string> jobs;
  for (const auto& [id, rt] : jobs_) {
    bool there = std::any_of(rt->ranks.begin(), rt->ranks.end(),
                             [&](const RankRt& r) { return r.node == node && !r.exited; });
    if (rt->trials && !rt->trials->done) {
      for (const auto& p : rt->trials->placement) there = there || p.first == node;
    }
    if (there) jobs.push_back(id);
  }
  if (!jobs.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", node, " still has ranks of active job(s) ", absl::StrJoin(jobs, ", "),
        ": wait until they count as stalled and are stopped, or cancel them (dgca cancel)"));
  }
  nodes_.erase(it);
  orphans_.erase(node);
  hub_->RemoveNode(node);
  spdlog::info("node {} forgotten (dgca nodes forget)", node);
  return absl::OkStatus();
}

std::vector<v1::NodeInfo> Scheduler::ListNodes() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<v1::NodeInfo> out;
  auto now = Clock::now();
  for (auto& [name, n] : nodes_) {
    v1::NodeInfo info;
    info.set_name(name);
    info.set_address(n.address);
    info.set_connected(n.conn != nullptr);
    info.set_heartbeat_age_seconds(std::chrono::duration<double>(now - n.last_heartbeat).count());
    *info.mutable_topology() = n.topology;
    for (auto& [id, rt] : jobs_) {
      for (const auto& r : rt->ranks) {
        if (r.node == name) {
          info.add_running_jobs(id);
          break;
        }
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<WatchSubscription>> Scheduler::Watch(const std::string& id,
                                                                    int64_t after_seq) {
  auto sub = std::make_shared<WatchSubscription>();
  {
    // Subscribe before the replay so nothing falls between; the caller
    // drops events with seq <= the last replayed one.
    std::lock_guard<std::mutex> l(mu_);
    watchers_[id].push_back(sub);
  }
  auto events = store_->ListEvents(id, after_seq);
  auto job = GetJob(id);
  if (!job.ok()) {
    Unwatch(id, sub);
    return job.status();
  }
  // Replay goes first in a separate queue so it precedes live updates.
  auto replay = std::make_shared<WatchSubscription>();
  if (events.ok()) {
    for (auto& e : *events) {
      v1::WatchJobResponse u;
      *u.mutable_event() = e;
      replay->Push(u);
    }
  }
  v1::WatchJobResponse snap;
  *snap.mutable_snapshot() = job->job();
  replay->Push(snap);
  // Move live updates behind the replay.
  v1::WatchJobResponse u;
  while (sub->Next(&u, std::chrono::milliseconds(0))) replay->Push(u);
  {
    std::lock_guard<std::mutex> l(mu_);
    auto& list = watchers_[id];
    list.remove(sub);
    // Anything published between the drain above and this swap went to
    // `sub`; drain once more under the lock.
    while (sub->Next(&u, std::chrono::milliseconds(0))) replay->Push(u);
    list.push_back(replay);
  }
  return replay;
}

void Scheduler::Unwatch(const std::string& id, const std::shared_ptr<WatchSubscription>& sub) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = watchers_.find(id);
  if (it == watchers_.end()) return;
  it->second.remove(sub);
  if (it->second.empty()) watchers_.erase(it);
}

absl::StatusOr<std::string> Scheduler::LogPath(const std::string& id, int rank) {
  auto stored = store_->GetJob(id);
  if (!stored.ok()) return stored.status();
  if (rank < 0) return absl::InvalidArgumentError("rank must be >= 0");
  return absl::StrCat(opt_.state_dir, "/jobs/", id, "/rank-", rank, ".log");
}

// --- Scheduling ------------------------------------------------------------

void Scheduler::Tick() {
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shutting_down_) return;
    auto now = Clock::now();
    std::vector<std::string> ids;
    for (auto& [id, rt] : jobs_) ids.push_back(id);
    for (const std::string& id : ids) {
      auto it = jobs_.find(id);
      if (it == jobs_.end()) continue;
      JobRt* rt = it->second.get();
      if (rt->state == v1::PENDING || rt->state == v1::PLANNING) {
        Schedule(rt, &out);
        continue;
      }
      if (rt->state != v1::RUNNING) continue;
      if (rt->stop != StopAction::kNone) {
        bool all_exited = std::all_of(rt->ranks.begin(), rt->ranks.end(),
                                      [](const RankRt& r) { return r.exited; });
        if (all_exited || now >= rt->stop_deadline) CompleteStop(rt, &out);
        continue;
      }
      if (std::string stall = StallOf(*rt, now); !stall.empty()) RankFailed(rt, -1, stall, &out);
      it = jobs_.find(id);
      if (it == jobs_.end()) continue;
      rt = it->second.get();
      if (now - rt->last_snapshot > std::chrono::seconds(1)) {
        rt->last_snapshot = now;
        if (watchers_.count(id)) {
          v1::WatchJobResponse u;
          *u.mutable_snapshot() = Snapshot(*rt);
          Publish(id, u);
        }
      }
      if (rt->dirty && now - rt->last_persist > std::chrono::seconds(5)) Persist(rt);
    }
    for (auto& [name, n] : nodes_) {
      hub_->SetHeartbeatAge(name, std::chrono::duration<double>(now - n.last_heartbeat).count(),
                            n.conn != nullptr);
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
  if (!rt->restart_pending.empty()) {
    // A restart waiting for a node of its plan (CompleteStop).
    std::string why;
    if (Launch(rt, rt->plan, out, &why)) {
      Event(rt, v1::RUNNING, "state", absl::StrCat("running ", rt->plan.ranks(), " ranks"), true);
      Announce(rt, store_->RecordRestart(rt->id, rt->restarts, rt->restart_pending));
      rt->restart_pending.clear();
    } else if (Clock::now() >= rt->restart_wait_deadline) {
      Finish(rt, v1::FAILED,
             absl::StrFormat("cannot restart after: %s; %s for %.0f s", rt->stop_message, why,
                             opt_.restart_node_wait_s));
    }
    return;
  }
  std::vector<v1::Topology> topo = ConnectedTopologies();
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
      plan = PlanMeasured(rt->spec, topo);
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
      std::vector<RankRt> placed;
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

bool Scheduler::Place(const JobRt* rt, const v1::Plan& plan, std::vector<RankRt>* placed,
                      std::string* why) {
  const int world = plan.ranks();
  std::string first;
  for (auto& [name, n] : nodes_) {
    if (n.conn) { first = name; break; }
  }
  std::vector<RankRt>& ranks = *placed;
  ranks.assign(world, RankRt());
  // GPUs held by running jobs, and by jobs timing tuning trials (from their
  // first trial to their launch, so no other job takes them in between).
  std::set<std::pair<std::string, int>> busy;
  for (auto& [id, other] : jobs_) {
    if (other.get() == rt) continue;
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
  for (int r = 0; r < world; ++r) {
    std::string node = r < plan.rank_nodes_size() && !plan.rank_nodes(r).empty() ? plan.rank_nodes(r) : first;
    const int dev = PlannedDevice(plan, r);
    auto it = nodes_.find(node);
    if (it == nodes_.end() || !it->second.conn) {
      *why = absl::StrCat("waiting for capacity: node ", node, " (rank ", r, ") is not connected");
      return false;
    }
    if (dev >= 0 && busy.count({node, dev})) {
      *why = absl::StrCat("waiting for capacity: GPU ", dev, " on node ", node,
                          " is used by another job");
      return false;
    }
    ranks[r].node = node;
    ranks[r].local_device = dev;
  }
  return true;
}

bool Scheduler::Launch(JobRt* rt, const v1::Plan& plan, Outbox* out, std::string* why) {
  const int world = plan.ranks();
  std::vector<RankRt> ranks;
  if (!Place(rt, plan, &ranks, why)) return false;
  auto now = Clock::now();
  std::map<std::string, std::string> env(plan.env().begin(), plan.env().end());
  for (const auto& [k, v] : rt->spec.comm().env()) env[k] = v;
  for (int r = 0; r < world; ++r) {
    RankRt& rr = ranks[r];
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
    out->emplace_back(nodes_[rr.node].conn, c);
  }
  rt->ranks = std::move(ranks);
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

// --- Tuning trials (tuning.mode: trial) ------------------------------------

class Scheduler::JobTrialRunner : public TrialRunner {
 public:
  JobTrialRunner(Scheduler* s, std::string id, std::shared_ptr<Trials> st)
      : s_(s), id_(std::move(id)), st_(std::move(st)) {}
  absl::StatusOr<double> TimeStep(const v1::Plan& candidate, double budget_s) override {
    return s_->RunTrial(id_, st_, candidate, budget_s);
  }

 private:
  Scheduler* s_;
  std::string id_;
  std::shared_ptr<Trials> st_;
};

void Scheduler::StartTrials(JobRt* rt, const std::vector<v1::Topology>& topo,
                            const std::vector<RankRt>& placement) {
  rt->trials = std::make_shared<Trials>();
  for (const RankRt& r : placement) rt->trials->placement.emplace_back(r.node, r.local_device);
  const double budget = rt->spec.tuning().budget_s() > 0 ? rt->spec.tuning().budget_s() : 120;
  rt->trials->wall_deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(budget));
  Event(rt, v1::PLANNING, "info",
        absl::StrFormat("tuning.mode trial: timing the planner's best candidates as %d-step runs "
                        "on the job's ranks (budget %g s)",
                        kTrialWarmupSteps + kTrialTimedSteps, budget),
        true);
  std::shared_ptr<Trials> st = rt->trials;
  trial_threads_.emplace_back(
      st, std::thread([this, id = rt->id, spec = rt->spec, topo, st] {
        TrialPlanning(id, spec, topo, st);
      }));
}

void Scheduler::TrialPlanning(std::string id, v1::JobSpec spec, std::vector<v1::Topology> topo,
                              std::shared_ptr<Trials> st) {
  JobTrialRunner runner(this, id, st);
  absl::StatusOr<v1::Plan> plan;
  try {
    plan = PlanMeasured(spec, topo, &runner);
  } catch (const std::exception& e) {
    plan = absl::InternalError(absl::StrCat("planner threw: ", e.what()));
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    st->done = true;
    auto it = jobs_.find(id);
    if (it == jobs_.end() || st->cancelled) return;  // cancelled or shut down meanwhile
    JobRt* rt = it->second.get();
    if (!plan.ok()) {
      Finish(rt, v1::FAILED, absl::StrCat("planning failed: ", plan.status().message()));
    } else if (plan->ranks() <= 0) {
      Finish(rt, v1::FAILED, "planning failed: the plan has no ranks");
    } else {
      rt->plan = *plan;
      rt->planned = true;
      // The kept trial's measured communication share is the prediction
      // when the model had none.
      auto share = st->comm_share.find(CandidateLabel(rt->plan));
      if (rt->plan.predicted_comm_share() <= 0 && rt->plan.predicted_step_seconds() > 0 &&
          share != st->comm_share.end()) {
        rt->plan.set_predicted_comm_share(share->second);
      }
      (void)store_->SetPlan(rt->id, rt->plan);
      Event(rt, v1::PLANNING, "plan", PlanSummary(rt->plan), false);
    }
    wake_ = true;
  }
  cv_.notify_all();
}

absl::StatusOr<double> Scheduler::RunTrial(const std::string& id,
                                           const std::shared_ptr<Trials>& st,
                                           const v1::Plan& candidate, double budget_s) {
  const auto now = Clock::now();
  const auto deadline = std::min(
      st->wall_deadline,
      now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(budget_s)));
  const std::string label = CandidateLabel(candidate);
  auto find = [&]() -> JobRt* {
    auto it = jobs_.find(id);
    return it == jobs_.end() || st->cancelled || shutting_down_ ? nullptr : it->second.get();
  };
  auto all_exited = [](const JobRt& rt) {
    return std::all_of(rt.ranks.begin(), rt.ranks.end(), [](const RankRt& r) { return r.exited; });
  };
  Outbox out;
  int n = 0;
  std::set<std::string> nodes;  // where the trial's ranks were launched
  {
    std::lock_guard<std::mutex> l(mu_);
    JobRt* rt = find();
    if (rt == nullptr) return absl::CancelledError("the job is no longer planning");
    if (now >= st->wall_deadline) {
      // The planner notes it as skipped, not failed.
      return absl::ResourceExhaustedError("tuning.budget_s used up before this trial");
    }
    st->plan = candidate;
    st->steps.clear();
    st->failure.clear();
    std::string why;
    if (!Launch(rt, candidate, &out, &why)) return absl::UnavailableError(why);
    n = ++st->index;
    st->active = true;
    for (RankRt& r : rt->ranks) {
      r.progress.set_state("trial");
      nodes.insert(r.node);
    }
    Event(rt, v1::PLANNING, "trial",
          absl::StrCat("trial ", n, ": ", label, " (attempt ", rt->attempt, ")"), true);
  }
  Flush(&out);
  {
    // A cancel or shutdown between the launch and its sending stopped
    // nothing on the agents: stop what was just launched.
    std::lock_guard<std::mutex> l(mu_);
    if (find() == nullptr) QueueStopOn(id, nodes, &out);
  }
  Flush(&out);

  // Until every rank has ended (a trial runs its few steps and exits), one
  // failed or stalled, the budget ran out, or the job went away.
  bool timed_out = false;
  {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      JobRt* rt = find();
      if (rt == nullptr || !st->failure.empty() || all_exited(*rt)) break;
      const auto t = Clock::now();
      if (t >= deadline) {
        timed_out = true;
        break;
      }
      st->failure = StallOf(*rt, t);
      if (!st->failure.empty()) break;
      trial_cv_.wait_for(l, std::chrono::milliseconds(100));
    }
    JobRt* rt = find();
    if (rt != nullptr && !all_exited(*rt)) QueueStop(*rt, /*live_only=*/true, &out);
  }
  Flush(&out);
  const auto stop_deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(opt_.stop_grace_s + 5));
  std::unique_lock<std::mutex> l(mu_);
  while (Clock::now() < stop_deadline) {
    // Shutting down, exits are no longer taken in (RankExited): waiting for
    // them would only hold up Shutdown/Detach until the deadline.
    if (shutting_down_) break;
    auto it = jobs_.find(id);
    if (it == jobs_.end() || all_exited(*it->second)) break;
    trial_cv_.wait_for(l, std::chrono::milliseconds(100));
  }
  st->active = false;
  auto it = jobs_.find(id);
  JobRt* rt = it == jobs_.end() ? nullptr : it->second.get();
  if (rt != nullptr) {
    rt->attempt++;  // the next trial, or the job itself, runs as a new attempt
    rendezvous_.ClearAttemptsBefore(id, rt->attempt);
  }
  absl::StatusOr<double> result;
  const StepMedians med = MediansOf(st->steps, candidate.accumulation());
  const int timed = static_cast<int>(st->steps.size());
  if (rt == nullptr || st->cancelled || shutting_down_) {
    return absl::CancelledError("the job is no longer planning");
  } else if (timed_out) {  // before failures: the stop makes the ranks "fail"
    result = absl::DeadlineExceededError(
        absl::StrFormat("stopped: tuning.budget_s ran out after %.1f s",
                        std::chrono::duration<double>(Clock::now() - now).count()));
  } else if (!st->failure.empty()) {
    result = absl::AbortedError(st->failure);
  } else if (timed == 0 || med.step <= 0) {
    result = absl::InternalError("the ranks ended without reporting a timed step");
  } else {
    result = med.step;
    st->comm_share[label] = med.comm_share;
    // What the trial measured feeds later plans like a finished job's plan
    // check does (the planner's c(m), one point per timed micro-batch).
    StepMeasurement m;
    m.job_id = absl::StrCat(id, "/trial-", n);
    m.key = StepKey(rt->spec, candidate, NodeSetKey(*rt));
    m.micro_batch = candidate.micro_batch();
    m.compute_seconds = med.compute;
    m.samples = timed;
    m.time_unix_ms = NowUnixMs();
    m.comm_key = CommKey(NodeSetKey(*rt), candidate);
    if (absl::Status s = store_->AddStepMeasurement(m); !s.ok()) {
      spdlog::warn("job {}: cannot store trial {}'s measurement: {}", id, n, s.ToString());
    }
  }
  Event(rt, v1::PLANNING, "trial",
        result.ok()
            ? absl::StrFormat("trial %d: %s: %.4f s per step (median of %d timed rank-steps)", n,
                              label, *result, timed)
            : absl::StrCat("trial ", n, ": ", label, ": ", result.status().message()),
        true);
  return result;
}

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
    auto it = nodes_.find(n);
    if (it == nodes_.end() || !it->second.conn) continue;
    v1::CoordinatorCommand c;
    c.mutable_stop()->set_job_id(job_id);
    c.mutable_stop()->set_grace_seconds(opt_.stop_grace_s);
    for (int a : attempts) c.mutable_stop()->add_attempts(a);
    out->emplace_back(it->second.conn, c);
  }
}

std::string Scheduler::StallOf(const JobRt& rt, Clock::time_point now) const {
  for (size_t r = 0; r < rt.ranks.size(); ++r) {
    const RankRt& rr = rt.ranks[r];
    const double idle = std::chrono::duration<double>(now - rr.last_progress).count();
    if (!rr.exited && idle > opt_.heartbeat_timeout_s) {
      return absl::StrCat("rank ", r, " on node ", rr.node, " made no progress for ",
                          static_cast<int>(idle), " s (no heartbeat or step; timeout ",
                          opt_.heartbeat_timeout_s, " s)");
    }
  }
  return "";
}

void Scheduler::BeginStop(JobRt* rt, StopAction action, const std::string& message, Outbox* out) {
  rt->stop = action;
  rt->stop_message = message;
  rt->stop_started = Clock::now();
  rt->other_failures.clear();
  rt->stop_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(opt_.stop_grace_s + 5));
  const std::set<std::string> nodes = QueueStop(*rt, /*live_only=*/true, out);
  const char* what = action == StopAction::kCancel ? "cancel" : action == StopAction::kRestart ? "restart" : "failure";
  Event(rt, rt->state, "stop",
        absl::StrCat("stopping ", nodes.size() ? absl::StrCat("ranks on ", absl::StrJoin(nodes, ", "))
                                                : std::string("(no ranks running)"),
                     " (", what, ")"),
        false);
  wake_ = true;
}

void Scheduler::CompleteStop(JobRt* rt, Outbox* out) {
  StopAction a = rt->stop;
  rt->stop = StopAction::kNone;
  if (!rt->other_failures.empty() && a != StopAction::kCancel) {
    // Headline first, then the other ranks, then the first rank's output.
    std::string msg = rt->stop_message;
    size_t cut = msg.find("; last output:");
    std::string tail = cut == std::string::npos ? "" : msg.substr(cut);
    msg = msg.substr(0, cut);
    absl::StrAppend(&msg, "; other ranks: ", absl::StrJoin(rt->other_failures, "; "), tail);
    rt->stop_message = msg;
  }
  if (a == StopAction::kCancel) {
    Finish(rt, v1::CANCELLED, rt->stop_message);
    return;
  }
  if (a == StopAction::kFail) {
    Finish(rt, v1::FAILED, rt->stop_message);
    return;
  }
  // Ranks of the stopped attempt that never reported their end because
  // their node is away: when it registers again, its agent adopts them and
  // stops them (they may still hold a GPU), before a new attempt runs there.
  for (size_t r = 0; r < rt->ranks.size(); ++r) {
    RankRt& rr = rt->ranks[r];
    if (rr.exited) continue;
    rr.exited = true;
    auto n = nodes_.find(rr.node);
    if (n != nodes_.end() && n->second.conn) continue;  // told to stop; reports on its own
    orphans_[rr.node].push_back(RunningRankOf(*rt, static_cast<int>(r)));
  }
  // Restart from the last checkpoint. The new attempt's ranks are stored
  // (Launch) before the restart count and its event, which go together: a
  // coordinator that dies in between carries the stop on (Recover) and counts
  // this restart once.
  rt->restarts++;
  rt->attempt++;
  hub_->IncRankRestarts(rt->id);
  rendezvous_.ClearAttemptsBefore(rt->id, rt->attempt);
  std::string why;
  const std::string restart =
      absl::StrCat("restart ", rt->restarts, " of ", rt->spec.train().max_restarts(),
                   " (attempt ", rt->attempt, ") after: ", rt->stop_message);
  if (!Launch(rt, rt->plan, out, &why)) {
    if (absl::StartsWith(why, "waiting for capacity") && opt_.restart_node_wait_s > 0) {
      // A node of the plan is away for now (its agent restarting, the host
      // rebooting: often what made the ranks fail): wait for it, up to
      // restart_node_wait_s; Schedule launches and records the restart's
      // event then. The count is stored now, so that a coordinator restart
      // meanwhile (which queues the job again) keeps it.
      rt->restart_pending = restart;
      rt->restart_wait_deadline =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(opt_.restart_node_wait_s));
      (void)store_->SetRestarts(rt->id, rt->restarts);
      Event(rt, v1::PLANNING, "info",
            absl::StrFormat("%s; restart %d of %d waits for it (up to %.0f s)", why,
                            rt->restarts, rt->spec.train().max_restarts(),
                            opt_.restart_node_wait_s),
            true);
      return;
    }
    Finish(rt, v1::FAILED, absl::StrCat("cannot restart after: ", rt->stop_message, "; ", why));
    return;
  }
  Announce(rt, store_->RecordRestart(rt->id, rt->restarts, restart));
}

std::string Scheduler::FailureMessage(const JobRt& rt, const std::string& reason) {
  std::string msg = reason;
  if (rt.spec.train().max_restarts() > 0) {
    absl::StrAppend(&msg, " (after ", rt.restarts, " restarts; train.max_restarts is ",
                    rt.spec.train().max_restarts(), ")");
  }
  return msg;
}

void Scheduler::RankFailed(JobRt* rt, int rank, const std::string& reason, Outbox* out) {
  Event(rt, rt->state, "rank_exit", reason, false);
  if (rt->restarts < rt->spec.train().max_restarts()) {
    BeginStop(rt, StopAction::kRestart, reason, out);
  } else {
    BeginStop(rt, StopAction::kFail, FailureMessage(*rt, reason), out);
  }
  (void)rank;
}

// --- Agents ----------------------------------------------------------------

absl::Status Scheduler::AgentRegistered(const v1::RegisterAgent& reg, const std::string& peer,
                                        std::shared_ptr<AgentConnection> conn) {
  if (reg.node().empty() || reg.node().size() > 256) {
    return absl::InvalidArgumentError("RegisterAgent.node must be 1-256 characters");
  }
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
    Node& n = nodes_[reg.node()];
    if (n.conn && n.conn != conn) n.conn->Close();  // a reconnect replaces the old stream
    n.name = reg.node();
    n.address = peer;
    n.topology = reg.topology();
    n.conn = conn;
    n.last_heartbeat = Clock::now();
    // Job -> the attempts of its ranks to stop there (only those: a new
    // attempt the tick launches on this node before the stop is sent must
    // not be stopped with them).
    std::map<std::string, std::set<int>> stop_jobs;
    for (const auto& r : reg.running()) {
      auto it = jobs_.find(r.job_id());
      if (it == jobs_.end() || it->second->attempt != r.attempt() ||
          !RanksWelcome(*it->second) ||
          it->second->stop != StopAction::kNone) {
        stop_jobs[r.job_id()].insert(r.attempt());
      }
    }
    // Ranks of running jobs placed here that the agent did not list: it
    // restarted while they trained on (a killed or crashed agent). It
    // supervises them again, or reports how they ended (AdoptRanks).
    v1::CoordinatorCommand adopt;
    for (const auto& [id, rt] : jobs_) {
      if (rt->state != v1::RUNNING || rt->stop != StopAction::kNone || TrialRunning(*rt)) continue;
      for (size_t r = 0; r < rt->ranks.size(); ++r) {
        const RankRt& rr = rt->ranks[r];
        if (rr.node != reg.node() || rr.exited) continue;
        const bool listed = std::any_of(
            reg.running().begin(), reg.running().end(), [&](const v1::RunningRank& x) {
              return x.job_id() == id && x.rank() == static_cast<int>(r) &&
                     x.attempt() == rt->attempt;
            });
        if (listed) continue;
        *adopt.mutable_adopt()->add_ranks() = RunningRankOf(*rt, static_cast<int>(r));
      }
    }
    // Ranks of stopped attempts that never reported while this node was
    // away: adopted, then stopped (StopRanks of their attempt, below).
    if (auto o = orphans_.find(reg.node()); o != orphans_.end()) {
      for (const v1::RunningRank& r : o->second) {
        *adopt.mutable_adopt()->add_ranks() = r;
        stop_jobs[r.job_id()].insert(r.attempt());
      }
      orphans_.erase(o);
    }
    if (adopt.adopt().ranks_size() > 0) {
      out.emplace_back(conn, adopt);
      spdlog::warn("node {} registered without {} rank(s) placed there; asking it to adopt them",
                   reg.node(), adopt.adopt().ranks_size());
    }
    for (const auto& [j, attempts] : stop_jobs) {
      QueueStopOn(j, {reg.node()}, &out, attempts);  // n.conn is this stream now
      spdlog::warn("node {} still runs ranks of job {}, which is not running here or is being "
                   "stopped; stopping them", reg.node(), j);
    }
    wake_ = true;
  }
  cv_.notify_all();
  spdlog::info("node {} registered from {}", reg.node(), peer);
  RecordRunning(reg.node(), {reg.running().begin(), reg.running().end()});
  Flush(&out);
  return absl::OkStatus();
}

void Scheduler::AgentHeartbeat(const std::string& node, const v1::AgentHeartbeat& hb) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = nodes_.find(node);
    if (it != nodes_.end()) it->second.last_heartbeat = Clock::now();
  }
  RecordRunning(node, {hb.running().begin(), hb.running().end()});
}

void Scheduler::RecordRunning(const std::string& node, const std::vector<v1::RunningRank>& running) {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& r : running) {
    auto it = jobs_.find(r.job_id());
    if (it == jobs_.end()) continue;
    JobRt* rt = it->second.get();
    if (r.attempt() != rt->attempt || r.rank() < 0 ||
        r.rank() >= static_cast<int>(rt->ranks.size()))
      continue;
    RankRt& rr = rt->ranks[r.rank()];
    if (rr.node != node || rr.progress.pid() == r.pid()) continue;
    rr.progress.set_pid(r.pid());
    absl::Status s = store_->RecordRank({rt->id, r.rank(), r.attempt(), node, r.pid(), r.pid()});
    if (!s.ok()) spdlog::warn("job {}: cannot record rank pid: {}", rt->id, s.ToString());
  }
}

void Scheduler::RankExited(const std::string& node, const v1::RankExited& e) {
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shutting_down_) return;
    auto it = jobs_.find(e.job_id());
    if (it == jobs_.end()) return;
    JobRt* rt = it->second.get();
    if (!RanksWelcome(*rt) || e.attempt() != rt->attempt ||
        e.rank() < 0 || e.rank() >= static_cast<int>(rt->ranks.size())) {
      return;
    }
    RankRt& rr = rt->ranks[e.rank()];
    if (rr.exited) return;
    rr.exited = true;
    const bool clean = e.exit_code() == 0 && e.signal() == 0 && !e.status_unknown();
    rr.progress.set_exit_code(e.exit_code());
    rr.progress.set_state(clean ? "exited" : "failed");
    const std::string how =
        e.status_unknown()
            ? absl::StrCat("rank ", e.rank(), " on node ", node,
                           " (adopted after a restart of its agent or the coordinator) "
                           "ended without an exit "
                           "status (killed by a signal or crashed)")
        : e.signal() != 0 ? absl::StrCat("rank ", e.rank(), " on node ", node,
                                         " was killed by signal ", SignalName(e.signal()))
        : e.exit_code() == kRankExitStopped
            ? absl::StrCat("rank ", e.rank(), " on node ", node,
                           " was stopped (exit code 5: SIGTERM or SIGINT not from this "
                           "coordinator, e.g. its agent stopping)")
            : absl::StrCat("rank ", e.rank(), " on node ", node, " exited with code ",
                           e.exit_code());
    // `how` and the agent's last lines of the rank's log.
    auto with_output = [&](size_t limit) {
      return e.message().empty()
                 ? how
                 : absl::StrCat(how, "; last output:\n", e.message().substr(0, limit));
    };
    if (TrialRunning(*rt)) {
      // A trial's rank: its end is the trial's business (RunTrial).
      if (!clean && rt->trials->failure.empty()) rt->trials->failure = with_output(2000);
      trial_cv_.notify_all();
      return;
    }
    // Stored at once, before what it leads to: a coordinator restarted from
    // here on neither waits for this rank again nor reports its end twice.
    Persist(rt);
    if (rt->stop != StopAction::kNone) {
      // SIGTERM, or SIGKILL after the grace, is our own StopRanks at work
      // (an adopted rank's unknown end is taken for SIGKILL: a rank stopped
      // by SIGTERM writes its exit record).
      // (A rank that took our stop and left its loop exits 5, "stopped".)
      bool ours = e.signal() == SIGTERM || (e.signal() == 0 && e.exit_code() == kRankExitStopped) ||
                  ((e.signal() == SIGKILL || e.status_unknown()) &&
                   Clock::now() - rt->stop_started >
                       std::chrono::duration<double>(opt_.stop_grace_s * 0.9));
      if (!clean && !ours && rt->stop != StopAction::kCancel && rt->other_failures.size() < 16) {
        rt->other_failures.push_back(how);
      }
      wake_ = true;
    } else if (!clean) {
      RankFailed(rt, e.rank(), with_output(4000), &out);
    } else if (std::all_of(rt->ranks.begin(), rt->ranks.end(),
                           [](const RankRt& r) { return r.exited; })) {
      Finish(rt, v1::SUCCEEDED, absl::StrCat("all ", rt->ranks.size(), " ranks exited 0"));
    }
  }
  cv_.notify_all();
  Flush(&out);
}

void Scheduler::AgentDisconnected(const std::string& node,
                                  const std::shared_ptr<AgentConnection>& conn) {
  conn->Close();
  std::lock_guard<std::mutex> l(mu_);
  auto it = nodes_.find(node);
  if (it != nodes_.end() && it->second.conn == conn) {
    it->second.conn.reset();
    spdlog::warn("node {} disconnected", node);
  }
}

// --- Ranks -----------------------------------------------------------------

absl::StatusOr<v1::GetAssignmentResponse> Scheduler::GetAssignment(
    const v1::GetAssignmentRequest& req) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(req.job_id());
  if (it == jobs_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", req.job_id(), " is not running (unknown or finished)"));
  }
  JobRt* rt = it->second.get();
  const bool trial = TrialRunning(*rt);
  if (!RanksWelcome(*rt) || rt->stop != StopAction::kNone) {
    return absl::FailedPreconditionError(absl::StrCat("job ", rt->id, " is ",
                                                      v1::JobState_Name(rt->state),
                                                      rt->stop != StopAction::kNone ? " and stopping" : ""));
  }
  if (req.attempt() != rt->attempt) {
    return absl::FailedPreconditionError(absl::StrCat("attempt ", req.attempt(),
                                                      " is stale; the job is at attempt ",
                                                      rt->attempt));
  }
  if (req.rank() < 0 || req.rank() >= static_cast<int>(rt->ranks.size())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", req.rank(), " is outside 0..",
                                                   rt->ranks.size() - 1));
  }
  v1::GetAssignmentResponse resp;
  resp.set_rank(req.rank());
  resp.set_world_size(static_cast<int>(rt->ranks.size()));
  resp.set_attempt(rt->attempt);
  RankRt& rr = rt->ranks[req.rank()];
  rr.last_progress = Clock::now();
  if (trial) {
    // A tuning trial: the candidate plan, a few steps, no checkpoints.
    *resp.mutable_spec() = TrialSpec(rt->spec);
    *resp.mutable_plan() = rt->trials->plan;
    rr.progress.set_state("trial");
    return resp;
  }
  *resp.mutable_spec() = rt->spec;
  *resp.mutable_plan() = rt->plan;
  std::string dir = CheckpointDir(rt->id);
  resp.set_checkpoint_dir(dir);
  // `latest` is one short line (model/train/checkpoint.h); more is not one.
  std::string latest(absl::StripAsciiWhitespace(ReadFileOrEmpty(dir + "/latest", 4096)));
  // A step directory's name (step-NNNNNNNN): no '/', '..' or NUL reaches
  // the path the ranks resume from; anything else the trainer refuses itself.
  const bool name_ok = !latest.empty() && latest != "." && latest != ".." &&
                       std::all_of(latest.begin(), latest.end(), [](char c) {
                         return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
                       });
  struct stat st;
  if (name_ok && stat((dir + "/" + latest).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    resp.set_resume_from(dir + "/" + latest);
  }
  rr.progress.set_state("running");
  return resp;
}

v1::RankHeartbeatResponse Scheduler::RankHeartbeat(const v1::RankHeartbeatRequest& req) {
  v1::RankHeartbeatResponse resp;
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(req.job_id());
  if (it == jobs_.end()) {
    resp.set_stop(true);
    resp.set_reason(absl::StrCat("job ", req.job_id(), " is not running"));
    return resp;
  }
  JobRt* rt = it->second.get();
  if (!RanksWelcome(*rt) || rt->stop != StopAction::kNone) {
    resp.set_stop(true);
    resp.set_reason(rt->stop != StopAction::kNone ? rt->stop_message : rt->message);
    return resp;
  }
  if (req.attempt() != rt->attempt) {
    resp.set_stop(true);
    resp.set_reason(absl::StrCat("attempt ", req.attempt(), " is stale (now ", rt->attempt, ")"));
    return resp;
  }
  if (req.rank() >= 0 && req.rank() < static_cast<int>(rt->ranks.size())) {
    RankRt& rr = rt->ranks[req.rank()];
    rr.last_progress = Clock::now();
    if (req.step() > rr.progress.step()) rr.progress.set_step(req.step());
    if (rr.progress.state() == "starting" || rr.progress.state() == "recovering") {
      rr.progress.set_state("running");
    }
  }
  return resp;
}

std::string Scheduler::IngestSample(const v1::MetricSample& s, const std::string& job_hint,
                                    int rank_hint) {
  std::lock_guard<std::mutex> l(mu_);
  std::string job = job_hint;
  if (s.has_step()) job = s.step().job_id();
  if (s.has_eval()) job = s.eval().job_id();
  if (s.has_probe_row()) job = s.probe_row().job_id();
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return job;
  JobRt* rt = it->second.get();
  if (s.has_step()) {
    const v1::StepMetrics& m = s.step();
    if (m.rank() < 0 || m.rank() >= static_cast<int>(rt->ranks.size())) return job;
    if (m.attempt() != rt->attempt) return job;  // late, of an earlier attempt or trial
    RankRt& rr = rt->ranks[m.rank()];
    rr.last_progress = Clock::now();
    v1::RankProgress& p = rr.progress;
    const bool trial = TrialRunning(*rt);
    // A killed rank's last samples can arrive after its exit: it stays
    // "exited"/"failed".
    if (!rr.exited) p.set_state(trial ? "trial" : "running");
    p.set_step(m.step());
    if (m.total_steps() > 0) p.set_total_steps(m.total_steps());
    p.set_loss(m.loss());
    p.set_samples_per_second(m.samples_per_second());
    p.set_step_seconds(m.step_seconds());
    rt->dirty = true;
    if (trial) {
      // A tuning trial's step: timed after the warmup; not the job's own
      // progress, plan check or /metrics series.
      if (m.step() > kTrialWarmupSteps && m.step_seconds() > 0) {
        rt->trials->steps.push_back(SampleOf(m));
      }
      trial_cv_.notify_all();
      v1::WatchJobResponse u;
      *u.mutable_sample() = s;
      Publish(job, u);
      return job;
    }
    // The plan check skips each rank's first two steps of an attempt
    // (allocation, first-touch, loader warm-up).
    if (++rr.step_samples > 2 && m.step_seconds() > 0) {
      if (rt->step_samples.size() < kMaxStepSamples) {
        rt->step_samples.push_back(SampleOf(m));
      } else {
        rt->step_samples[rt->step_samples_seen % kMaxStepSamples] = SampleOf(m);
      }
      ++rt->step_samples_seen;
      rt->step_seconds_seen += m.step_seconds();
      if (!m.attention_kernels().empty()) {
        if (!rt->attention_kernels.empty() && rt->attention_kernels != m.attention_kernels())
          rt->attention_mixed = true;
        rt->attention_kernels = m.attention_kernels();
      }
      if (!rt->live_checked && rt->planned && rt->spec.kind() != "comm_probe" &&
          LiveCheckDue(rt->step_samples.size(), rt->step_seconds_seen,
                       static_cast<int>(rt->ranks.size()))) {
        LiveCheck(rt);
      }
    }
    rt->loss_curve.Add(m.step(), m.rank(), m.loss(), static_cast<int>(rt->ranks.size()));
    hub_->IngestStep(m, rr.node, rr.local_device);
  } else if (s.has_probe_row()) {
    // dgca diagnose comm: rank 0's rows are the measurement (every rank
    // timed the same collectives; rank 0 speaks for the job, as nccl-tests).
    const v1::CommProbeRow& row = s.probe_row();
    if (row.rank() < 0 || row.rank() >= static_cast<int>(rt->ranks.size())) return job;
    rt->ranks[row.rank()].last_progress = Clock::now();
    if (row.rank() == 0) {
      absl::Status st = store_->AddCommProbeRow(NodeSetKey(*rt), row.backend(),
                                                static_cast<int32_t>(rt->ranks.size()), row);
      if (!st.ok()) {
        Event(rt, rt->state, "info", absl::StrCat("cannot store a comm measurement: ",
                                                  st.message()), false);
      } else {
        Event(rt, rt->state, "probe",
              absl::StrFormat("%d bytes: %.1f us, algbw %.3f GB/s, busbw %.3f GB/s",
                              row.bytes(), row.seconds_per_op() * 1e6,
                              row.algbw_bytes_per_second() / 1e9,
                              row.busbw_bytes_per_second() / 1e9),
              false);
      }
    }
  } else if (s.has_eval()) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : s.eval().metrics()) {
      rt->eval[k] = v;
      parts.push_back(absl::StrCat(k, "=", v));
    }
    std::sort(parts.begin(), parts.end());
    hub_->IngestEval(s.eval());
    rt->dirty = true;
    if (s.eval().rank() == 0) {
      Event(rt, rt->state, "eval",
            absl::StrCat("step ", s.eval().step(), ": ", absl::StrJoin(parts, " ")), false);
    }
    Persist(rt);
  }
  (void)rank_hint;
  v1::WatchJobResponse u;
  *u.mutable_sample() = s;
  Publish(job, u);
  return job;
}

}  // namespace dgca
