#include "planner/plan_format.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/core/strings.h"
#include "planner/units.h"

namespace dgca {
namespace {

const char* SourceName(v1::ValueSource s) {
  switch (s) {
    case v1::USER:
      return "user";
    case v1::PLANNER:
      return "planner";
    case v1::DEFAULT:
      return "default";
    default:
      return "-";
  }
}

}  // namespace

std::string FormatPlan(const v1::Plan& p, const std::string& job_name) {
  const int samples = p.micro_batch() * p.accumulation() * std::max(1, p.ranks());
  std::string out = absl::StrFormat(
      "plan%s: %d %s rank(s), backend %s, precision %s; micro_batch %d x accumulation %d x "
      "ranks %d = %d samples/step, bucket %g MiB; %d loader thread(s), %d thread(s) per "
      "rank%s\n\n",
      job_name.empty() ? "" : absl::StrCat(" for ", job_name), p.ranks(), p.device(),
      p.backend(), p.precision(), p.micro_batch(), p.accumulation(), p.ranks(), samples,
      p.bucket_mb(), p.loader_threads(), p.threads_per_rank(),
      p.tuning_mode().empty() ? "" : absl::StrCat("; tuning ", p.tuning_mode()));
  std::vector<std::vector<std::string>> rows = {{"SETTING", "VALUE", "SOURCE", "REASON"}};
  for (const auto& d : p.decisions())
    rows.push_back({d.name(), d.value(), SourceName(d.source()), d.reason()});
  out += TextTable(rows);
  out += "\nEnvironment (every rank):\n";
  if (p.env().empty()) out += "  (none)\n";
  // Sorted for stable output.
  std::vector<std::pair<std::string, std::string>> env(p.env().begin(), p.env().end());
  std::sort(env.begin(), env.end());
  for (const auto& [k, v] : env) out += absl::StrCat("  ", k, "=", v, "\n");
  out += "\nPredictions:\n";
  if (p.predicted_step_seconds() > 0) {
    out += absl::StrFormat("  step time        %.3f s per optimizer step (%d samples)\n",
                           p.predicted_step_seconds(), samples);
    if (!p.compute_source().empty())
      out += absl::StrFormat("  compute from     %s\n",
                             p.compute_source() == "prior"
                                 ? absl::StrCat("the compute prior for ", p.compute_device_class(),
                                                " (nothing measured yet; see predicted.step_seconds)")
                             : p.compute_source() == "trial"
                                 ? std::string("this plan's tuning trials")
                                 : std::string("earlier jobs' measurements of this model here"));
    out += absl::StrFormat("  comm share       %.1f%% of the step exposed\n",
                           100 * p.predicted_comm_share());
    if (p.predicted_allreduce_seconds() > 0)
      out += absl::StrFormat("  all-reduce       %.3f s for all gradients (before overlap)\n",
                             p.predicted_allreduce_seconds());
    out += absl::StrFormat("  throughput       %.0f samples/s\n",
                           p.predicted_samples_per_second());
    if (p.predicted_single_rank_samples_per_second() > 0)
      out += absl::StrFormat("  one rank alone   %.0f samples/s (%d rank(s): %.2fx)\n",
                             p.predicted_single_rank_samples_per_second(), p.ranks(),
                             p.predicted_samples_per_second() /
                                 p.predicted_single_rank_samples_per_second());
  } else {
    out += "  step time, comm share, throughput: unknown (no step-time measurement)\n";
  }
  if (p.predicted_memory_bytes() > 0)
    out += absl::StrFormat(
        "  memory           %s per rank%s\n", FormatBytes(p.predicted_memory_bytes()),
        p.memory_target_bytes() > 0 && p.device_memory_bytes() > 0
            ? absl::StrFormat(" (target %s of %s)", FormatBytes(p.memory_target_bytes()),
                              FormatBytes(p.device_memory_bytes()))
            : "");
  if (p.trials_size() > 0) out += absl::StrCat("\nTrials:\n", FormatTrials(p));
  if (p.warnings_size() > 0) {
    out += "\nWarnings:\n";
    for (const auto& w : p.warnings()) out += absl::StrCat("  - ", w, "\n");
  }
  return out;
}

std::string PlanSummary(const v1::Plan& p) {
  return absl::StrCat("ranks=", p.ranks(), " device=", p.device(), " backend=", p.backend(),
                      " micro_batch=", p.micro_batch(), " accumulation=", p.accumulation(),
                      " bucket_mb=", p.bucket_mb(), " precision=", p.precision(),
                      p.warnings_size() ? absl::StrCat(" warnings: ", absl::StrJoin(p.warnings(), "; "))
                                        : "");
}

std::string FormatTrials(const v1::Plan& plan) {
  if (plan.trials_size() == 0) return "";
  auto secs = [](double v) { return v > 0 ? absl::StrFormat("%.4f", v) : std::string("-"); };
  std::vector<std::vector<std::string>> t = {{"MICRO_BATCH", "ACCUMULATION", "BUCKET_MB",
                                              "PREDICTED_S", "MEASURED_S", "SAMPLES/S", "NOTE"}};
  for (const auto& tr : plan.trials()) {
    t.push_back({absl::StrCat(tr.micro_batch()), absl::StrCat(tr.accumulation()),
                 absl::StrFormat("%g", tr.bucket_mb()), secs(tr.predicted_step_seconds()),
                 secs(tr.measured_step_seconds()),
                 tr.samples_per_second() > 0 ? absl::StrFormat("%.1f", tr.samples_per_second())
                                             : std::string("-"),
                 // One line per trial: a failure's log tail is cut at its first line.
                 tr.note().substr(0, tr.note().find('\n'))});
  }
  return TextTable(t);
}

}  // namespace dgca
