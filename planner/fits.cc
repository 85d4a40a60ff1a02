#include "planner/fits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/units.h"

namespace dgca {

using planner_text::Sec;

AllReduceLine FitAllReduceLine(const std::vector<std::pair<double, double>>& points, int n) {
  AllReduceLine out;
  if (points.size() < 2 || n < 2) return out;
  // Least squares t = a + x / B with x = bytes * f.
  const double f = 2.0 * (n - 1) / n;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double cnt = static_cast<double>(points.size());
  for (const auto& p : points) {
    double x = p.first * f, y = p.second;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double den = cnt * sxx - sx * sx;
  const double slope = den != 0 ? (cnt * sxy - sx * sy) / den : 0;
  if (slope <= 0) return out;
  out.ok = true;
  out.busbw = 1.0 / slope;
  out.latency = std::max(0.0, (sy - slope * sx) / cnt);
  return out;
}

StepTimeFit FitStepTime(const PlannerMeasurements& meas) {
  StepTimeFit fit;
  // Distinct micro-batches (the first point of each m wins: callers list the
  // newest first).
  std::vector<std::pair<int, double>> pts;
  std::set<int> seen;
  for (const auto& [m, sec] : meas.step_points)
    if (m > 0 && sec > 0 && seen.insert(m).second) pts.push_back({m, sec});
  if (pts.empty() && meas.step_seconds > 0 && meas.step_micro_batch > 0)
    pts.push_back({meas.step_micro_batch, meas.step_seconds});
  if (pts.empty()) return fit;
  const std::string src = meas.step_source.empty() ? "measured" : meas.step_source;
  if (pts.size() == 1) {
    fit.per_sample = pts[0].second / pts[0].first;
    fit.why = absl::StrFormat("c(m) = %s x m / %d (%s)", Sec(pts[0].second), pts[0].first, src);
    return fit;
  }
  // Least squares c = a + b m.
  double sm = 0, sc = 0, smm = 0, smc = 0;
  const double n = static_cast<double>(pts.size());
  for (const auto& [m, c] : pts) {
    sm += m;
    sc += c;
    smm += static_cast<double>(m) * m;
    smc += m * c;
  }
  const double den = n * smm - sm * sm;
  double b = den > 0 ? (n * smc - sm * sc) / den : 0;
  double a = (sc - b * sm) / n;
  std::string how;
  if (b <= 0 || a < 0) {
    // Through the origin: b = sum(m c) / sum(m^2).
    a = 0;
    b = smc / smm;
    how = "a line through the origin (a free fit had a < 0 or b <= 0)";
  } else {
    how = "least squares";
  }
  fit.fixed = a;
  fit.per_sample = b;
  std::vector<std::string> shown;
  for (const auto& [m, c] : pts) shown.push_back(absl::StrFormat("c(%d) = %s", m, Sec(c)));
  fit.why = absl::StrFormat("c(m) = %s + %s x m, %s over %s (%s)", Sec(a), Sec(b), how,
                            absl::StrJoin(shown, ", "), src);
  return fit;
}

bool FitMemoryLine(const std::vector<std::pair<int, double>>& points, const std::string& source,
                   double ctx, double budget, MemoryEstimate* est, std::string* why) {
  why->clear();
  const double modelled = est->activations_per_sample;
  std::vector<std::pair<int, double>> held;  // (micro-batch, bytes without the CUDA context)
  for (const auto& [m, bytes] : points)
    if (m > 0 && bytes > 0 && std::isfinite(bytes)) held.emplace_back(m, bytes - ctx);
  std::set<int> distinct;
  for (const auto& p : held) distinct.insert(p.first);
  if (distinct.size() == 1) held.resize(1);  // one micro-batch: its newest peak
  double slope = modelled;
  if (distinct.size() >= 2) {
    double mm = 0, mh = 0;
    for (const auto& [m, h] : held) mm += m, mh += h;
    mm /= held.size();
    mh /= held.size();
    double sxx = 0, sxy = 0;
    for (const auto& [m, h] : held) sxx += (m - mm) * (m - mm), sxy += (m - mm) * (h - mh);
    // Never below the model's slope: points that mix runs (peaks stored
    // before ranks reported the attention an "auto" plan kept were filed
    // under the fused kernels) or noise could fit a slope too low to
    // extrapolate past the largest point, and the planner would pick a
    // micro-batch that does not fit. A model that overestimates is only
    // conservative.
    const double fitted = sxy / sxx;  // sxx > 0: two distinct micro-batches
    slope = std::max(fitted, modelled);
    *why = absl::StrFormat(
        " (%s; fitted over micro-batches %s: %s, the line on or above every point, the rest "
        "fixed)",
        source, absl::StrJoin(distinct, ", "),
        fitted <= 0 ? absl::StrCat("the peaks do not grow with the micro-batch, so the memory "
                                   "model's ",
                                   FormatBytes(modelled), " per sample")
                    : absl::StrCat(FormatBytes(slope), " per sample, the larger of the fitted ",
                                   FormatBytes(fitted), " and the memory model's ",
                                   FormatBytes(modelled)));
  } else if (!held.empty()) {
    const auto [m1, h1] = held.front();
    const double measured = (h1 - est->total(0)) / m1;
    const bool fits = budget <= 0 || h1 <= budget;
    if (measured > 0) slope = fits ? std::max(modelled, measured) : std::min(modelled, measured);
    *why = absl::StrFormat(
        " (%s; through it at %s per sample, the %s of the measured %s and the memory model's "
        "%s, the rest fixed)",
        source, FormatBytes(slope), fits ? "larger" : "smaller", FormatBytes(std::max(0.0, measured)),
        FormatBytes(modelled));
  }
  if (!held.empty()) {
    // The line of that slope on or above every point (through the highest
    // above it); the rest is fixed.
    double fixed = -std::numeric_limits<double>::infinity();
    for (const auto& [m, h] : held) fixed = std::max(fixed, h - slope * m);
    est->activations_per_sample = slope;
    est->workspace = std::max(0.0, est->workspace + fixed - est->total(0));
  }
  return !held.empty();
}

}  // namespace dgca
