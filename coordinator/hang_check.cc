#include "coordinator/hang_check.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/rpc/rank_phase.h"

namespace dgca {
namespace {

double Stuck(const RankHangView& v) { return v.phase.seconds(); }

// "rank 1 (node a)" / "ranks 0 (node a), 2 (node b)".
std::string Who(const std::vector<const RankHangView*>& g) {
  std::string out = g.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < g.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", g[i]->rank, " (node ", g[i]->node, ")");
  }
  return out;
}

std::tuple<int64_t, int, int> Place(const RankHangView* v) {
  return {v->phase.step(), static_cast<int>(v->phase.kind()), v->phase.index()};
}

}  // namespace

double SilentAfterSeconds(double interval) {
  if (!(interval > 0)) interval = 2;
  return std::max(2.5 * interval, interval + 3);
}

namespace {

// DescribeHang without its "(no progress within ...)" tail.
std::string HangBody(const std::vector<RankHangView>& views, double timeout_s) {
  std::vector<const RankHangView*> known, unknown;
  for (const RankHangView& v : views) (v.has_phase ? known : unknown).push_back(&v);
  if (known.empty() || !(timeout_s > 0)) return "";
  std::sort(known.begin(), known.end(),
            [](const RankHangView* a, const RankHangView* b) { return a->rank < b->rank; });

  // Whom to blame (hang_check.h).
  std::vector<const RankHangView*> blamed;
  bool same_collective = false;
  for (const RankHangView* v : known) {
    if (v->silent) blamed.push_back(v);
  }
  if (blamed.empty()) {
    for (const RankHangView* v : known) {
      if (!RankPhaseWaits(v->phase.kind())) blamed.push_back(v);
    }
    if (!blamed.empty()) {
      // Only those stuck about as long as the longest: a rank that moved
      // on a moment ago is not the one the others wait for.
      double worst = 0;
      for (const RankHangView* v : blamed) worst = std::max(worst, Stuck(*v));
      blamed.erase(std::remove_if(blamed.begin(), blamed.end(),
                                  [&](const RankHangView* v) { return Stuck(*v) < 0.5 * worst; }),
                   blamed.end());
    }
  }
  // Every rank that reported waits in a collective while some have not
  // reported at all: those are the ones waited for (not started yet).
  const bool blame_unknown = blamed.empty() && !unknown.empty();
  if (blamed.empty() && !blame_unknown) {
    auto behind = Place(known[0]);
    for (const RankHangView* v : known) behind = std::min(behind, Place(v));
    for (const RankHangView* v : known) {
      if (Place(v) == behind) blamed.push_back(v);
    }
    same_collective = blamed.size() == known.size();
  }

  double worst_blamed = 0, worst_any = 0;
  for (const RankHangView* v : blamed) worst_blamed = std::max(worst_blamed, Stuck(*v));
  for (const RankHangView* v : known) worst_any = std::max(worst_any, Stuck(*v));
  if (blame_unknown) worst_blamed = worst_any;
  if (worst_blamed < timeout_s && worst_any < 2 * timeout_s) return "";

  std::string msg;
  if (blame_unknown) {
    for (const RankHangView* v : unknown) {
      if (!msg.empty()) msg += "; ";
      absl::StrAppend(&msg, Who({v}), " has reported no phase (last heard from ",
                      FormatPhaseSeconds(v->heartbeat_age_s), " ago)");
    }
  } else if (same_collective) {
    absl::StrAppend(&msg, Who(blamed), " stuck ", FormatPhaseSeconds(worst_blamed), " ",
                    RankPhaseDescription(blamed[0]->phase),
                    blamed.size() > 1
                        ? ": every rank is in it, so the collective itself does not complete"
                        : "");
  } else {
    for (const RankHangView* v : blamed) {
      if (!msg.empty()) msg += "; ";
      if (v->silent && v->finished_step > 0) {
        absl::StrAppend(&msg, Who({v}), " stuck: no heartbeat for ",
                        FormatPhaseSeconds(v->heartbeat_age_s), ", last heard of when it finished "
                        "step ", v->finished_step, " (no progress for ",
                        FormatPhaseSeconds(Stuck(*v)), "; its last heartbeat said it was ",
                        RankPhaseDescription(v->phase), ")");
      } else if (v->silent) {
        absl::StrAppend(&msg, Who({v}), " stuck: no heartbeat for ",
                        FormatPhaseSeconds(v->heartbeat_age_s), ", last ",
                        RankPhaseDescription(v->phase), " (no progress for ",
                        FormatPhaseSeconds(Stuck(*v)), ")");
      } else {
        absl::StrAppend(&msg, Who({v}), " stuck ", FormatPhaseSeconds(Stuck(*v)), " ",
                        RankPhaseDescription(v->phase));
      }
    }
  }

  // The others, grouped by where they are, in rank order.
  std::vector<std::vector<const RankHangView*>> groups;
  for (const RankHangView* v : known) {
    if (std::find(blamed.begin(), blamed.end(), v) != blamed.end()) continue;
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& grp) {
      return RankPhaseSamePlace(grp[0]->phase, v->phase);
    });
    if (g == groups.end()) {
      groups.push_back({v});
    } else {
      g->push_back(v);
    }
  }
  for (const auto& g : groups) {
    double secs = 0;
    for (const RankHangView* v : g) secs = std::max(secs, Stuck(*v));
    const v1::RankPhase& p = g[0]->phase;
    absl::StrAppend(&msg, msg.empty() ? "" : "; ", Who(g));
    if (RankPhaseWaits(p.kind()) && !blamed.empty() && RankPhaseSamePlace(p, blamed[0]->phase)) {
      absl::StrAppend(&msg, " waiting in the same ", RankPhaseKindName(p.kind()), " (",
                      FormatPhaseSeconds(secs), ")");
    } else if (RankPhaseWaits(p.kind())) {
      absl::StrAppend(&msg, " waiting ", FormatPhaseSeconds(secs), " ", RankPhaseDescription(p));
    } else {
      absl::StrAppend(&msg, " ", FormatPhaseSeconds(secs), " ", RankPhaseDescription(p));
    }
  }
  for (const RankHangView* v : blame_unknown ? std::vector<const RankHangView*>() : unknown) {
    absl::StrAppend(&msg, "; ", Who({v}), " has reported no phase (last heard from ",
                    FormatPhaseSeconds(v->heartbeat_age_s), " ago)");
  }
  return msg;
}

}  // namespace

std::string DescribeHang(const std::vector<RankHangView>& views, double timeout_s) {
  std::string msg = HangBody(views, timeout_s);
  if (msg.empty()) return msg;
  absl::StrAppend(&msg, " (no progress within train.progress_timeout_s, ",
                  absl::StrFormat("%g", timeout_s), " s)");
  return msg;
}

std::string HangContextOf(const JobRt& rt, Clock::TimePoint now) {
  const std::string body = HangBody(HangViewsOf(rt, now), kHangContextSeconds);
  return body.empty() ? "" : absl::StrCat("; meanwhile ", body);
}

std::vector<RankHangView> HangViewsOf(const JobRt& rt, Clock::TimePoint now) {
  std::vector<RankHangView> out;
  for (size_t r = 0; r < rt.ranks.size(); ++r) {
    const RankRt& rr = rt.ranks[r];
    if (rr.exited) continue;
    RankHangView v;
    v.rank = static_cast<int>(r);
    v.node = rr.node;
    v.heartbeat_age_s = std::max(0.0, SecondsBetween(rr.last_progress, now));
    if (rr.phase.kind() != v1::RANK_PHASE_UNSPECIFIED) {
      v.has_phase = true;
      v.phase = rr.phase;
      const double since = std::max(0.0, SecondsBetween(rr.phase_at, now));
      v.phase.set_seconds(rr.phase.seconds() + since);
      v.heartbeat_age_s = since;
      v.silent = since > SilentAfterSeconds(rr.heartbeat_interval_s);
      if (v.silent && rr.last_step_at > rr.phase_at && rr.progress.step() >= rr.phase.step()) {
        // It finished steps after that report: its last news is the step.
        v.finished_step = rr.progress.step();
        v.phase.set_seconds(std::max(0.0, SecondsBetween(rr.last_step_at, now)));
      }
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::string ProgressStallOf(const JobRt& rt, Clock::TimePoint now, double timeout_s) {
  if (!(timeout_s > 0)) return "";
  return DescribeHang(HangViewsOf(rt, now), timeout_s);
}

std::string LastPhaseOf(const JobRt& rt, size_t r, Clock::TimePoint now) {
  if (r >= rt.ranks.size()) return "";
  const RankRt& rr = rt.ranks[r];
  if (rr.phase.kind() == v1::RANK_PHASE_UNSPECIFIED) return "";
  v1::RankPhase p = rr.phase;
  p.set_seconds(p.seconds() + std::max(0.0, SecondsBetween(rr.phase_at, now)));
  return absl::StrCat(", last ", RankPhaseDescription(p), " (no progress for ",
                      FormatPhaseSeconds(p.seconds()), ")");
}

}  // namespace dgca
