#include "cli/watch_view.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/format.h"
#include "proto/rpc/rank_state.h"

namespace dgca {
namespace cli {

void LossHistory::Add(const v1::StepMetrics& m) {
  if (!std::isfinite(m.loss()) || m.step() <= 0) return;
  auto& [sum, count] = by_step_[m.step()];
  sum += m.loss();
  ++count;
  while (by_step_.size() > capacity_) by_step_.erase(by_step_.begin());
}

std::vector<double> LossHistory::Last(size_t n) const {
  std::vector<double> out;
  size_t skip = by_step_.size() > n ? by_step_.size() - n : 0;
  for (const auto& [step, sc] : by_step_) {
    if (skip > 0) {
      --skip;
      continue;
    }
    out.push_back(sc.first / sc.second);
  }
  return out;
}

std::string ProgressBar(double frac, int width) {
  if (!std::isfinite(frac)) frac = 0;
  frac = std::clamp(frac, 0.0, 1.0);
  int filled = static_cast<int>(std::lround(frac * width));
  std::string out = "[";
  for (int i = 0; i < width; ++i) out += i < filled ? "█" : "░";
  return out + "]";
}

std::string Sparkline(const std::vector<double>& values, size_t max_points) {
  static const char* kLevels[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::vector<double> v;
  for (double x : values) {
    if (std::isfinite(x)) v.push_back(x);
  }
  if (v.size() > max_points) v.erase(v.begin(), v.end() - max_points);
  if (v.empty()) return "";
  auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  double min = *lo, range = *hi - *lo;
  std::string out;
  for (double x : v) {
    int level = range > 0 ? static_cast<int>(std::lround((x - min) / range * 7)) : 3;
    out += kLevels[std::clamp(level, 0, 7)];
  }
  return out;
}

namespace {

std::string Percent(double ratio) { return absl::StrFormat("%.1f%%", 100 * ratio); }

}  // namespace

std::string RenderWatch(const WatchInput& in, int bar_width) {
  const v1::Job& job = in.job;
  Progress p = ComputeProgress(job, in.ranks);
  std::string out = absl::StrCat("job ", job.id());
  if (!job.name().empty()) absl::StrAppend(&out, " (", job.name(), ")");
  absl::StrAppend(&out, "  ", StateName(p.state));
  if (p.elapsed_seconds > 0) absl::StrAppend(&out, "  elapsed ", FormatDuration(p.elapsed_seconds));
  if (!IsTerminal(p.state) && p.eta_seconds >= 0) {
    absl::StrAppend(&out, "  ETA ", FormatDuration(p.eta_seconds));
  }
  if (job.restarts() > 0) absl::StrAppend(&out, "  restarts ", job.restarts());
  out += "\n";
  if (!job.message().empty() && IsTerminal(p.state)) absl::StrAppend(&out, "          ", job.message(), "\n");

  double frac = p.total_steps > 0 ? static_cast<double>(p.step) / p.total_steps : 0;
  absl::StrAppend(&out, "progress  ", ProgressBar(frac, bar_width),
                  absl::StrFormat(" %3d%%  step %d", static_cast<int>(std::clamp(frac, 0.0, 1.0) * 100), p.step));
  if (p.total_steps > 0) absl::StrAppend(&out, "/", p.total_steps);
  out += "\n";

  // Step time and communication from the live samples (the snapshot has no
  // communication numbers): sums over ranks of the last step of each.
  double step_s = 0, exposed = 0, allreduce = 0;
  for (const auto& [r, m] : in.ranks) {
    step_s += m.step_seconds();
    exposed += m.exposed_comm_seconds();
    allreduce += m.allreduce_seconds();
  }
  absl::StrAppend(&out, "speed     ",
                  p.samples_per_second > 0 ? absl::StrFormat("%.1f samples/s", p.samples_per_second)
                                           : std::string("-"));
  if (step_s > 0) absl::StrAppendFormat(&out, "  %.3f s/step", step_s / in.ranks.size());
  out += "\n";

  // The step losses while training; once the job has its final loss
  // (docs/metrics.md "Final loss"), that one, said as such.
  absl::StrAppend(&out, "loss      ",
                  !p.has_loss        ? std::string("-")
                  : p.loss_is_final ? absl::StrFormat("final %.4f (mean of the last %d steps)", p.loss,
                                                      p.final_loss_steps)
                                    : absl::StrFormat("%.4f", p.loss));
  std::string spark = Sparkline(in.losses, 30);
  if (!spark.empty()) {
    absl::StrAppendFormat(&out, "  %s  (last %d steps)", spark,
                          static_cast<int>(std::min<size_t>(in.losses.size(), 30)));
  }
  out += "\n";

  absl::StrAppend(&out, "comm      ");
  if (step_s > 0) {
    absl::StrAppend(&out, "exposed ", Percent(exposed / step_s), " of step time, all-reduce ",
                    Percent(allreduce / step_s));
  } else {
    out += "-";
  }
  out += "\n";

  // Per-rank rows: the snapshot's ranks, updated by newer live samples.
  std::map<int, v1::RankProgress> by_rank;
  for (const auto& r : job.ranks()) by_rank[r.rank()] = r;
  for (const auto& [r, m] : in.ranks) {
    if (!by_rank.count(r)) by_rank[r].set_rank(r);
  }
  if (by_rank.empty()) return out;
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "NODE", "STATE", "STEP", "LOSS", "SAMPLES/S", "COMM", "HB_AGE"}};
  for (auto [r, rp] : by_rank) {
    std::string comm = "-";
    auto it = in.ranks.find(r);
    if (it != in.ranks.end() && it->second.step() >= rp.step()) {
      const v1::StepMetrics& m = it->second;
      rp.set_step(m.step());
      rp.set_loss(m.loss());
      rp.set_samples_per_second(m.samples_per_second());
      if (m.step_seconds() > 0) comm = Percent(m.exposed_comm_seconds() / m.step_seconds());
    }
    bool exited = RankStateEnded(rp.state());
    rows.push_back({absl::StrCat(r), rp.node().empty() ? "-" : rp.node(),
                    rp.state().empty() ? "-" : rp.state(), absl::StrCat(rp.step()),
                    rp.step() > 0 ? absl::StrFormat("%.4f", rp.loss()) : "-",
                    rp.samples_per_second() > 0 ? absl::StrFormat("%.1f", rp.samples_per_second())
                                                : "-",
                    comm,
                    exited ? absl::StrCat("exit ", rp.exit_code())
                           : absl::StrFormat("%.1fs", rp.heartbeat_age_seconds())});
  }
  return out + "\n" + TextTable(rows);
}

}  // namespace cli
}  // namespace dgca
