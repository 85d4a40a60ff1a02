// Scheduler: what the CLI reads (coordinator/scheduler.h): jobs, their
// diagnosis, WatchJob subscriptions, nodes and logs.
#include <algorithm>
#include <filesystem>
#include <optional>

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/plan_checks.h"
#include "coordinator/scheduler.h"
#include "spdlog/spdlog.h"

namespace dgca {

absl::StatusOr<v1::GetJobResponse> Scheduler::GetJob(const std::string& id) {
  auto stored = store_->GetJob(id);
  if (!stored.ok()) return stored.status();
  v1::GetJobResponse resp;
  *resp.mutable_job() = stored->job;
  if (stored->has_plan) *resp.mutable_plan() = stored->plan;
  if (!opt_.state_dir.empty()) resp.set_checkpoint_dir(CheckpointDir(id));
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) resp.set_coordinator_host(host);
  {
    absl::MutexLock l(&mu_);
    if (const JobRt* rt = FindJob(id); rt != nullptr) {
      FillProgress(*rt, Now(), resp.mutable_job());
    } else if (auto f = finished_.find(id); f != finished_.end()) {
      *resp.mutable_job()->mutable_ranks() = f->second.ranks();
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
    absl::MutexLock l(&mu_);
    if (const JobRt* rt = FindJob(id); rt != nullptr) {
      live_state = rt->state;
      live_plan = rt->planned ? rt->plan : v1::Plan();
      samples = rt->steps.samples;  // copied: the medians are computed unlocked
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
    const v1::Job& j = stored->job;
    const bool failed = j.state() == v1::FAILED, cancelled = j.state() == v1::CANCELLED;
    if ((failed || cancelled) && j.step() == 0) {
      // Nothing ran to diagnose: what the user needs is why, which is the
      // job's message (missing files, a rank that could not start), not
      // "too few steps".
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, failed ? " failed" : " was cancelled",
          " before its first training step, so it has no steps to diagnose; ",
          failed ? "it failed: " : "", j.message().empty() ? "(no message)" : j.message()));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrFormat(
            "job %s (%s) left no step breakdown to diagnose: it ran fewer than %d steady-state "
            "rank-steps (each rank's first two steps are warm-up), or finished before its "
            "coordinator kept breakdowns",
            id, state, static_cast<int>(kMinStepSamples)),
        failed && !j.message().empty() ? absl::StrCat("; it failed: ", j.message()) : ""));
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
  // The list omits the spec YAML and ranks to stay small. The name and
  // time filters come after the store's read, so the limit does too.
  const bool filtered = !req.name_contains().empty() || req.since_unix_ms() > 0;
  auto jobs = store_->ListJobs(states, filtered ? 0 : req.limit());
  if (!jobs.ok()) return jobs.status();
  if (filtered) {
    std::vector<v1::Job> kept;
    for (v1::Job& j : *jobs) {
      // Newest first: the first one older than --since ends the list.
      if (j.created_unix_ms() < req.since_unix_ms()) break;
      if (!absl::StrContains(j.name(), req.name_contains())) continue;
      kept.push_back(std::move(j));
      if (req.limit() > 0 && static_cast<int>(kept.size()) >= req.limit()) break;
    }
    *jobs = std::move(kept);
  }
  absl::MutexLock l(&mu_);
  for (v1::Job& j : *jobs) {
    j.clear_spec_yaml();
    if (const JobRt* rt = FindJob(j.id()); rt != nullptr) FillProgress(*rt, Now(), &j);
  }
  return jobs;
}

absl::StatusOr<v1::DeleteJobResponse> Scheduler::DeleteJob(const std::string& id) {
  std::string dir;
  {
    absl::MutexLock l(&mu_);
    if (const JobRt* rt = FindJob(id); rt != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " is ", v1::JobState_Name(rt->state),
                       ": only a job that has ended can be deleted; cancel it first (dgca cancel ",
                       id, ")"));
    }
    // Where rank logs, checkpoints and Slurm's output of the job go on this
    // node (none without a state dir: nothing on disk to remove).
    if (!opt_.state_dir.empty()) dir = absl::StrCat(opt_.state_dir, "/jobs/", id);
  }
  // Only jobs that have ended get here, and an ended job never becomes
  // active again (a resubmission is a new job), so nothing races this.
  auto stored = store_->GetJob(id);
  if (!stored.ok()) return stored.status();
  v1::DeleteJobResponse resp;
  *resp.mutable_job() = stored->job;
  resp.mutable_job()->clear_spec_yaml();
  if (absl::Status s = store_->DeleteJob(id); !s.ok()) return s;
  {
    absl::MutexLock l(&mu_);
    finished_.erase(id);
    finished_order_.erase(std::remove(finished_order_.begin(), finished_order_.end(), id),
                          finished_order_.end());
    hub_->RemoveJob(id);
  }
  // Its files on this node: rank logs, checkpoints, Slurm's output.
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!dir.empty() && fs::is_directory(dir, ec)) {
    int64_t bytes = 0;
    for (auto it = fs::recursive_directory_iterator(dir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code size_ec;
      if (it->is_regular_file(size_ec)) bytes += static_cast<int64_t>(it->file_size(size_ec));
    }
    ec.clear();
    fs::remove_all(dir, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("job ", id, "'s record is deleted, but its directory ",
                                              dir, " could not be removed: ", ec.message()));
    }
    resp.set_removed_dir(dir);
    resp.set_removed_bytes(bytes);
  }
  spdlog::info("job {} deleted (dgca delete){}", id,
               resp.removed_dir().empty() ? "" : absl::StrCat(", and ", resp.removed_dir()));
  return resp;
}

absl::Status Scheduler::ForgetNode(const std::string& node) {
  absl::MutexLock l(&mu_);
  const Node* n = nodes_.Find(node);
  if (n == nullptr) {
    std::vector<std::string> names;
    for (const auto& [name, known] : nodes_.nodes()) names.push_back(name);
    return absl::NotFoundError(absl::StrCat("no node named '", node, "' has registered (known: ",
                                            names.empty() ? "none" : absl::StrJoin(names, ", "),
                                            ")"));
  }
  if (n->conn) {
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
  nodes_.Erase(node);
  hub_->RemoveNode(node);
  spdlog::info("node {} forgotten (dgca nodes forget)", node);
  return absl::OkStatus();
}

std::vector<v1::NodeInfo> Scheduler::ListNodes() {
  absl::MutexLock l(&mu_);
  std::vector<v1::NodeInfo> out;
  const auto now = Now();
  for (const auto& [name, n] : nodes_.nodes()) {
    v1::NodeInfo info;
    info.set_name(name);
    info.set_address(n.address);
    info.set_connected(n.conn != nullptr);
    info.set_state(n.State());
    info.set_heartbeat_age_seconds(SecondsBetween(n.last_heartbeat, now));
    *info.mutable_topology() = n.topology;
    for (const auto& [id, rt] : jobs_) {
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
  // Subscribe before the replay so nothing falls between; the caller drops
  // events with seq <= the last replayed one.
  std::shared_ptr<WatchSubscription> sub = watch_.Subscribe(id);
  auto events = store_->ListEvents(id, after_seq);
  auto job = GetJob(id);
  if (!job.ok()) {
    watch_.Unsubscribe(id, sub);
    return job.status();
  }
  // The replay goes first in a queue of its own, so it precedes the live
  // updates `sub` buffered meanwhile, which HandOver moves behind it.
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
  watch_.HandOver(id, sub, replay);
  return replay;
}

void Scheduler::Unwatch(const std::string& id, const std::shared_ptr<WatchSubscription>& sub) {
  watch_.Unsubscribe(id, sub);
}

absl::StatusOr<std::string> Scheduler::LogPath(const std::string& id, int rank) {
  auto stored = store_->GetJob(id);
  if (!stored.ok()) return stored.status();
  if (rank < 0) return absl::InvalidArgumentError("rank must be >= 0");
  return absl::StrCat(opt_.state_dir, "/jobs/", id, "/rank-", rank, ".log");
}

}  // namespace dgca
