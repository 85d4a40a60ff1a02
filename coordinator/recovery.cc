#include "coordinator/recovery.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/rpc/rpc_util.h"
#include "spec/spec_files.h"
#include "proto/rpc/rank_state.h"

namespace dgca {

std::optional<InterruptedStop> InterruptedStopOf(const std::vector<v1::JobEvent>& events) {
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
    // A re-plan cut short is carried on as a restart with the stored plan;
    // a resume (ranks that lost this coordinator) as a resume.
    stop.action = absl::EndsWith(m, "(resume)") ? StopAction::kResume
                  : absl::EndsWith(m, "(restart)") || absl::EndsWith(m, "(re-plan)")
                      ? StopAction::kRestart
                      : StopAction::kFail;
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

bool KillOrphan(const StoredRank& r) {
  if (r.pid <= 1) return false;
  std::string cmdline = ReadFileAtMost(absl::StrCat("/proc/", r.pid, "/cmdline"), 1 << 20).data;
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  if (cmdline.find(r.job_id) == std::string::npos) return false;
  if (r.pgid > 1 && getpgid(r.pid) == r.pgid) {
    kill(-r.pgid, SIGKILL);
  } else {
    kill(r.pid, SIGKILL);
  }
  return true;
}

void KillOrphans(JobStore* store, const std::string& job_id, const std::vector<StoredRank>& ranks,
                 const std::string& what) {
  for (const StoredRank& r : ranks) {
    if (KillOrphan(r)) {
      (void)store->AppendEvent(job_id, "info",
                               absl::StrCat("killed orphaned ", what, " ", r.rank, " (pid ", r.pid,
                                            ", attempt ", r.attempt, ")"));
    }
  }
  (void)store->ClearRanks(job_id);
}

namespace {

// Why a RUNNING job's ranks cannot be re-adopted ("" when they can).
std::string CannotReadopt(const absl::StatusOr<std::vector<StoredRank>>& ranks,
                          const StoredJob& stored) {
  if (!ranks.ok()) return absl::StrCat("cannot read its ranks: ", ranks.status().message());
  if (!stored.has_plan || stored.plan.ranks() <= 0) return "no plan stored";
  if (static_cast<int>(ranks->size()) != stored.plan.ranks()) {
    return absl::StrCat(ranks->size(), " of ", stored.plan.ranks(), " ranks recorded");
  }
  std::string why;
  for (size_t i = 0; i < ranks->size(); ++i) {
    if ((*ranks)[i].rank != static_cast<int>(i)) why = "its recorded ranks are not 0..N-1";
    if ((*ranks)[i].attempt != (*ranks)[0].attempt) why = "its ranks are of different attempts";
  }
  return why;
}

std::unique_ptr<JobRt> RuntimeOf(const v1::Job& j) {
  auto rt = std::make_unique<JobRt>();
  rt->id = j.id();
  rt->spec = j.spec();
  // Located again from the stored text, for the agents' launch check.
  rt->inputs = SpecInputFiles(j.spec_yaml(), j.spec());
  rt->state = j.state();
  rt->message = j.message();
  rt->restarts = j.restarts();
  for (const auto& [k, v] : j.eval()) rt->eval[k] = v;
  rt->loss_curve.Restore(j.loss_curve());
  if (j.has_final_loss()) {
    rt->final_loss = j.final_loss();
    rt->final_loss_steps = j.final_loss_steps();
    rt->final_loss_ranks = j.final_loss_ranks();
  }
  rt->peak_memory_bytes = j.peak_memory_bytes();
  // A rank failure stored before the coordinator stopped: the first
  // failed rank (its order among several is not stored).
  for (const v1::RankProgress& p : j.ranks()) {
    if (p.state() != "failed") continue;
    v1::JobExit x;
    x.set_rank(p.rank());
    x.set_code(p.exit_code());
    x.set_signal(p.signal());
    rt->rank_failure = x;
    break;
  }
  return rt;
}

}  // namespace

absl::StatusOr<std::vector<RecoveredJob>> RecoverJobs(JobStore* store, Clock::TimePoint now) {
  auto active = store->ListJobs({v1::PENDING, v1::PLANNING, v1::RUNNING}, 0);
  if (!active.ok()) return active.status();
  std::vector<v1::Job> listed(active->begin(), active->end());
  std::sort(listed.begin(), listed.end(),
            [](const v1::Job& a, const v1::Job& b) { return a.id() < b.id(); });  // submission order
  std::vector<RecoveredJob> out;
  for (const v1::Job& entry : listed) {
    auto stored = store->GetJob(entry.id());
    if (!stored.ok()) return stored.status();
    const v1::Job& j = stored->job;
    RecoveredJob r;
    r.stored_state = j.state();
    if (j.state() != v1::RUNNING) {
      // Nothing of the job itself was launched yet: queued again, planned
      // afresh against the nodes that connect now. A tuning trial's ranks
      // (PLANNING) are killed; the trials start over.
      r.kind = RecoveredJob::kRequeue;
      r.rt = RuntimeOf(j);
      auto trial_ranks = store->ListRanks(j.id());
      if (trial_ranks.ok()) {
        KillOrphans(store, j.id(), *trial_ranks, "trial rank");
        // Later attempts stay distinct from the killed trial's, also after
        // another restart: its attempts stay recorded, without pids.
        for (const StoredRank& sr : *trial_ranks) {
          r.rt->attempt = std::max(r.rt->attempt, sr.attempt + 1);
          (void)store->RecordRank({j.id(), sr.rank, sr.attempt, sr.node, 0, 0});
        }
      }
      out.push_back(std::move(r));
      continue;
    }
    // RUNNING: its ranks are re-adopted when the store knows them all.
    auto ranks = store->ListRanks(j.id());
    const std::string why = CannotReadopt(ranks, *stored);
    if (!why.empty()) {
      if (ranks.ok()) KillOrphans(store, j.id(), *ranks, "rank");
      r.kind = RecoveredJob::kFail;
      r.fail_reason = why;
      r.fail_message = absl::StrCat("coordinator restarted; cannot re-adopt: ", why);
      auto ev = store->SetState(j.id(), v1::FAILED, r.fail_message);
      if (!ev.ok()) return ev.status();
      r.stored = j;
      r.stored.set_state(v1::FAILED);
      r.stored.set_message(r.fail_message);
      out.push_back(std::move(r));
      continue;
    }
    r.kind = RecoveredJob::kReadopt;
    r.rt = RuntimeOf(j);
    JobRt* rt = r.rt.get();
    rt->plan = stored->plan;
    rt->planned = true;
    rt->attempt = (*ranks)[0].attempt;
    rt->launched = now;
    rt->last_persist = now;
    rt->ranks.resize(ranks->size());
    for (const StoredRank& sr : *ranks) {
      RankRt& rr = rt->ranks[sr.rank];
      rr.node = sr.node;
      rr.local_device = PlannedDevice(rt->plan, sr.rank);
      if (sr.rank < j.ranks_size()) rr.progress = j.ranks(sr.rank);
      rr.progress.set_rank(sr.rank);
      rr.progress.set_node(sr.node);
      rr.progress.set_pid(sr.pid);
      if (rr.progress.total_steps() == 0) rr.progress.set_total_steps(rt->spec.train().steps());
      // Exits are stored at once (RankExited); any other rank is confirmed
      // by its next heartbeat or step, or reported by its agent.
      rr.exited = RankStateEnded(rr.progress.state());
      rr.last_progress = now;
      if (rr.exited) continue;
      rr.progress.set_state("recovering");
      r.adopted.push_back(sr);
    }
    auto events = store->ListEvents(rt->id, 0);
    r.stop = events.ok() ? InterruptedStopOf(*events) : std::nullopt;
    if (!r.stop.has_value()) {
      for (const RankRt& rr : rt->ranks) {
        if (rr.progress.state() != "failed") continue;
        // Its failure was stored, the stop it led to was not.
        r.stop = InterruptedStop{
            rt->restarts < rt->spec.train().max_restarts() ? StopAction::kRestart
                                                           : StopAction::kFail,
            absl::StrCat("rank ", rr.progress.rank(), " on node ", rr.node, " failed (exit code ",
                         rr.progress.exit_code(), ") just before the coordinator restarted")};
        break;
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace dgca
