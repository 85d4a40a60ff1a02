#include "coordinator/plan_checks.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/job_runtime.h"
#include "coordinator/measured_planning.h"
#include "planner/compute_prior.h"
#include "planner/cost_model.h"
#include "planner/units.h"

namespace dgca {
namespace {

constexpr double kLiveCheckSecondsPerRank = 10;
// An efficiency above this (the job 10x faster than the ideal at the
// device's peak) is a broken measurement, not a correction: not stored.
// Above 1 is possible and kept: the prior's inputs can be off (a CPU GEMM
// rate measured under load; on the build VM small models ran at up to
// 2.7x the ideal of their measured GEMM rate).
constexpr double kMaxPlausibleEfficiency = 10;

size_t LiveCheckSamples(int ranks) {
  return std::min(StepStats::kMaxStepSamples, std::max<size_t>(40, 10 * std::max(1, ranks)));
}

}  // namespace

StepSample SampleOf(const v1::StepMetrics& m) {
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

double RelativeError(double predicted, double measured) {
  return measured > 0 ? (predicted - measured) / measured : 0;
}

StepMedians MediansOf(const std::vector<StepSample>& samples, int accumulation) {
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

bool LiveCheckDue(size_t samples, double step_seconds_seen, int ranks) {
  return samples >= LiveCheckSamples(ranks) &&
         (step_seconds_seen >= kLiveCheckSecondsPerRank * std::max(1, ranks) ||
          samples >= StepStats::kMaxStepSamples);
}

std::string LiveCheckText(const std::string& job_id, const v1::JobSpec& spec,
                          const v1::Plan& p, const std::vector<StepSample>& samples) {
  const v1::StepBreakdown b = BreakdownOf(samples, p);
  v1::DiagnoseJobResponse d;
  if (!DiagnoseSteps(p, spec, b, &d).ok()) return "";  // no step time
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
  absl::StrAppend(&text, " (dgca diagnose ", job_id, " has the breakdown)");
  return text;
}

PlanReview ReviewPlan(const std::string& job_id, const v1::JobSpec& spec, const v1::Plan& plan,
                      const std::vector<StepSample>& ss, const std::string& node_set,
                      v1::JobState final_state, const std::string& attention_kernels,
                      bool attention_mixed, int64_t now_unix_ms) {
  PlanReview r;
  if (ss.size() < kMinStepSamples) return r;
  const int k = std::max(1, plan.accumulation());
  const StepMedians med = MediansOf(ss, k);
  v1::PlanCheck& c = r.check;
  c.set_samples(static_cast<int64_t>(ss.size()));
  c.set_micro_batch(plan.micro_batch());
  c.set_accumulation(k);
  c.set_predicted_step_seconds(plan.predicted_step_seconds());
  c.set_predicted_comm_share(plan.predicted_comm_share());
  c.set_predicted_allreduce_seconds(plan.predicted_allreduce_seconds());
  c.set_measured_step_seconds(med.step);
  c.set_measured_comm_share(med.comm_share);
  c.set_measured_allreduce_seconds(med.allreduce);
  c.set_measured_compute_seconds(med.compute);
  *c.mutable_breakdown() = BreakdownOf(ss, plan);
  if (c.predicted_step_seconds() > 0) {
    r.text = absl::StrFormat(
        "predicted vs measured (median of %d rank-steps): step %.4f s vs %.4f s (%+.1f%%), "
        "comm share %.1f%% vs %.1f%% (%+.1f%%), all-reduce %.4f s vs %.4f s",
        c.samples(), c.predicted_step_seconds(), c.measured_step_seconds(),
        100 * RelativeError(c.predicted_step_seconds(), c.measured_step_seconds()),
        100 * c.predicted_comm_share(), 100 * c.measured_comm_share(),
        100 * RelativeError(c.predicted_comm_share(), c.measured_comm_share()),
        c.predicted_allreduce_seconds(), c.measured_allreduce_seconds());
  } else {
    r.text = absl::StrFormat(
        "measured (median of %d rank-steps): step %.4f s, comm share %.1f%%; the plan had no "
        "step-time measurement to predict from",
        c.samples(), c.measured_step_seconds(), 100 * c.measured_comm_share());
  }
  if (final_state != v1::SUCCEEDED && ss.size() < 4 * kMinStepSamples) return r;
  StepMeasurement m;
  m.job_id = job_id;
  m.key = StepKey(spec, plan, node_set);
  m.micro_batch = plan.micro_batch();
  m.compute_seconds = c.measured_compute_seconds();
  m.samples = c.samples();
  m.time_unix_ms = now_unix_ms;
  m.comm_key = CommKey(node_set, plan);
  if (plan.allreduce_measured() && plan.predicted_allreduce_probe_seconds() > 0) {
    m.allreduce_probe_seconds = plan.predicted_allreduce_probe_seconds();
    m.allreduce_measured_seconds = c.measured_allreduce_seconds();
  }
  r.step = m;
  // The efficiency on the device class, for later plans of any model there.
  const double eff = EfficiencyOf(plan, m.compute_seconds);
  if (eff > 0 && eff <= kMaxPlausibleEfficiency) {
    EfficiencyMeasurement e;
    e.job_id = job_id;
    e.device_class = plan.compute_device_class();
    e.micro_batch = plan.micro_batch();
    e.efficiency = eff;
    e.time_unix_ms = now_unix_ms;
    r.efficiency = e;
  }
  // The most memory a rank held: the point the next plan's memory line goes
  // through (planner/fits.h FitMemoryLine).
  double peak = 0;
  for (const auto& rank : c.breakdown().ranks()) peak = std::max(peak, rank.peak_memory_bytes());
  if (!std::isfinite(peak)) peak = 0;  // a rank's nonsense is not a measurement
  if (peak > 0 && attention_mixed) {
    r.memory_not_stored = absl::StrFormat(
        "; peak memory %s not stored (the ranks ran both attention kernels over the job's "
        "attempts, so it is neither's)",
        FormatBytes(peak));
  } else if (peak > 0 && final_state == v1::FAILED) {
    r.memory_not_stored = absl::StrFormat(
        "; peak memory %s not stored (a failed job, perhaps out of memory, may not have "
        "reported what its micro-batch needs)",
        FormatBytes(peak));
  } else if (peak > 0 && plan.micro_batch() > 0) {
    MemoryMeasurement mm;
    mm.job_id = job_id;
    mm.key = MemoryKey(spec, plan, node_set, attention_kernels);
    mm.micro_batch = plan.micro_batch();
    mm.peak_bytes = peak;
    mm.time_unix_ms = now_unix_ms;
    r.memory = mm;
    if (plan.attention() == "auto") r.kept_attention = attention_kernels;
  }
  return r;
}

std::string RecordReview(JobStore* store, const PlanReview& r) {
  std::string text = r.text;
  if (!r.step.has_value()) return text;
  absl::Status st = store->AddStepMeasurement(*r.step);
  if (st.ok()) {
    text += absl::StrFormat("; stored compute %.4f s per micro-step of %d for later plans",
                            r.step->compute_seconds, r.step->micro_batch);
  } else {
    text += absl::StrCat("; cannot store the measurement: ", st.message());
  }
  if (r.efficiency.has_value()) {
    absl::Status es = store->AddEfficiencyMeasurement(*r.efficiency);
    if (es.ok()) {
      absl::StrAppendFormat(&text, ", efficiency %.3f of the ideal on %s", r.efficiency->efficiency,
                            r.efficiency->device_class);
    } else {
      absl::StrAppend(&text, "; cannot store the efficiency: ", es.message());
    }
  }
  text += r.memory_not_stored;
  if (r.memory.has_value()) {
    absl::Status ms = store->AddMemoryMeasurement(*r.memory);
    if (ms.ok()) {
      absl::StrAppendFormat(&text, " and peak memory %s at micro-batch %d",
                            FormatBytes(r.memory->peak_bytes), r.memory->micro_batch);
      if (!r.kept_attention.empty())
        absl::StrAppend(&text, " (", r.kept_attention, " attention, which the ranks kept)");
    } else {
      absl::StrAppend(&text, "; cannot store the memory measurement: ", ms.message());
    }
  }
  return text;
}

}  // namespace dgca
