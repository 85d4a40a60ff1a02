#include "coordinator/rank_calls.h"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "coordinator/plan_checks.h"
#include "coordinator/tuning_trials.h"
#include "model/core/exit_codes.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace {

std::string SignalName(int sig) {
  const char* d = strsignal(sig);
  return absl::StrCat(sig, d ? absl::StrCat(" (", d, ")") : "");
}

}  // namespace

std::string ResumePointOf(const std::string& dir) {
  // `latest` is one short line (model/train/checkpoint.h); more is not one.
  const BoundedRead r = ReadFileAtMost(dir + "/latest", 4096);
  if (r.kind != BoundedRead::kOk) return "";
  const std::string latest(absl::StripAsciiWhitespace(r.data));
  // A step directory's name (step-NNNNNNNN): no '/', '..' or NUL reaches
  // the path the ranks resume from; anything else the trainer refuses itself.
  const bool name_ok = !latest.empty() && latest != "." && latest != ".." &&
                       std::all_of(latest.begin(), latest.end(), [](char c) {
                         return std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                                c == '_' || c == '.';
                       });
  struct stat st;
  if (name_ok && stat((dir + "/" + latest).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return dir + "/" + latest;
  }
  return "";
}

absl::StatusOr<v1::GetAssignmentResponse> AssignRank(JobRt* rt,
                                                     const v1::GetAssignmentRequest& req,
                                                     Clock::TimePoint now,
                                                     const std::string& checkpoint_dir) {
  const bool stopping = rt->stop.action != StopAction::kNone;
  if (!RanksWelcome(*rt) || stopping) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", rt->id, " is ", v1::JobState_Name(rt->state), stopping ? " and stopping" : ""));
  }
  if (req.attempt() != rt->attempt) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attempt ", req.attempt(), " is stale; the job is at attempt ", rt->attempt));
  }
  if (req.rank() < 0 || req.rank() >= static_cast<int>(rt->ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", req.rank(), " is outside 0..", rt->ranks.size() - 1));
  }
  v1::GetAssignmentResponse resp;
  resp.set_rank(req.rank());
  resp.set_world_size(static_cast<int>(rt->ranks.size()));
  resp.set_attempt(rt->attempt);
  RankRt& rr = rt->ranks[req.rank()];
  rr.last_progress = now;
  if (TrialRunning(*rt)) {
    // A tuning trial: the candidate plan, a few steps, no checkpoints.
    *resp.mutable_spec() = TrialSpec(rt->spec);
    *resp.mutable_plan() = rt->trials->plan;
    rr.progress.set_state("trial");
    return resp;
  }
  *resp.mutable_spec() = rt->spec;
  *resp.mutable_plan() = rt->plan;
  resp.set_checkpoint_dir(checkpoint_dir);
  const std::string resume = ResumePointOf(checkpoint_dir);
  if (!resume.empty()) resp.set_resume_from(resume);
  rr.progress.set_state("running");
  return resp;
}

v1::RankHeartbeatResponse HeartbeatRank(JobRt* rt, const v1::RankHeartbeatRequest& req,
                                        Clock::TimePoint now) {
  v1::RankHeartbeatResponse resp;
  const bool stopping = rt->stop.action != StopAction::kNone;
  if (!RanksWelcome(*rt) || stopping) {
    resp.set_stop(true);
    resp.set_reason(stopping ? rt->stop.message : rt->message);
    return resp;
  }
  if (req.attempt() != rt->attempt) {
    resp.set_stop(true);
    resp.set_reason(absl::StrCat("attempt ", req.attempt(), " is stale (now ", rt->attempt, ")"));
    return resp;
  }
  if (rt->checkpoint_at > 0) resp.set_checkpoint_at_step(rt->checkpoint_at);
  if (req.rank() >= 0 && req.rank() < static_cast<int>(rt->ranks.size())) {
    RankRt& rr = rt->ranks[req.rank()];
    rr.last_progress = now;
    if (req.step() > rr.progress.step()) rr.progress.set_step(req.step());
    if (req.has_phase()) {
      rr.phase = req.phase();
      rr.phase_at = now;
    }
    if (req.heartbeat_interval_seconds() > 0) rr.heartbeat_interval_s = req.heartbeat_interval_seconds();
    if (rr.progress.state() == "starting" || rr.progress.state() == "recovering") {
      rr.progress.set_state("running");
    }
  }
  return resp;
}

StepApplied ApplyStep(JobRt* rt, const v1::StepMetrics& m, Clock::TimePoint now) {
  StepApplied out;
  if (m.rank() < 0 || m.rank() >= static_cast<int>(rt->ranks.size())) return out;
  if (m.attempt() != rt->attempt) return out;  // late, of an earlier attempt or trial
  RankRt& rr = rt->ranks[m.rank()];
  rr.last_progress = now;
  rr.last_step_at = now;
  v1::RankProgress& p = rr.progress;
  const bool trial = TrialRunning(*rt);
  // A killed rank's last samples can arrive after its exit: it stays
  // ended (RankStateEnded).
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
    out.use = StepUse::kTrial;
    return out;
  }
  out.use = StepUse::kJob;
  rt->peak_memory_bytes = std::max(rt->peak_memory_bytes, RankMemoryOf(m, rr.local_device));
  // The plan check skips each rank's first two steps of an attempt
  // (allocation, first-touch, loader warm-up).
  if (++rr.step_samples > 2 && m.step_seconds() > 0) {
    rt->steps.Add(SampleOf(m), m.step_seconds(), m.attention_kernels());
    out.live_check_due = !rt->live_checked && rt->planned && rt->spec.kind() != "comm_probe" &&
                         LiveCheckDue(rt->steps.samples.size(), rt->steps.seconds_seen,
                                      static_cast<int>(rt->ranks.size()));
  }
  rt->loss_curve.Add(m.step(), m.rank(), m.loss(), static_cast<int>(rt->ranks.size()));
  return out;
}

namespace {

// How the rank ended, in words.
std::string RankEnd(const std::string& node, const v1::RankExited& e) {
  if (e.status_unknown()) {
    return absl::StrCat("rank ", e.rank(), " on node ", node,
                        " (adopted after a restart of its agent or the coordinator) ended "
                        "without an exit status (killed by a signal or crashed)");
  }
  if (e.signal() != 0) {
    return absl::StrCat("rank ", e.rank(), " on node ", node, " was killed by signal ",
                        SignalName(e.signal()));
  }
  if (e.exit_code() == kExitStopped) {
    return absl::StrCat("rank ", e.rank(), " on node ", node,
                        " was stopped (exit code 5: SIGTERM or SIGINT not from this "
                        "coordinator, e.g. its agent stopping)");
  }
  return absl::StrCat("rank ", e.rank(), " on node ", node, " exited with code ", e.exit_code());
}

}  // namespace

std::string DescribeRankExit(const std::string& node, const v1::RankExited& e) {
  const std::string how = RankEnd(node, e);
  return e.agent_leaving() ? absl::StrCat(how, " while its agent was stopping") : how;
}

bool LostCoordinator(const RankRt& rr, const v1::RankExited& e) {
  return e.signal() == 0 && !e.status_unknown() && e.exit_code() == kExitUnreachable &&
         rr.progress.step() > 0;
}

bool EndedByOurStop(const v1::RankExited& e, Clock::TimePoint stop_started, Clock::TimePoint now,
                    double stop_grace_s) {
  // SIGTERM, or SIGKILL after the grace, is our own StopRanks at work (an
  // adopted rank's unknown end is taken for SIGKILL: a rank stopped by
  // SIGTERM writes its exit record). A rank that took our stop and left its
  // loop exits kExitStopped.
  return e.signal() == SIGTERM || (e.signal() == 0 && e.exit_code() == kExitStopped) ||
         ((e.signal() == SIGKILL || e.status_unknown()) &&
          SecondsBetween(stop_started, now) > stop_grace_s * 0.9);
}

}  // namespace dgca
