#include "cli/format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dgca {
namespace cli {

Progress ComputeProgress(const v1::Job& job, const std::map<int, v1::StepMetrics>& ranks) {
  Progress p;
  p.state = job.state();
  p.step = job.step();
  p.total_steps = job.total_steps();
  p.samples_per_second = job.samples_per_second();
  p.loss = job.loss();
  p.has_loss = job.step() > 0;
  p.eta_seconds = job.eta_seconds() > 0 ? job.eta_seconds() : -1;
  if (job.total_steps() == 0 && job.spec().train().steps() > 0) {
    p.total_steps = job.spec().train().steps();
  }
  if (!ranks.empty()) {
    int64_t min_step = INT64_MAX, total = 0;
    double sps = 0, loss = 0, step_s = 0;
    for (const auto& [r, m] : ranks) {
      min_step = std::min<int64_t>(min_step, m.step());
      total = std::max<int64_t>(total, m.total_steps());
      sps += m.samples_per_second();
      loss += m.loss();
      step_s += m.step_seconds();
    }
    const double n = static_cast<double>(ranks.size());
    if (min_step >= p.step) {
      p.step = min_step;
      if (total > 0) p.total_steps = total;
      p.samples_per_second = sps;
      p.loss = loss / n;
      p.has_loss = true;
      if (p.total_steps > 0 && step_s > 0) {
        p.eta_seconds = (p.total_steps - p.step) * (step_s / n);
      }
    }
  }
  if (job.created_unix_ms() > 0) {
    int64_t end = IsTerminal(job.state()) && job.updated_unix_ms() > 0
                      ? job.updated_unix_ms()
                      : static_cast<int64_t>(std::time(nullptr)) * 1000;
    p.elapsed_seconds = std::max<double>(0, (end - job.created_unix_ms()) / 1000.0);
  }
  return p;
}

std::string ProgressLine(const Progress& p, int bar_width) {
  std::string out = StateName(p.state);
  if (p.total_steps > 0) {
    absl::StrAppendFormat(&out, "  step %d/%d", p.step, p.total_steps);
    double frac = std::clamp(static_cast<double>(p.step) / p.total_steps, 0.0, 1.0);
    if (bar_width > 0) {
      int filled = static_cast<int>(std::lround(frac * bar_width));
      absl::StrAppend(&out, " [", std::string(filled, '#'),
                      std::string(bar_width - filled, '.'), "]");
    }
    absl::StrAppendFormat(&out, " %3d%%", static_cast<int>(frac * 100));
  } else if (p.step > 0) {
    absl::StrAppendFormat(&out, "  step %d", p.step);
  }
  if (p.samples_per_second > 0) absl::StrAppendFormat(&out, "  %.1f samples/s", p.samples_per_second);
  if (p.has_loss) absl::StrAppendFormat(&out, "  loss %.4f", p.loss);
  if (!IsTerminal(p.state) && p.eta_seconds >= 0) {
    absl::StrAppend(&out, "  ETA ", FormatDuration(p.eta_seconds));
  }
  if (p.elapsed_seconds > 0) absl::StrAppend(&out, "  elapsed ", FormatDuration(p.elapsed_seconds));
  return out;
}

std::string FormatDuration(double s) {
  if (s < 0 || !std::isfinite(s)) return "?";
  int64_t t = static_cast<int64_t>(std::lround(s));
  if (t < 60) return absl::StrCat(t, "s");
  if (t < 3600) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
}

std::string StateName(v1::JobState s) {
  if (s == v1::JOB_STATE_UNSPECIFIED) return "UNKNOWN";
  return v1::JobState_Name(s);
}

bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

std::string LossPlot(const v1::Job& job, int width, int height) {
  const auto& pts = job.loss_curve();
  if (pts.size() < 2 || width < 2 || height < 2) return "";
  const int64_t s0 = pts.begin()->step(), s1 = pts.rbegin()->step();
  const v1::LossPoint* lowest = &*pts.begin();
  for (const v1::LossPoint& p : pts)
    if (p.loss() < lowest->loss()) lowest = &p;
  // Column c holds the mean of the points whose step maps to it; the loss
  // axis spans what is drawn (the column means).
  std::vector<double> sum(width, 0.0);
  std::vector<int> n(width, 0);
  for (const v1::LossPoint& p : pts) {
    // The coordinator sends the points in step order; clamped all the same,
    // so a reply out of order cannot index past the grid.
    const int c = s1 > s0 ? static_cast<int>(std::clamp<int64_t>(
                                (p.step() - s0) * (width - 1) / (s1 - s0), 0, width - 1))
                          : 0;
    sum[c] += p.loss();
    ++n[c];
  }
  std::vector<std::pair<int, double>> drawn;  // (column, mean)
  for (int c = 0; c < width; ++c)
    if (n[c] > 0) drawn.emplace_back(c, sum[c] / n[c]);
  const auto [lo_it, hi_it] = std::minmax_element(
      drawn.begin(), drawn.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  const double lo = lo_it->second, hi = hi_it->second;
  std::vector<std::string> grid(height, std::string(width, ' '));
  for (const auto& [c, v] : drawn) {
    const int r = hi > lo ? static_cast<int>(std::lround((hi - v) / (hi - lo) * (height - 1))) : height / 2;
    grid[r][c] = '*';
  }
  const std::string top = absl::StrFormat("%.4g", hi), bottom = absl::StrFormat("%.4g", lo);
  const size_t lw = std::max(top.size(), bottom.size());
  std::string out;
  for (int r = 0; r < height; ++r) {
    std::string label = r == 0 ? top : r == height - 1 ? bottom : "";
    out += std::string(lw - label.size(), ' ') + label + " |" + grid[r] + "\n";
  }
  out += std::string(lw, ' ') + " +" + std::string(width, '-') + "\n";
  const std::string left = absl::StrCat("step ", s0), right = absl::StrCat(s1);
  out += std::string(lw + 2, ' ') + left +
         std::string(std::max<int>(1, width - static_cast<int>(left.size() + right.size())), ' ') + right + "\n";
  out += absl::StrFormat("first %.4f (step %d), lowest %.4f (step %d), last %.4f (step %d); %d points\n",
                         pts.begin()->loss(), s0, lowest->loss(), lowest->step(), pts.rbegin()->loss(), s1,
                         pts.size());
  return out;
}

std::string EvalTable(const std::map<std::string, double>& eval) {
  std::vector<std::vector<std::string>> rows = {{"METRIC", "VALUE"}};
  for (const auto& [k, v] : eval) {
    // Counts ("sentences") print as integers, ratios with four decimals.
    bool count = v >= 2 && v == std::floor(v) && v < 1e15;
    rows.push_back({k, count ? absl::StrFormat("%.0f", v) : absl::StrFormat("%.4f", v)});
  }
  return TextTable(rows);
}

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  std::string out;
  auto st = google::protobuf::util::MessageToJsonString(m, &out, o);
  if (!st.ok()) return "{}\n";
  if (out.empty() || out.back() != '\n') out += "\n";
  return out;
}

std::string ClockTime(int64_t unix_ms) {
  time_t t = static_cast<time_t>(unix_ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[16];
  strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  return buf;
}

std::string Age(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  double s = (static_cast<double>(std::time(nullptr)) * 1000 - unix_ms) / 1000.0;
  return FormatDuration(std::max(0.0, s)) + " ago";
}

std::string OneLine(const std::string& message, size_t width) {
  const size_t nl = message.find('\n');
  std::string line = message.substr(0, nl);
  bool cut = nl != std::string::npos;
  // Count characters, not bytes: a UTF-8 continuation byte is 10xxxxxx.
  size_t chars = 0, i = 0;
  for (; i < line.size(); ++i) {
    if ((static_cast<unsigned char>(line[i]) & 0xC0) == 0x80) continue;
    if (chars == width) break;
    ++chars;
  }
  if (i < line.size()) {
    line.resize(i);
    cut = true;
  }
  return cut ? line + "..." : line;
}

}  // namespace cli
}  // namespace dgca
