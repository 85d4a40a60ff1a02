// FormatPlan: the text of `dgca plan`.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/planner.h"

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
      return "?";
  }
}

}  // namespace

std::string FormatPlan(const v1::Plan& p) {
  std::string out = absl::StrFormat(
      "Plan: %d %s rank(s), %s, micro_batch %d x accumulation %d, bucket %g MiB, "
      "%s, %d loader thread(s), %d thread(s) per rank%s\n\n",
      p.ranks(), p.device(), p.backend(), p.micro_batch(), p.accumulation(),
      p.bucket_mb(), p.precision(), p.loader_threads(), p.threads_per_rank(),
      p.tuning_mode().empty() ? "" : absl::StrCat(", tuning ", p.tuning_mode()));
  size_t wn = 4, wv = 5;
  for (const auto& d : p.decisions()) {
    wn = std::max(wn, d.name().size());
    wv = std::max(wv, d.value().size());
  }
  wv = std::min<size_t>(wv, 24);
  out += absl::StrFormat("%-*s  %-*s  %-8s  %s\n", wn, "NAME", wv, "VALUE", "SOURCE",
                         "REASON");
  for (const auto& d : p.decisions())
    out += absl::StrFormat("%-*s  %-*s  %-8s  %s\n", wn, d.name(), wv, d.value(),
                           SourceName(d.source()), d.reason());
  out += "\nEnvironment (every rank):\n";
  if (p.env().empty()) out += "  (none)\n";
  // Sorted for stable output.
  std::vector<std::pair<std::string, std::string>> env(p.env().begin(), p.env().end());
  std::sort(env.begin(), env.end());
  for (const auto& [k, v] : env) out += absl::StrCat("  ", k, "=", v, "\n");
  out += "\nPredictions:\n";
  if (p.predicted_step_seconds() > 0) {
    const double samples =
        static_cast<double>(p.ranks()) * p.micro_batch() * p.accumulation();
    out += absl::StrFormat("  step time        %.3f s per optimizer step (%.0f samples)\n",
                           p.predicted_step_seconds(), samples);
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
  if (p.trials_size() > 0) {
    out += "\nTrials:\n";
    for (const auto& t : p.trials())
      out += absl::StrFormat(
          "  ranks %d, micro_batch %d, accumulation %d, bucket %g MiB: %s%s\n", t.ranks(),
          t.micro_batch(), t.accumulation(), t.bucket_mb(),
          t.measured_step_seconds() > 0
              ? absl::StrFormat("%.3f s/step, %.0f samples/s", t.measured_step_seconds(),
                                t.samples_per_second())
              : std::string("not measured"),
          t.note().empty() ? "" : absl::StrCat(" (", t.note(), ")"));
  }
  if (p.warnings_size() > 0) {
    out += "\nWarnings:\n";
    for (const auto& w : p.warnings()) out += absl::StrCat("  - ", w, "\n");
  }
  return out;
}

}  // namespace dgca
