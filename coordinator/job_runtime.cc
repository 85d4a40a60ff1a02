#include "coordinator/job_runtime.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/hang_check.h"

namespace dgca {

const char* StopActionName(StopAction a) {
  switch (a) {
    case StopAction::kCancel:
      return "cancel";
    case StopAction::kRestart:
      return "restart";
    case StopAction::kReplan:
      return "re-plan";
    case StopAction::kResume:
      return "resume";
    default:
      return "failure";
  }
}

void StepStats::Add(const StepSample& s, double step_seconds, const std::string& kernels) {
  if (samples.size() < kMaxStepSamples) {
    samples.push_back(s);
  } else {
    samples[seen % kMaxStepSamples] = s;
  }
  ++seen;
  seconds_seen += step_seconds;
  if (!kernels.empty()) {
    if (!attention_kernels.empty() && attention_kernels != kernels) attention_mixed = true;
    attention_kernels = kernels;
  }
}

int PlannedDevice(const v1::Plan& plan, int r) {
  if (plan.device() != "cuda" || r >= plan.rank_local_devices_size()) return -1;
  return plan.rank_local_devices(r);
}

v1::RunningRank RunningRankOf(const JobRt& rt, int rank) {
  v1::RunningRank out;
  out.set_job_id(rt.id);
  out.set_rank(rank);
  out.set_attempt(rt.attempt);
  out.set_pid(rt.ranks[rank].progress.pid());
  return out;
}

bool TrialRunning(const JobRt& rt) { return rt.trials && rt.trials->active; }

bool RanksWelcome(const JobRt& rt) { return rt.state == v1::RUNNING || TrialRunning(rt); }

bool AllRanksExited(const JobRt& rt) {
  return std::all_of(rt.ranks.begin(), rt.ranks.end(), [](const RankRt& r) { return r.exited; });
}

std::string NodeSetKey(const JobRt& rt) {
  std::set<std::string> nodes;
  for (const auto& r : rt.ranks) nodes.insert(r.node);
  return absl::StrJoin(nodes, ",");
}

bool UsesSlurm(const v1::JobSpec& spec) { return spec.resources().launcher() == "slurm"; }

std::string SlurmNodeSet(const v1::JobSpec& spec) {
  const v1::SlurmSpec& s = spec.resources().slurm();
  return absl::StrCat("slurm:", s.partition().empty() ? "(default)" : s.partition(), ":",
                      s.nodes() > 0 ? s.nodes() : 1);
}

std::string MeasurementNodeSet(const JobRt& rt) {
  return UsesSlurm(rt.spec) ? SlurmNodeSet(rt.spec) : NodeSetKey(rt);
}

std::string FailureMessage(const JobRt& rt, const std::string& reason) {
  if (rt.spec.train().max_restarts() <= 0) return reason;
  // The count goes with the headline, before the rank's last output lines.
  const std::string count = absl::StrCat(" (after ", rt.restarts,
                                         " restarts; train.max_restarts is ",
                                         rt.spec.train().max_restarts(), ")");
  const size_t cut = reason.find("; last output:");
  if (cut == std::string::npos) return reason + count;
  return absl::StrCat(reason.substr(0, cut), count, reason.substr(cut));
}

std::string StallOf(const JobRt& rt, Clock::TimePoint now, double timeout_s) {
  for (size_t r = 0; r < rt.ranks.size(); ++r) {
    const RankRt& rr = rt.ranks[r];
    const double idle = SecondsBetween(rr.last_progress, now);
    if (!rr.exited && idle > timeout_s) {
      return absl::StrCat("rank ", r, " on node ", rr.node, " made no progress for ",
                          static_cast<int>(idle), " s (no heartbeat or step; timeout ", timeout_s,
                          " s)", LastPhaseOf(rt, r, now));
    }
  }
  return "";
}

void FillProgress(const JobRt& rt, Clock::TimePoint now, v1::Job* job) {
  job->clear_ranks();
  int64_t min_step = -1;
  double sps = 0, loss = 0, step_s = 0;
  int n_loss = 0, n_step_s = 0;
  for (const RankRt& r : rt.ranks) {
    v1::RankProgress p = r.progress;
    p.set_restarts(rt.restarts);
    if (!r.exited) p.set_heartbeat_age_seconds(SecondsBetween(r.last_progress, now));
    p.clear_phase();
    if (!r.exited && r.phase.kind() != v1::RANK_PHASE_UNSPECIFIED) {
      *p.mutable_phase() = r.phase;
      p.mutable_phase()->set_seconds(r.phase.seconds() +
                                     std::max(0.0, SecondsBetween(r.phase_at, now)));
    }
    *job->add_ranks() = p;
    min_step = min_step < 0 ? p.step() : std::min(min_step, p.step());
    if (!r.exited) sps += p.samples_per_second();
    if (p.step() > 0) {
      loss += p.loss();
      ++n_loss;
    }
    if (p.step_seconds() > 0) {
      step_s += p.step_seconds();
      ++n_step_s;
    }
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
  if (!rt.launcher.kind().empty()) *job->mutable_launcher() = rt.launcher;
  if (rt.final_loss.has_value()) {
    job->set_final_loss(*rt.final_loss);
    job->set_final_loss_steps(rt.final_loss_steps);
    job->set_final_loss_ranks(rt.final_loss_ranks);
  } else {
    job->clear_final_loss();
  }
  if (rt.exit.has_value()) {
    *job->mutable_exit() = *rt.exit;
  } else {
    job->clear_exit();
  }
  job->set_peak_memory_bytes(rt.peak_memory_bytes);
}

double RankMemoryOf(const v1::StepMetrics& m, int local_device) {
  if (local_device >= 0 && m.gpu_memory_used_bytes() > 0) return m.gpu_memory_used_bytes();
  return m.host_memory_peak_bytes() > 0 ? m.host_memory_peak_bytes() : 0;
}

v1::JobExit ExitOf(const JobRt& rt, v1::JobState state) {
  v1::JobExit e;
  e.set_rank(-1);
  if (state == v1::SUCCEEDED) return e;
  if (state == v1::FAILED && rt.rank_failure.has_value()) e = *rt.rank_failure;
  e.set_failed(true);
  return e;
}

}  // namespace dgca
