// LossCurve: a job's loss over its steps, kept small enough to travel with
// every GetJob: the mean over the ranks at a step (each rank's StepMetrics
// carries the loss of its micro-batches; their mean is the global batch's),
// recorded once every rank has reported that step, at most kMaxPoints
// points. It records every stride-th step; when a point would exceed
// kMaxPoints the stride doubles and every other point goes, so the curve
// always covers the whole run at one even stride.
//
// A step at or before the last recorded one (the job restarted from an
// earlier checkpoint) drops the points from that step on: the curve is the
// run that reached the current step.
//
// Thread-safety: a value; the scheduler holds its lock around every call.
#ifndef DGCA_COORDINATOR_LOSS_CURVE_H_
#define DGCA_COORDINATOR_LOSS_CURVE_H_

#include <cstdint>
#include <map>
#include <vector>

#include "dgca/v1/job.pb.h"

namespace dgca {

class LossCurve {
 public:
  static constexpr size_t kMaxPoints = 200;

  // `rank`'s loss at `step` of a job of `ranks` ranks. Non-finite losses
  // and bad ranks are ignored.
  void Add(int64_t step, int rank, double loss, int ranks);
  // Points stored earlier (a restarted coordinator); the stride is their
  // smallest gap (1 when there is none or it is not a power of two).
  void Restore(const google::protobuf::RepeatedPtrField<v1::LossPoint>& points);

  const std::vector<v1::LossPoint>& points() const { return points_; }
  int64_t stride() const { return stride_; }

 private:
  struct Pending {
    double sum = 0;
    std::vector<bool> seen;  // by rank: a rank counts once per step
    int count = 0;
  };
  void Thin();

  std::vector<v1::LossPoint> points_;
  std::map<int64_t, Pending> pending_;  // steps some ranks have reported
  int64_t stride_ = 1;
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_LOSS_CURVE_H_
