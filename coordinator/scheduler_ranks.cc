// Scheduler: what ranks call (coordinator/scheduler.h, RankService):
// assignments, heartbeats and the metric stream.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/rank_calls.h"
#include "coordinator/scheduler.h"

namespace dgca {

absl::StatusOr<v1::GetAssignmentResponse> Scheduler::GetAssignment(
    const v1::GetAssignmentRequest& req) {
  absl::MutexLock l(&mu_);
  JobRt* rt = FindJob(req.job_id());
  if (rt == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", req.job_id(), " is not running (unknown or finished)"));
  }
  auto resp = AssignRank(rt, req, Now(), CheckpointDir(rt->id));
  if (resp.ok()) resp->set_coordinator_outage_limit_seconds(opt_.rank_outage_limit_s);
  return resp;
}

v1::RankHeartbeatResponse Scheduler::RankHeartbeat(const v1::RankHeartbeatRequest& req) {
  absl::MutexLock l(&mu_);
  JobRt* rt = FindJob(req.job_id());
  if (rt == nullptr) {
    v1::RankHeartbeatResponse resp;
    resp.set_stop(true);
    resp.set_reason(absl::StrCat("job ", req.job_id(), " is not running"));
    return resp;
  }
  return HeartbeatRank(rt, req, Now());
}

std::string Scheduler::IngestSample(const v1::MetricSample& s, const std::string& job_hint) {
  absl::MutexLock l(&mu_);
  std::string job = job_hint;
  if (s.has_step()) job = s.step().job_id();
  if (s.has_eval()) job = s.eval().job_id();
  if (s.has_probe_row()) job = s.probe_row().job_id();
  if (s.has_finished()) job = s.finished().job_id();
  JobRt* rt = FindJob(job);
  if (rt == nullptr) return job;
  if (s.has_step()) {
    const v1::StepMetrics& m = s.step();
    const StepApplied applied = ApplyStep(rt, m, Now());
    if (applied.use == StepUse::kIgnored) return job;
    if (applied.use == StepUse::kTrial) {
      trial_cv_.SignalAll();
    } else {
      if (applied.live_check_due) LiveCheck(rt);
      const RankRt& rr = rt->ranks[m.rank()];
      hub_->IngestStep(m, rr.node, rr.local_device);
    }
  } else if (s.has_probe_row()) {
    // dgca diagnose comm: rank 0's rows are the measurement (every rank
    // timed the same collectives; rank 0 speaks for the job, as nccl-tests).
    const v1::CommProbeRow& row = s.probe_row();
    if (row.rank() < 0 || row.rank() >= static_cast<int>(rt->ranks.size())) return job;
    rt->ranks[row.rank()].last_progress = Now();
    if (row.rank() == 0) {
      absl::Status st = store_->AddCommProbeRow(MeasurementNodeSet(*rt), row.backend(),
                                                static_cast<int32_t>(rt->ranks.size()), row);
      if (!st.ok()) {
        Event(rt, rt->state, "info",
              absl::StrCat("cannot store a comm measurement: ", st.message()), false);
      } else {
        Event(rt, rt->state, "probe",
              absl::StrFormat("%d bytes: %.1f us, algbw %.3f GB/s, busbw %.3f GB/s", row.bytes(),
                              row.seconds_per_op() * 1e6, row.algbw_bytes_per_second() / 1e9,
                              row.busbw_bytes_per_second() / 1e9),
              false);
      }
    }
  } else if (s.has_finished()) {
    // The job's final loss: every rank sends the same all-reduced figure;
    // the first of the current attempt's is kept.
    const v1::TrainFinished& f = s.finished();
    if (f.attempt() == rt->attempt && f.rank() >= 0 &&
        f.rank() < static_cast<int>(rt->ranks.size()) && f.final_loss_steps() > 0 &&
        !TrialRunning(*rt) && !rt->final_loss.has_value()) {
      rt->final_loss = f.final_loss();
      rt->final_loss_steps = f.final_loss_steps();
      rt->final_loss_ranks = f.final_loss_ranks();
      Persist(rt);
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
  v1::WatchJobResponse u;
  *u.mutable_sample() = s;
  watch_.Publish(job, u);
  return job;
}

}  // namespace dgca
