// Scheduler: jobs whose ranks run in a Slurm allocation
// (resources.launcher: slurm; coordinator/scheduler.h, docs/slurm.md).
//
// A Slurm job is PENDING while its allocation waits in Slurm ("waiting in
// Slurm: PENDING (Resources)"), PLANNING once Slurm runs it and until every
// node's agent has registered, then planned on those agents' topologies and
// launched on them like any job. Its measurements are filed under its
// partition (SlurmNodeSet), not under the nodes it happened to get. When it
// ends, its agents are released and exit, which ends the allocation; what
// Slurm still holds a little later is cancelled.
#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/measured_planning.h"
#include "coordinator/scheduler.h"
#include "coordinator/slurm_script.h"
#include "planner/plan_format.h"
#include "spdlog/spdlog.h"

namespace dgca {
namespace {

// Margin of resources.slurm.time auto over the predicted run time: a share
// of it and a fixed part for start-up, evaluation and checkpoints.
constexpr double kTimeMarginShare = 0.25;
constexpr double kTimeMarginSeconds = 600;

int SlurmNodes(const v1::JobSpec& spec) {
  return spec.resources().slurm().nodes() > 0 ? spec.resources().slurm().nodes() : 1;
}

// The job's nodes before Slurm names them: as many as it asks for, each
// like `last`, the topology the partition's last allocation reported.
std::vector<v1::Topology> NodesLike(const v1::JobSpec& spec, const v1::Topology& last) {
  std::vector<v1::Topology> topo;
  for (int i = 0; i < SlurmNodes(spec); ++i) {
    v1::Topology t = last;
    t.set_node(absl::StrCat("slurm-node-", i));
    topo.push_back(std::move(t));
  }
  return topo;
}

// Points the plan's ranks at the nodes of a new allocation: the k-th node
// of the old plan (sorted by name) becomes the k-th of `topo`.
void RemapPlanNodes(const std::vector<v1::Topology>& topo, v1::Plan* plan) {
  std::set<std::string> old(plan->rank_nodes().begin(), plan->rank_nodes().end());
  std::vector<std::string> fresh;
  for (const auto& t : topo) fresh.push_back(t.node());
  std::sort(fresh.begin(), fresh.end());
  std::map<std::string, std::string> to;
  size_t i = 0;
  for (const std::string& n : old) to[n] = i < fresh.size() ? fresh[i++] : n;
  for (auto& n : *plan->mutable_rank_nodes()) n = to[n];
}

}  // namespace

std::string Scheduler::SbatchFor(const v1::JobSpec& spec, const std::string& job_id, int attempt,
                                 const std::string& time) {
  SbatchOptions o;
  o.job_id = job_id;
  o.attempt = attempt;
  o.coordinator = launchers_.advertise_address;
  o.token_file = launchers_.token_file;
  o.tls_ca_file = launchers_.tls_ca_file;
  o.worker_binary = launchers_.worker_binary;
  o.state_dir = launchers_.state_dir;
  o.time = time;
  return SbatchScript(spec.resources().slurm(), o);
}

absl::Status Scheduler::CheckSlurmSpec(const v1::JobSpec& spec) {
  {
    absl::MutexLock l(&mu_);
    if (launchers_.advertise_address.empty()) {
      return absl::FailedPreconditionError(
          "resources.launcher: slurm needs the address Slurm's agents call this coordinator "
          "back on, and this coordinator was started without one (dgca-coordinator "
          "--advertise HOST:PORT)");
    }
  }
  const Slurm slurm(opt_.slurm);
  auto nodes = slurm.PartitionNodes(spec.resources().slurm().partition());
  if (!nodes.ok()) {
    return absl::Status(nodes.status().code(),
                        absl::StrCat("resources.slurm: ", nodes.status().message()));
  }
  const int want = SlurmNodes(spec);
  if (want > *nodes) {
    const std::string& p = spec.resources().slurm().partition();
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.slurm.nodes = ", want, " but Slurm's partition ",
        p.empty() ? "(the default)" : p, " has ", *nodes, " node(s) (sinfo); ask for at most ",
        *nodes));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::DryRunSlurm(const v1::JobSpec& spec, v1::SubmitJobResponse* resp) {
  if (absl::Status st = CheckSlurmSpec(spec); !st.ok()) return st;
  // The partition's last allocation's topology, when one ran: the plan that
  // the job would get on nodes like those.
  auto topology = store_->LauncherTopology(SlurmNodeSet(spec));
  std::string time = spec.resources().slurm().time();
  if (!topology.ok()) {
    resp->add_launcher_notes(absl::StrCat(
        "no plan yet: it is made when Slurm allocates the ", SlurmNodes(spec),
        " node(s) and their agents report their topology (no earlier allocation on ",
        SlurmNodeSet(spec), " reported one)"));
    if (time == "auto") {
      std::string note;
      time = AutoTimeLimit(spec, 0, 0, &note);
      resp->add_launcher_notes(note);
    }
  } else {
    bool step_measured = false;
    auto plan = PlanMeasured(store_.get(), spec, NodesLike(spec, *topology), nullptr,
                             SlurmNodeSet(spec), &step_measured, BaseMeasurements());
    if (!plan.ok()) return plan.status();
    *resp->mutable_plan() = *plan;
    resp->add_launcher_notes(absl::StrCat(
        "planned against the topology the last allocation on ", SlurmNodeSet(spec),
        " reported (hostname ", topology->hostname(), "); the job is planned again on the nodes "
        "Slurm gives it"));
    if (time == "auto") {
      std::string note;
      time = AutoTimeLimit(spec, step_measured ? plan->predicted_step_seconds() : 0, 0, &note);
      resp->add_launcher_notes(note);
    }
  }
  absl::MutexLock l(&mu_);
  resp->set_launcher_script(SbatchFor(spec, "JOB", 0, time));
  return absl::OkStatus();
}

std::string Scheduler::AutoTimeLimit(const v1::JobSpec& spec, double step_seconds,
                                     int64_t steps_done, std::string* note) {
  if (step_seconds <= 0) {
    *note = absl::StrCat("resources.slurm.time auto: no step-time measurement of this model on ",
                         SlurmNodeSet(spec),
                         " yet, so no --time (the partition's default limit applies)");
    return "";
  }
  const int64_t left = std::max<int64_t>(1, spec.train().steps() - std::max<int64_t>(0, steps_done));
  const double seconds = left * step_seconds * (1 + kTimeMarginShare) + kTimeMarginSeconds;
  const std::string limit = SlurmTimeLimit(seconds);
  *note = absl::StrFormat(
      "resources.slurm.time auto: --time=%s (%d steps x %.3f s predicted x %.2f + %.0f s)", limit,
      left, step_seconds, 1 + kTimeMarginShare, kTimeMarginSeconds);
  return limit;
}

std::string Scheduler::SlurmTimeFor(const JobRt& rt, std::string* note) {
  const std::string& asked = rt.spec.resources().slurm().time();
  if (asked != "auto") return asked;
  // Planned on nodes like the partition's last ones, with this model's
  // measurements on the partition: the step time, when one was measured.
  double step_seconds = 0;
  auto topology = store_->LauncherTopology(SlurmNodeSet(rt.spec));
  if (topology.ok()) {
    bool step_measured = false;
    auto plan = PlanMeasured(store_.get(), rt.spec, NodesLike(rt.spec, *topology), nullptr,
                             SlurmNodeSet(rt.spec), &step_measured, BaseMeasurements());
    if (plan.ok() && step_measured) step_seconds = plan->predicted_step_seconds();
  }
  int64_t done = -1;
  for (const RankRt& r : rt.ranks) {
    done = done < 0 ? r.progress.step() : std::min(done, r.progress.step());
  }
  std::string why;
  const std::string limit = AutoTimeLimit(rt.spec, step_seconds, done, &why);
  *note = "; " + why;
  return limit;
}

void Scheduler::SyncLauncher(JobRt* rt, const SlurmLauncher::Allocation& a) {
  v1::LauncherStatus l = rt->launcher;
  l.set_job_id(a.id);
  // squeue is polled: a poll from before the agents registered must not
  // take a running allocation back to PENDING.
  const bool stale = l.state() == "RUNNING" && (a.state.empty() || a.state == "PENDING");
  if (!stale) {
    if (!a.state.empty()) l.set_state(a.state);
    l.set_reason(a.reason);
    if (!a.nodes.empty()) l.set_nodes(a.nodes);
  }
  if (l.SerializeAsString() != rt->launcher.SerializeAsString()) {
    rt->launcher = l;
    rt->dirty = true;
  }
}

void Scheduler::RequestAllocation(JobRt* rt) {
  if (launchers_.advertise_address.empty()) {
    Finish(rt, v1::FAILED,
           "resources.launcher: slurm: this coordinator has no address for Slurm's agents to "
           "call back on (dgca-coordinator --advertise HOST:PORT)");
    return;
  }
  std::string note;
  const std::string time = SlurmTimeFor(*rt, &note);
  const std::string path = SbatchScriptPath(launchers_.state_dir, rt->id, rt->attempt);
  slurm_->Request(rt->id, rt->attempt, path, SbatchFor(rt->spec, rt->id, rt->attempt, time));
  rt->allocation_attempt = rt->attempt;
  rt->launcher.Clear();
  rt->launcher.set_kind("slurm");
  rt->launcher.set_script(path);
  rt->dirty = true;
  Event(rt, rt->state == v1::RUNNING ? v1::PLANNING : rt->state, "info",
        absl::StrCat("asking Slurm for ", SlurmNodes(rt->spec), " node(s) for attempt ",
                     rt->attempt, " (sbatch ", path, ")", note),
        false);
}

void Scheduler::ScheduleSlurm(JobRt* rt, Outbox* out) {
  if (rt->allocation_attempt < 0) {
    RequestAllocation(rt);
    return;
  }
  const auto a = slurm_->Get(rt->id, rt->allocation_attempt);
  if (!a.has_value()) {  // not tracked (a record the store lost): ask again
    RequestAllocation(rt);
    return;
  }
  SyncLauncher(rt, *a);
  if (!a->error.empty()) {
    Finish(rt, v1::FAILED, FailureMessage(*rt, absl::StrCat("Slurm did not allocate: ", a->error)));
    return;
  }
  const int want = SlurmNodes(rt->spec);
  std::vector<v1::Topology> topo =
      a->id.empty() ? std::vector<v1::Topology>() : nodes_.BoundTopologies(rt->id, a->id);
  if (a->gone && static_cast<int>(topo.size()) < want) {
    const std::string why = absl::StrCat(
        "Slurm job ", a->id, " ended (", a->state.empty() ? "gone" : a->state,
        ") before its agents registered; Slurm's output is ", launchers_.state_dir, "/jobs/",
        rt->id, "/slurm-", a->id, ".out");
    if (rt->restarts < rt->spec.train().max_restarts()) {
      rt->restarts++;
      rt->attempt++;
      rendezvous_.ClearAttemptsBefore(rt->id, rt->attempt);
      (void)store_->SetRestarts(rt->id, rt->restarts);
      hub_->IncRankRestarts(rt->id);
      Event(rt, v1::PENDING, "info",
            absl::StrCat(why, "; restart ", rt->restarts, " of ", rt->spec.train().max_restarts(),
                         " asks for a new allocation"),
            true);
      RequestAllocation(rt);
      return;
    }
    Finish(rt, v1::FAILED, FailureMessage(*rt, why));
    return;
  }
  if (static_cast<int>(topo.size()) < want) {
    const bool queued = !a->submitted || a->state.empty() || a->state == "PENDING";
    const std::string why =
        !a->submitted ? absl::StrCat("asking Slurm for ", want, " node(s)")
        : queued      ? absl::StrCat("waiting in Slurm: ", a->state.empty() ? "PENDING" : a->state,
                                     a->reason.empty() ? "" : absl::StrCat(" (", a->reason, ")"),
                                     " (Slurm job ", a->id, ")")
                      : absl::StrCat("Slurm job ", a->id, " is ", a->state, " on ", a->nodes,
                                     "; waiting for ", want - static_cast<int>(topo.size()),
                                     " of its ", want, " agent(s) to register");
    const v1::JobState state = queued ? v1::PENDING : v1::PLANNING;
    if (rt->message != why || rt->state != state) Event(rt, state, "info", why, true);
    return;
  }
  // Every agent of the allocation is here, so Slurm runs it, whatever its
  // last squeue (up to one poll old) said; the nodes are the agents' hosts.
  if (rt->launcher.state() != "RUNNING") {
    std::vector<std::string> hosts;
    for (const auto& t : topo) hosts.push_back(t.hostname());
    std::sort(hosts.begin(), hosts.end());
    rt->launcher.set_state("RUNNING");
    rt->launcher.clear_reason();
    if (rt->launcher.nodes().empty()) rt->launcher.set_nodes(absl::StrJoin(hosts, ","));
    rt->dirty = true;
  }
  (void)store_->SetLauncherTopology(SlurmNodeSet(rt->spec), topo.front());
  if (rt->state == v1::PENDING) Event(rt, v1::PLANNING, "state", "planning", true);
  if (!rt->planned) {
    absl::StatusOr<v1::Plan> plan;
    try {
      plan = PlanMeasured(store_.get(), rt->spec, topo, nullptr, SlurmNodeSet(rt->spec), nullptr,
                          BaseMeasurements());
    } catch (const std::exception& e) {
      plan = absl::InternalError(absl::StrCat("planner threw: ", e.what()));
    }
    if (!plan.ok() || plan->ranks() <= 0) {
      Finish(rt, v1::FAILED,
             absl::StrCat("planning failed: ",
                          plan.ok() ? "the plan has no ranks" : plan.status().message()));
      return;
    }
    rt->plan = *plan;
    rt->planned = true;
    if (rt->spec.tuning().mode() == "trial") {
      Event(rt, v1::PLANNING, "info",
            "tuning.mode trial does not run trials in a Slurm allocation yet: the model's plan "
            "is used",
            false);
    }
    (void)store_->SetPlan(rt->id, rt->plan);
    Event(rt, v1::PLANNING, "plan", PlanSummary(rt->plan), false);
  } else {
    RemapPlanNodes(topo, &rt->plan);  // a new allocation's agents have new names
    (void)store_->SetPlan(rt->id, rt->plan);
  }
  std::string why;
  if (Launch(rt, rt->plan, out, &why)) {
    Event(rt, v1::RUNNING, "state",
          absl::StrCat("running ", rt->plan.ranks(), " ranks in Slurm job ", a->id, " (",
                       rt->launcher.nodes(), ")"),
          true);
    if (!rt->restart_pending.empty()) {
      Announce(rt, store_->RecordRestart(rt->id, rt->restarts, rt->restart_pending));
      rt->restart_pending.clear();
    }
  } else if (rt->message != why) {
    Event(rt, v1::PLANNING, "info", why, true);
  }
}

void Scheduler::RestartSlurm(JobRt* rt, const std::string& restart, Outbox* out) {
  std::string why;
  if (Launch(rt, rt->plan, out, &why)) {  // the allocation and its agents are all there
    Announce(rt, store_->RecordRestart(rt->id, rt->restarts, restart));
    return;
  }
  // A node or its agent is gone: this allocation cannot serve the restart.
  const auto old = slurm_->Get(rt->id, rt->allocation_attempt);
  if (old.has_value() && !old->id.empty()) ReleaseAgents(rt->id, old->id, "restarting elsewhere", out);
  slurm_->Cancel(rt->id, rt->allocation_attempt);
  rt->restart_pending = restart;
  (void)store_->SetRestarts(rt->id, rt->restarts);
  Event(rt, v1::PENDING, "info",
        absl::StrCat(why, "; Slurm job ", old.has_value() ? old->id : "?",
                     " is cancelled and restart ", rt->restarts, " of ",
                     rt->spec.train().max_restarts(), " asks for a new allocation"),
        true);
  RequestAllocation(rt);
}

void Scheduler::ReleaseAgents(const std::string& job, const std::string& allocation_id,
                              const std::string& reason, Outbox* out) {
  for (const auto& [name, n] : nodes_.nodes()) {
    if (!n.conn || n.bound_job != job) continue;
    if (!allocation_id.empty() && n.allocation_id != allocation_id) continue;
    v1::CoordinatorCommand c;
    c.mutable_release()->set_reason(reason);
    out->emplace_back(n.conn, c);
  }
}

void Scheduler::ReleaseAllocation(JobRt* rt, const std::string& reason) {
  const bool agents = !nodes_.BoundNodes(rt->id).empty();
  ReleaseAgents(rt->id, "", reason, &deferred_);
  slurm_->Release(rt->id, agents ? opt_.release_delay_s : 0);
}

void Scheduler::CheckpointRequested(const std::string& node, const v1::CheckpointRequest& request) {
  absl::MutexLock l(&mu_);
  JobRt* rt = FindJob(request.job_id());
  if (rt == nullptr || rt->state != v1::RUNNING || rt->stop.action != StopAction::kNone) return;
  const int64_t at = CheckpointStepAhead(*rt);
  if (rt->checkpoint_at >= at) return;
  rt->checkpoint_at = at;
  Event(rt, rt->state, "info",
        absl::StrCat("checkpoint asked for at step ", at, ": ", request.reason(), " (node ", node,
                     ")"),
        false);
}

}  // namespace dgca
