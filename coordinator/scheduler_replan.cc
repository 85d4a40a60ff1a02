// Scheduler: the live check of a running job and its re-plan
// (coordinator/scheduler.h, coordinator/replan.h). A re-plan whose settings
// differ waits for a checkpoint every rank writes (checkpoint_at), then
// stops the ranks (StopAction::kReplan) and CompleteStop starts the next
// attempt on the new plan, resuming from that checkpoint.
#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/plan_checks.h"
#include "coordinator/rank_calls.h"
#include "coordinator/replan.h"
#include "coordinator/scheduler.h"

namespace dgca {

PlannerMeasurements Scheduler::BaseMeasurements() const {
  PlannerMeasurements m;
  m.link_prior_busbw = opt_.link_prior_busbw;
  return m;
}

int64_t Scheduler::CheckpointStepAhead(const JobRt& rt) const {
  int64_t latest = 0;
  double step_seconds = 0;
  int n = 0;
  for (const RankRt& r : rt.ranks) {
    latest = std::max(latest, r.progress.step());
    if (r.progress.step_seconds() > 0) {
      step_seconds += r.progress.step_seconds();
      ++n;
    }
  }
  step_seconds = n > 0 ? step_seconds / n : 1;
  // Far enough ahead that every rank learns it from a heartbeat (every 2 s)
  // before getting there.
  const int64_t ahead = 2 + static_cast<int64_t>(std::ceil(10.0 / std::max(1e-3, step_seconds)));
  return std::min<int64_t>(latest + ahead, rt.spec.train().steps());
}

bool Scheduler::ReplanCheckpointWritten(const JobRt& rt) const {
  if (!rt.replan.has_value() || rt.checkpoint_at <= 0) return false;
  // The latest checkpoint's directory is step-NNNNNNNN (model/train/
  // checkpoint.h).
  const std::string latest = ResumePointOf(CheckpointDir(rt.id));
  const size_t dash = latest.rfind("step-");
  int64_t step = 0;
  return dash != std::string::npos && absl::SimpleAtoi(latest.substr(dash + 5), &step) &&
         step >= rt.checkpoint_at;
}

void Scheduler::LiveCheck(JobRt* rt) {
  rt->live_checked = true;
  const std::string text = LiveCheckText(rt->id, rt->spec, rt->plan, rt->steps.samples);
  if (!text.empty()) Event(rt, rt->state, "plan", text, false);
  MaybeReplan(rt);
}

void Scheduler::MaybeReplan(JobRt* rt) {
  if (rt->replanned || rt->replan.has_value()) return;
  const std::string reason = ReplanReason(rt->spec, rt->plan, rt->steps.samples);
  if (reason.empty()) return;
  rt->replanned = true;
  const std::vector<v1::Topology> topo = nodes_.ConnectedTopologies();
  if (topo.empty()) return;
  const PlannerMeasurements meas =
      MeasurementsOfJob(rt->spec, rt->plan, topo, rt->steps.samples, BaseMeasurements());
  auto again = Replan(rt->spec, rt->plan, topo, meas);
  if (!again.ok()) {
    Event(rt, rt->state, "plan",
          absl::StrCat("re-plan (", reason, ") failed: ", again.status().message(),
                       "; the job keeps its plan"),
          false);
    return;
  }
  const std::string change = SettingsChange(rt->plan, *again);
  const std::string predicted = absl::StrFormat(
      "now predicted: step %.4f s, exposed communication %.1f%%", again->predicted_step_seconds(),
      100 * again->predicted_comm_share());
  if (change.empty()) {
    // Same settings: the job runs on; its plan's predictions are the new
    // ones (what its review at the end checks).
    rt->plan = *again;
    (void)store_->SetPlan(rt->id, rt->plan);
    Event(rt, rt->state, "plan",
          absl::StrCat("re-planned from this job's measurements (", reason,
                       "): the same settings; ", predicted),
          false);
    return;
  }
  if (UsesSlurm(rt->spec)) {
    Event(rt, rt->state, "plan",
          absl::StrCat("re-plan (", reason, ") would change ", change,
                       "; not applied to a Slurm job (a new attempt takes a new allocation)"),
          false);
    return;
  }
  const int64_t at = CheckpointStepAhead(*rt);
  if (at >= rt->spec.train().steps()) {
    Event(rt, rt->state, "plan",
          absl::StrCat("re-plan (", reason, ") would change ", change,
                       "; not applied: the job ends before its ranks could all checkpoint and "
                       "move (step ",
                       at, " of ", rt->spec.train().steps(), ")"),
          false);
    return;
  }
  rt->replan = *again;
  rt->checkpoint_at = std::max(rt->checkpoint_at, at);
  Event(rt, rt->state, "plan",
        absl::StrFormat("re-plan from this job's measurements (%s): %s at the checkpoint after "
                        "step %d (%s; global batch and learning rate unchanged)",
                        reason, change, rt->checkpoint_at, predicted),
        false);
}

}  // namespace dgca
