// Scheduler: what node agents report (coordinator/scheduler.h,
// AgentService): registrations (with the ranks they still run), heartbeats,
// rank exits, disconnects.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/rank_calls.h"
#include "coordinator/scheduler.h"
#include "coordinator/hang_check.h"
#include "spdlog/spdlog.h"

namespace dgca {

absl::Status Scheduler::AgentRegistered(const v1::RegisterAgent& reg, const std::string& peer,
                                        std::shared_ptr<AgentConnection> conn) {
  if (reg.node().empty() || reg.node().size() > 256) {
    return absl::InvalidArgumentError("RegisterAgent.node must be 1-256 characters");
  }
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
    if (!reg.bound_job().empty()) {
      // An agent a cluster scheduler started for one job: welcome only while
      // that job is active here; otherwise it is told to go, which ends its
      // allocation (a job cancelled while its allocation was starting).
      const JobRt* job = FindJob(reg.bound_job());
      if (job == nullptr || !UsesSlurm(job->spec)) {
        v1::CoordinatorCommand c;
        c.mutable_release()->set_reason(
            absl::StrCat("job ", reg.bound_job(), " is not active on this coordinator"));
        out.emplace_back(conn, c);
        spdlog::warn("node {} registered for job {}, which is not active; releasing it",
                     reg.node(), reg.bound_job());
      }
    }
    nodes_.Register(reg, peer, conn, Now());
    // Job -> the attempts of its ranks to stop there (only those: a new
    // attempt the tick launches on this node before the stop is sent must
    // not be stopped with them).
    // Those of a job being stopped too: the stop sent before may have been
    // lost with the old stream.
    std::map<std::string, std::set<int>> stop_jobs = UnwantedRanks(reg.running());
    for (const auto& r : reg.running()) {
      const JobRt* rt = FindJob(r.job_id());
      if (rt != nullptr && rt->stop.action != StopAction::kNone) {
        stop_jobs[r.job_id()].insert(r.attempt());
      }
    }
    // Ranks of running jobs placed here that the agent did not list: it
    // restarted while they trained on (a killed or crashed agent). It
    // supervises them again, or reports how they ended (AdoptRanks).
    v1::CoordinatorCommand adopt;
    for (const auto& entry : jobs_) {
      const std::string& id = entry.first;
      const JobRt* rt = entry.second.get();
      if (rt->state != v1::RUNNING || rt->stop.action != StopAction::kNone || TrialRunning(*rt)) {
        continue;
      }
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
    for (const v1::RunningRank& r : nodes_.TakeOrphans(reg.node())) {
      *adopt.mutable_adopt()->add_ranks() = r;
      stop_jobs[r.job_id()].insert(r.attempt());
    }
    if (adopt.adopt().ranks_size() > 0) {
      out.emplace_back(conn, adopt);
      spdlog::warn("node {} registered without {} rank(s) placed there; asking it to adopt them",
                   reg.node(), adopt.adopt().ranks_size());
    }
    for (const auto& [j, attempts] : stop_jobs) {
      QueueStopOn(j, {reg.node()}, &out, attempts);  // the node's stream is this one now
      spdlog::warn("node {} still runs ranks of job {}, which is not running here or is being "
                   "stopped; stopping them", reg.node(), j);
    }
    Wake();
  }
  spdlog::info("node {} registered from {}", reg.node(), peer);
  RecordRunning(reg.node(), {reg.running().begin(), reg.running().end()});
  Flush(&out);
  return absl::OkStatus();
}

void Scheduler::AgentHeartbeat(const std::string& node, const v1::AgentHeartbeat& hb) {
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    if (nodes_.Heartbeat(node, Now())) {
      spdlog::info("node {} is heard again; ranks may be placed on it", node);
      Wake();
    }
    // Ranks the agent runs that no active attempt owns: launched from
    // commands it read late (a frozen agent resumed with SIGCONT, a stream
    // that delivered after a long stall) or missed stops. Stopped here, by
    // attempt, as at registration.
    for (const auto& [job, attempts] : UnwantedRanks(hb.running())) {
      QueueStopOn(job, {node}, &out, attempts);
      spdlog::warn("node {} runs ranks of job {} (attempt(s) {}) that no active attempt owns; "
                   "stopping them",
                   node, job, absl::StrJoin(attempts, ","));
    }
  }
  Flush(&out);
  RecordRunning(node, {hb.running().begin(), hb.running().end()});
}

std::map<std::string, std::set<int>> Scheduler::UnwantedRanks(
    const google::protobuf::RepeatedPtrField<v1::RunningRank>& running) {
  std::map<std::string, std::set<int>> out;
  for (const auto& r : running) {
    const JobRt* rt = FindJob(r.job_id());
    if (rt == nullptr || rt->attempt != r.attempt() || !RanksWelcome(*rt)) {
      out[r.job_id()].insert(r.attempt());
    }
  }
  return out;
}

void Scheduler::RecordRunning(const std::string& node,
                              const std::vector<v1::RunningRank>& running) {
  absl::MutexLock l(&mu_);
  for (const auto& r : running) {
    JobRt* rt = FindJob(r.job_id());
    if (rt == nullptr) continue;
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
    absl::MutexLock l(&mu_);
    if (shutting_down_) return;
    JobRt* rt = FindJob(e.job_id());
    if (rt == nullptr) return;
    if (!RanksWelcome(*rt) || e.attempt() != rt->attempt || e.rank() < 0 ||
        e.rank() >= static_cast<int>(rt->ranks.size())) {
      return;
    }
    RankRt& rr = rt->ranks[e.rank()];
    if (rr.exited) return;
    if (rr.node != node) {
      // Only the agent of the rank's own node speaks for it: an agent token
      // does not end other nodes' ranks.
      spdlog::warn("job {}: agent {} reported the exit of rank {}, which runs on node {}; ignored",
                   rt->id, node, e.rank(), rr.node);
      return;
    }
    rr.exited = true;
    const bool clean = e.exit_code() == 0 && e.signal() == 0 && !e.status_unknown();
    rr.progress.set_exit_code(e.exit_code());
    rr.progress.set_signal(e.signal());
    // A rank that ended because this coordinator stopped it did not fail:
    // "cancelled" after `dgca cancel`, "stopped" for a restart or re-plan.
    const bool stopped_by_us = rt->stop.action != StopAction::kNone && !clean &&
                               EndedByOurStop(e, rt->stop.started, Now(), opt_.stop_grace_s);
    rr.progress.set_state(clean           ? "exited"
                          : !stopped_by_us ? "failed"
                          : rt->stop.action == StopAction::kCancel ? "cancelled"
                                                                    : "stopped");
    const std::string how = DescribeRankExit(node, e);
    // `how` and the agent's last lines of the rank's log.
    auto with_output = [&](size_t limit) {
      return e.message().empty() ? how
                                 : absl::StrCat(how, "; last output:\n", e.message().substr(0, limit));
    };
    if (TrialRunning(*rt)) {
      // A trial's rank: its end is the trial's business (RunTrial).
      if (!clean && rt->trials->failure.empty()) rt->trials->failure = with_output(2000);
      trial_cv_.SignalAll();
      return;
    }
    // The job's exit should it fail (Job.exit): the first rank of the
    // attempt that failed on its own, not by our stop.
    if (!clean && !stopped_by_us && !rt->rank_failure.has_value()) {
      v1::JobExit x;
      x.set_rank(e.rank());
      x.set_code(e.exit_code());
      x.set_signal(e.signal());
      x.set_status_unknown(e.status_unknown());
      rt->rank_failure = x;
    }
    // Stored at once, before what it leads to: a coordinator restarted from
    // here on neither waits for this rank again nor reports its end twice.
    Persist(rt);
    if (rt->stop.action != StopAction::kNone) {
      const bool ours = EndedByOurStop(e, rt->stop.started, Now(), opt_.stop_grace_s);
      // A rank its agent did not start for missing files is no other
      // failure: the job's message already lists the files.
      if (!clean && !ours && !e.inputs_missing() && rt->stop.action != StopAction::kCancel &&
          rt->stop.other_failures.size() < 16) {
        rt->stop.other_failures.push_back(how);
      }
      Wake();
    } else if (e.inputs_missing()) {
      // The agent did not start the rank: files it would read are missing
      // on its node. Its message, every file with its place in the spec, is
      // the job's failure, said once: no rank_exit event repeating it ahead
      // of the state event, and no restart, which would find the same files
      // missing.
      BeginStop(rt, StopAction::kFail, absl::StrCat("cannot start the ranks: ", e.message()),
                &out);
    } else if (LostCoordinator(rr, e)) {
      // The ranks outlived their outage limit while this coordinator was
      // away (or cut off): they trained, the job did not fail. Resumed from
      // the last checkpoint, whatever max_restarts says.
      Event(rt, rt->state, "rank_exit", with_output(4000), false);
      BeginStop(rt, StopAction::kResume,
                absl::StrCat(how, " after losing the coordinator for longer than its outage "
                                  "limit (dgca-coordinator --rank-outage-limit, ",
                             opt_.rank_outage_limit_s, " s)"),
                &out);
    } else if (!clean) {
      // A rank that failed while another is stuck (its collective timed
      // out waiting for it): that one is named too (hang_check.h).
      const std::string hang = HangContextOf(*rt, Now());
      RankFailed(rt,
                 e.message().empty()
                     ? how + hang
                     : absl::StrCat(how, hang, "; last output:\n", e.message().substr(0, 4000)),
                 &out);
    } else if (AllRanksExited(*rt)) {
      Finish(rt, v1::SUCCEEDED, absl::StrCat("all ", rt->ranks.size(), " ranks exited 0"));
    }
  }
  Flush(&out);
}

void Scheduler::AgentLeaving(const std::string& node,
                             const std::shared_ptr<AgentConnection>& conn,
                             const v1::AgentLeaving& leaving) {
  absl::MutexLock l(&mu_);
  if (!nodes_.MarkLeaving(node, conn)) return;
  spdlog::warn("node {} is leaving: {}", node, leaving.reason().substr(0, 200));
}

void Scheduler::AgentDisconnected(const std::string& node,
                                  const std::shared_ptr<AgentConnection>& conn) {
  conn->Close();
  absl::MutexLock l(&mu_);
  if (!nodes_.Disconnect(node, conn)) return;
  const Node* n = nodes_.Find(node);
  if (n != nullptr && !n->bound_job.empty() && FindJob(n->bound_job) == nullptr) {
    // A released agent of a finished job: its allocation is over.
    spdlog::info("node {} (bound to job {}) left", node, n->bound_job);
    nodes_.Erase(node);
    hub_->RemoveNode(node);
    return;
  }
  spdlog::warn("node {} disconnected", node);
}

}  // namespace dgca
