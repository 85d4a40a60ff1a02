// The planner's fits of measurements to its models (least squares):
//   the all-reduce line   t = latency + bytes * f / busbw
//   the step-time line    c(m) = a + b m
//   the memory line       bytes(m) = fixed + per_sample * m
// Each returns what it fitted and, where the plan cites it, how. Pure
// functions; safe from any thread.
#ifndef DGCA_PLANNER_FITS_H_
#define DGCA_PLANNER_FITS_H_

#include <string>
#include <utility>
#include <vector>

#include "model/core/memory_model.h"
#include "planner/measurements.h"

namespace dgca {

// t = latency + x / busbw with x = bytes * 2(n-1)/n, least squares over
// (bytes, seconds) points. ok only when the fitted slope is positive;
// a negative intercept is clamped to a latency of 0.
struct AllReduceLine {
  bool ok = false;
  double busbw = 0;    // bytes/s
  double latency = 0;  // s
};
AllReduceLine FitAllReduceLine(const std::vector<std::pair<double, double>>& points, int n);

// c(m) = fixed + per_sample * m from meas.step_points (distinct
// micro-batches, the first point of each m: callers list the newest
// first), else from step_seconds / step_micro_batch:
//  - one point: per_sample = c / m, fixed = 0;
//  - two or more: least squares; when that gives a < 0 or b <= 0, a line
//    through the origin (b = sum(m c) / sum(m^2)) so a noisy pair cannot
//    predict negative times.
// per_sample == 0 when there is nothing to fit. `why` is the arithmetic
// ("c(m) = 1.2 ms + 3.4 ms x m, least squares over c(8) = ..., (source)").
struct StepTimeFit {
  double fixed = 0;       // a, seconds per micro-step independent of m
  double per_sample = 0;  // b, seconds per sample
  std::string why;
};
StepTimeFit FitStepTime(const PlannerMeasurements& meas);

// Earlier jobs' peaks `points` (micro-batch, bytes with the CUDA context
// `ctx`), from `source`: `est` with the line through them. One point's
// excess over the model at its micro-batch m1 includes fixed overheads (a
// CPU rank's runtime and loader, NCCL's buffers) as well as any activations
// the model misses, so the slope is the larger of the model's and the
// measured per sample when the point fits `budget` (0 = unknown; larger
// micro-batches are predicted high), the smaller when it does not (smaller
// ones are predicted high too); the rest is fixed. Two or more micro-batches
// measure the slope itself (least squares, never below the model's); the
// fixed part then puts the line on or above every point. Returns whether a
// point was usable (else `est` is unchanged); *why says how.
bool FitMemoryLine(const std::vector<std::pair<int, double>>& points, const std::string& source,
                   double ctx, double budget, MemoryEstimate* est, std::string* why);

}  // namespace dgca

#endif  // DGCA_PLANNER_FITS_H_
