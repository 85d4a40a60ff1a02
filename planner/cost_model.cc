#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "planner/units.h"

namespace dgca {

using planner_text::Rate;
using planner_text::Sec;

Prediction Predict(int n, int m, int k, double bucket, const CostInputs& in,
                   const LinkModel& link) {
  Prediction p;
  p.n = n;
  p.m = m;
  p.k = k;
  p.bucket = bucket;
  const double nb = bucket > 0 ? std::max(1.0, std::ceil(in.grad_bytes / bucket)) : 1;
  p.buckets = nb;
  if (n > 1 && link.busbw > 0) {
    // nb - 1 full buckets and the rest.
    const double full = bucket > 0 ? std::min(bucket, in.grad_bytes) : in.grad_bytes;
    p.comm = (nb - 1) * AllReduceSeconds(link, full, n) +
             AllReduceSeconds(link, in.grad_bytes - (nb - 1) * full, n);
  }
  p.comm_probe = p.comm;
  if (in.per_sample <= 0) return p;
  p.known = true;
  p.compute = in.fixed + in.per_sample * m;
  // Waiting for the slower peer inside the all-reduce (learned from earlier
  // jobs; see PlannerMeasurements::allreduce_skew_per_compute).
  if (n > 1) p.comm += in.skew * p.compute;
  if (in.can_overlap) {
    const double backward = kBackwardShare * p.compute;
    p.exposed = std::max(p.comm / nb, p.comm - backward * (1 - 1 / nb));
  } else {
    p.exposed = p.comm;
  }
  p.overlap = p.comm - p.exposed;
  p.step = k * p.compute + p.exposed;
  p.sps = p.step > 0 ? static_cast<double>(n) * m * k / p.step : 0;
  p.share = p.step > 0 ? p.exposed / p.step : 0;
  return p;
}

std::vector<std::pair<int, int>> Splits(int n, const CostInputs& in) {
  // Divisors of the per-rank batch, by ascending k (O(sqrt) even for huge
  // batches).
  const int per_rank = std::max(1, in.global / n);
  std::vector<int> ks;
  for (int64_t d = 1; d * d <= per_rank; ++d) {
    if (per_rank % d) continue;
    ks.push_back(static_cast<int>(d));
    if (d * d != per_rank) ks.push_back(static_cast<int>(per_rank / d));
  }
  std::sort(ks.begin(), ks.end());
  std::vector<std::pair<int, int>> out;
  for (int k : ks) {
    int m = per_rank / k;
    if (in.max_micro > 0 && m > in.max_micro) continue;
    out.push_back({m, k});
    if (out.size() >= 64) break;  // enough candidates; k only grows from here
  }
  return out;
}

int AccumulationForTarget(const Prediction& p) {
  const double k_real = p.compute > 0 ? p.exposed * (1 - kTargetCommShare) /
                                            (kTargetCommShare * p.compute)
                                      : 1e9;
  return static_cast<int>(std::min(1e9, std::ceil(k_real - 1e-9)));
}

double BucketFor(int n, const Prediction& at, const LinkModel& link, double grad_bytes,
                 std::string* why) {
  const double G = grad_bytes;
  const double f = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  // Latency <= 10% of t(S): latency <= 0.1 (latency + S f / B) <=> S >= 9 latency B / f.
  const double s_lo = link.busbw > 0 ? 9.0 * link.latency * link.busbw / f : 0;
  const double s_cap = G / kMinBuckets;
  const double t_all = link.busbw > 0 ? G * f / link.busbw : 0;
  const double backward = at.known ? kBackwardShare * at.compute : 0;
  double s;
  std::string rule;
  if (backward > 0 && t_all < 0.1 * backward) {
    s = std::min(s_cap, kFastLinkBucketBytes);
    rule = absl::StrFormat(
        "all gradients take %s < 10%% of the %s backward: communication hides "
        "easily, so a %s bucket keeps the tail after backward short",
        Sec(t_all), Sec(backward), FormatBytes(s));
  } else {
    s = s_cap;
    rule = absl::StrFormat(
        "G/%d = %s / %d = %s: the largest bucket that still gives %d buckets to "
        "overlap with backward; larger buckets amortize the per-call latency%s",
        kMinBuckets, FormatBytes(G), kMinBuckets, FormatBytes(s_cap), kMinBuckets,
        backward > 0 ? absl::StrFormat(" and all-reduce of all gradients (%s) is "
                                       "not small next to backward (%s)",
                                       Sec(t_all), Sec(backward))
                     : "");
  }
  if (s < s_lo) {
    rule += absl::StrFormat("; raised to %s so latency stays <= 10%%", FormatBytes(s_lo));
    s = s_lo;
  }
  s = std::max(s, 1 * kMiB);
  s = std::min(s, std::max(G, 1 * kMiB));
  *why = absl::StrFormat(
      "%s; bandwidth-bound needs S >= 9 x latency x busbw / f = 9 x %s x %s / %.2f = "
      "%s (so t(S) = latency + S x f / busbw has latency <= 10%%); t(%s) = %s + "
      "%s x %.2f / %s = %s",
      rule, Sec(link.latency), Rate(link.busbw), f, FormatBytes(s_lo), FormatBytes(s),
      Sec(link.latency), FormatBytes(s), f, Rate(link.busbw),
      Sec(link.latency + (link.busbw > 0 ? s * f / link.busbw : 0)));
  return s;
}

}  // namespace dgca
