// The cost model: one optimizer step of n data-parallel ranks, per rank,
// in seconds and bytes.
//
//   c(m)      = a + b m                 forward+backward(+optimizer) of a
//               micro-batch of m samples on one rank (planner/fits.h
//               FitStepTime; unknown while nothing was measured)
//   G         = 4 * parameters          fp32 gradient bytes (the
//               communicators all-reduce floats)
//   C         = sum over the nb = ceil(G/S) buckets of t(bucket)
//               (planner/link_model.h AllReduceSeconds) + skew * c(m)
//   B_w       = 2/3 * c(m)              backward of the last micro-step:
//               only it can hide communication (there is no all-reduce on
//               accumulation micro-steps)
//   exposed   = max(C/nb, C - B_w * (1 - 1/nb))   the first bucket is ready
//               after 1/nb of backward, the last one only when backward
//               ends; exposed = C when no core is free to progress the
//               collectives (CPU ranks using every core)
//   step(k)   = k * c(m) + exposed      one optimizer step
//   samples/s = n * m * k / step(k);    comm share = exposed / step(k)
//
// Pure functions; safe from any thread.
#ifndef DGCA_PLANNER_COST_MODEL_H_
#define DGCA_PLANNER_COST_MODEL_H_

#include <string>
#include <utility>
#include <vector>

#include "planner/link_model.h"

namespace dgca {

// The planner's target for exposed communication: at most this share of the
// optimizer step (docs/planner.md, "Accumulation").
inline constexpr double kTargetCommShare = 0.10;
// The share of a micro-step that is backward (forward : backward = 1 : 2).
inline constexpr double kBackwardShare = 2.0 / 3.0;
// A bucket size gives at least this many buckets to overlap with backward.
inline constexpr int kMinBuckets = 4;
// The bucket when communication hides easily: PyTorch DDP's default.
inline constexpr double kFastLinkBucketBytes = 25.0 * 1024 * 1024;

// Everything the predictions need for one candidate rank count.
struct CostInputs {
  double per_sample = 0;    // b: seconds per sample per rank (0 = unknown)
  double fixed = 0;         // a: seconds per micro-step independent of m
  double skew = 0;          // in-job extra all-reduce time per second of c(m)
  bool can_overlap = true;  // false: CPU ranks use every core, Gloo cannot progress
  double grad_bytes = 0;    // G
  int max_micro = 0;        // the largest micro-batch memory allows (0 = unknown)
  int global = 0;           // global batch
};

struct Prediction {
  int n = 1, m = 1, k = 1;
  double bucket = 0;
  double compute = 0, comm = 0, overlap = 0, exposed = 0, step = 0;
  double comm_probe = 0;  // comm without the learned peer wait
  double buckets = 1;     // nb
  double sps = 0, share = 0;
  bool known = false;     // c(m) known: compute, exposed, step, sps, share set
};

// The step of n ranks at micro-batch m, accumulation k, S = `bucket` bytes.
// comm (and comm_probe) are set whenever the link is known, the rest only
// when c(m) is (in.per_sample > 0).
Prediction Predict(int n, int m, int k, double bucket, const CostInputs& in,
                   const LinkModel& link);

// Feasible (m, k) with n*m*k == global (the per-rank batch divisible by k)
// and m <= in.max_micro when known, by ascending k; at most 64.
std::vector<std::pair<int, int>> Splits(int n, const CostInputs& in);

// The smallest k at p's micro-batch whose comm share is <= kTargetCommShare:
// share <= s <=> exposed <= s/(1-s) k c <=> k >= exposed (1-s) / (s c).
// p must be known; 1e9 when c is 0.
int AccumulationForTarget(const Prediction& p);

// The gradient bucket size S for n ranks at the prediction `at`:
//  - the all-reduce of all gradients < 10% of backward: communication hides
//    easily, min(G/kMinBuckets, 25 MiB);
//  - otherwise G/kMinBuckets, the largest that still gives kMinBuckets
//    buckets to overlap;
//  - never below 9 * latency * busbw / f (latency <= 10% of t(S)), nor
//    below 1 MiB, nor above max(G, 1 MiB).
// *why is the arithmetic.
double BucketFor(int n, const Prediction& at, const LinkModel& link, double grad_bytes,
                 std::string* why);

}  // namespace dgca

#endif  // DGCA_PLANNER_COST_MODEL_H_
