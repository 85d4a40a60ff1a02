#include "coordinator/loss_curve.h"

#include <cmath>

namespace dgca {
namespace {
// Steps some ranks reached while others lag: more than this many open steps
// means a rank stopped reporting (it died; the job will restart); the
// oldest are dropped.
constexpr size_t kMaxPending = 64;
}  // namespace

void LossCurve::Add(int64_t step, int rank, double loss, int ranks) {
  if (ranks <= 0 || rank < 0 || rank >= ranks || step < 0 || !std::isfinite(loss)) return;
  if (!points_.empty() && step <= points_.back().step()) {
    // Restarted from an earlier checkpoint: the curve continues from here.
    while (!points_.empty() && points_.back().step() >= step) points_.pop_back();
    pending_.erase(pending_.lower_bound(step), pending_.end());
  }
  if (step % stride_ != 0) return;
  Pending& p = pending_[step];
  if (p.seen.size() != static_cast<size_t>(ranks)) p.seen.assign(ranks, false);
  if (p.seen[rank]) return;
  p.seen[rank] = true;
  p.sum += loss;
  if (++p.count < ranks) {
    while (pending_.size() > kMaxPending) pending_.erase(pending_.begin());
    return;
  }
  v1::LossPoint point;
  point.set_step(step);
  point.set_loss(p.sum / p.count);
  pending_.erase(pending_.begin(), pending_.upper_bound(step));
  points_.push_back(point);
  if (points_.size() > kMaxPoints) Thin();
}

void LossCurve::Thin() {
  stride_ *= 2;
  std::vector<v1::LossPoint> kept;
  for (const v1::LossPoint& p : points_)
    if (p.step() % stride_ == 0) kept.push_back(p);
  points_.swap(kept);
  for (auto it = pending_.begin(); it != pending_.end();)
    it = it->first % stride_ == 0 ? std::next(it) : pending_.erase(it);
}

void LossCurve::Restore(const google::protobuf::RepeatedPtrField<v1::LossPoint>& points) {
  points_.assign(points.begin(), points.end());
  pending_.clear();
  // The stride the points were recorded at: the smallest gap between them
  // (a power of two; anything else was not recorded here: start at 1).
  stride_ = 1;
  int64_t gap = 0;
  for (size_t i = 1; i < points_.size(); ++i) {
    const int64_t d = points_[i].step() - points_[i - 1].step();
    if (d > 0 && (gap == 0 || d < gap)) gap = d;
  }
  if (gap > 0 && (gap & (gap - 1)) == 0) stride_ = gap;
}

}  // namespace dgca
