// Scheduler: tuning.mode trial (coordinator/scheduler.h,
// coordinator/tuning_trials.h). The job is planned on a thread of its own
// whose planner times its candidates as short attempts of the job on its
// ranks; the job stays PLANNING meanwhile and its attempt counts the
// trials; cancel stops a trial's ranks.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "coordinator/measured_planning.h"
#include "coordinator/plan_checks.h"
#include "coordinator/scheduler.h"
#include "coordinator/tuning_trials.h"
#include "planner/plan_format.h"
#include "spdlog/spdlog.h"

namespace dgca {

class Scheduler::JobTrialRunner : public TrialRunner {
 public:
  JobTrialRunner(Scheduler* s, std::string id, std::shared_ptr<TrialState> st)
      : s_(s), id_(std::move(id)), st_(std::move(st)) {}
  absl::StatusOr<double> TimeStep(const v1::Plan& candidate, double budget_s) override {
    return s_->RunTrial(id_, st_, candidate, budget_s);
  }

 private:
  Scheduler* s_;
  std::string id_;
  std::shared_ptr<TrialState> st_;
};

void Scheduler::StartTrials(JobRt* rt, const std::vector<v1::Topology>& topo,
                            const std::vector<RankSlot>& placement) {
  rt->trials = std::make_shared<TrialState>();
  for (const RankSlot& r : placement) rt->trials->placement.emplace_back(r.node, r.local_device);
  const double budget = rt->spec.tuning().budget_s() > 0 ? rt->spec.tuning().budget_s() : 120;
  rt->trials->wall_deadline = Now() + Seconds(budget);
  Event(rt, v1::PLANNING, "info",
        absl::StrFormat("tuning.mode trial: timing the planner's best candidates as %d-step runs "
                        "on the job's ranks (budget %g s)",
                        kTrialWarmupSteps + kTrialTimedSteps, budget),
        true);
  std::shared_ptr<TrialState> st = rt->trials;
  trial_threads_.emplace_back(st, std::thread([this, id = rt->id, spec = rt->spec, topo, st] {
                                TrialPlanning(id, spec, topo, st);
                              }));
}

void Scheduler::TrialPlanning(std::string id, v1::JobSpec spec, std::vector<v1::Topology> topo,
                              std::shared_ptr<TrialState> st) {
  JobTrialRunner runner(this, id, st);
  absl::StatusOr<v1::Plan> plan;
  try {
    plan = PlanMeasured(store_.get(), spec, topo, &runner, "", nullptr, BaseMeasurements());
  } catch (const std::exception& e) {
    plan = absl::InternalError(absl::StrCat("planner threw: ", e.what()));
  }
  absl::MutexLock l(&mu_);
  st->done = true;
  JobRt* rt = FindJob(id);
  if (rt == nullptr || st->cancelled) return;  // cancelled or shut down meanwhile
  if (!plan.ok()) {
    Finish(rt, v1::FAILED, absl::StrCat("planning failed: ", plan.status().message()));
  } else if (plan->ranks() <= 0) {
    Finish(rt, v1::FAILED, "planning failed: the plan has no ranks");
  } else {
    rt->plan = *plan;
    rt->planned = true;
    // The kept trial's measured communication share is the prediction when
    // the model had none.
    auto share = st->comm_share.find(CandidateLabel(rt->plan));
    if (rt->plan.predicted_comm_share() <= 0 && rt->plan.predicted_step_seconds() > 0 &&
        share != st->comm_share.end()) {
      rt->plan.set_predicted_comm_share(share->second);
    }
    (void)store_->SetPlan(rt->id, rt->plan);
    Event(rt, v1::PLANNING, "plan", PlanSummary(rt->plan), false);
  }
  Wake();
}

absl::StatusOr<double> Scheduler::RunTrial(const std::string& id,
                                           const std::shared_ptr<TrialState>& st,
                                           const v1::Plan& candidate, double budget_s) {
  const auto start = Now();
  const auto deadline = std::min(st->wall_deadline, start + Seconds(budget_s));
  const std::string label = CandidateLabel(candidate);
  auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> JobRt* {
    JobRt* rt = FindJob(id);
    return rt == nullptr || st->cancelled || shutting_down_ ? nullptr : rt;
  };
  Outbox out;
  int n = 0;
  std::set<std::string> nodes;  // where the trial's ranks were launched
  {
    absl::MutexLock l(&mu_);
    JobRt* rt = find();
    if (rt == nullptr) return absl::CancelledError("the job is no longer planning");
    if (start >= st->wall_deadline) {
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
    absl::MutexLock l(&mu_);
    if (find() == nullptr) QueueStopOn(id, nodes, &out);
  }
  Flush(&out);

  // Until every rank has ended (a trial runs its few steps and exits), one
  // failed or stalled, the budget ran out, or the job went away.
  bool timed_out = false;
  {
    absl::MutexLock l(&mu_);
    while (true) {
      JobRt* rt = find();
      if (rt == nullptr || !st->failure.empty() || AllRanksExited(*rt)) break;
      const auto t = Now();
      if (t >= deadline) {
        timed_out = true;
        break;
      }
      st->failure = StallOf(*rt, t, opt_.heartbeat_timeout_s);
      if (!st->failure.empty()) break;
      trial_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
    }
    JobRt* rt = find();
    if (rt != nullptr && !AllRanksExited(*rt)) QueueStop(*rt, /*live_only=*/true, &out);
  }
  Flush(&out);
  const auto stop_deadline = Now() + Seconds(opt_.stop_grace_s + 5);
  absl::MutexLock l(&mu_);
  while (Now() < stop_deadline) {
    // Shutting down, exits are no longer taken in (RankExited): waiting for
    // them would only hold up Shutdown/Detach until the deadline.
    if (shutting_down_) break;
    JobRt* rt = FindJob(id);
    if (rt == nullptr || AllRanksExited(*rt)) break;
    trial_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
  }
  st->active = false;
  JobRt* rt = FindJob(id);
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
    result = absl::DeadlineExceededError(absl::StrFormat(
        "stopped: tuning.budget_s ran out after %.1f s", SecondsBetween(start, Now())));
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
        result.ok() ? absl::StrFormat("trial %d: %s: %.4f s per step (median of %d timed "
                                      "rank-steps)",
                                      n, label, *result, timed)
                    : absl::StrCat("trial ", n, ": ", label, ": ", result.status().message()),
        true);
  return result;
}

void Scheduler::JoinTrialThreads(bool all) {
  std::vector<std::thread> done;
  {
    absl::MutexLock l(&mu_);
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

}  // namespace dgca
