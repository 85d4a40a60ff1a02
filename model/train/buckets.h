// GradientBuckets: data-parallel gradient averaging over a ParamStore's flat
// gradient buffer, in buckets that overlap with backward.
//
// Buckets walk the parameters in reverse declaration order (the order
// backward produces gradients). Each bucket is a contiguous slice of the flat
// buffer holding whole tensors, at most bucket_mb (a single tensor larger than
// that gets a bucket of its own). A bucket's all-reduce (average) starts as
// soon as its first tensor's gradient is complete (OnGradReady), so it runs
// on the communicator's thread while backward computes earlier layers.
//
// Use per optimizer step:
//   BeginStep(enabled)   enabled = this is the micro-step whose gradients are
//                        final (the last of an accumulation cycle);
//   model.ForwardBackward(..., enabled && overlap ? OnGradReady-callback : {});
//   MarkBackwardEnd()    (optional; records the time for overlap accounting);
//   WaitAll()            starts whatever has not started, waits for all.
//
// Thread-safety: not thread-safe; the training thread only.
#ifndef DGCA_MODEL_TRAIN_BUCKETS_H_
#define DGCA_MODEL_TRAIN_BUCKETS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "model/comm/communicator.h"
#include "model/core/status.h"
#include "model/nn/params.h"
#include "model/train/train_phase.h"

namespace dgca {

struct Bucket {
  int first_param = 0;   // tensors [first_param, end_param) of the ParamStore
  int end_param = 0;
  int64_t offset = 0;    // floats into the flat gradient buffer
  int64_t numel = 0;
};

// Partitions `params` into buckets of at most bucket_mb megabytes (1 MB =
// 2^20 bytes), in reverse declaration order: buckets[0] holds the last tensors.
std::vector<Bucket> PlanBuckets(const ParamStore& params, double bucket_mb);

struct BucketEvent {
  int bucket = 0;
  double start = 0;  // Communicator::Now() base, when the op ran
  double end = 0;
  double issued = 0; // when the training thread handed it to the communicator
};

struct CommStats {
  double allreduce_seconds = 0;   // sum of op durations (start..end)
  double exposed_seconds = 0;     // time the training thread blocked in WaitAll
  int64_t bytes = 0;              // gradient bytes all-reduced this step
  double bus_bandwidth = 0;       // bytes/s: bytes / allreduce_seconds * 2(n-1)/n
  double backward_end = -1;       // Now() at MarkBackwardEnd (-1: not marked)
  std::vector<BucketEvent> events;
};

class GradientBuckets {
 public:
  // `comm` and `params` must outlive this object; comm may be a world of one
  // (then nothing is communicated and WaitAll returns zeros). `grad_buffer`
  // is the flat gradient buffer in params' layout that the communicator
  // reduces (a GPU's, model/train/train_device.h); null = params->grads().
  GradientBuckets(Communicator* comm, ParamStore* params, double bucket_mb,
                  float* grad_buffer = nullptr);

  const std::vector<Bucket>& buckets() const { return buckets_; }

  void BeginStep(bool enabled);
  // Gradients of parameters [first_complete_param, size) are final: starts
  // every bucket entirely inside that range that has not started. No-op when
  // not enabled. Errors are kept and returned by WaitAll.
  void OnGradReady(int first_complete_param);
  void MarkBackwardEnd();
  // Starts the remaining buckets (when enabled) and waits for all of them.
  // With `phases`, each wait is recorded as all-reduce k/K of optimizer step
  // `step` with the bucket's bytes (k = the bucket waited for, 1-based).
  StatusOr<CommStats> WaitAll(PhaseTracker* phases = nullptr, int64_t step = 0);

 private:
  void StartBucket(int b);

  Communicator* comm_;
  float* grads_;
  std::vector<Bucket> buckets_;
  bool enabled_ = false;
  int next_ = 0;  // buckets_[0..next_) started this step
  std::vector<std::unique_ptr<CollectiveHandle>> handles_;
  std::vector<double> issued_;
  Status error_;
  double backward_end_ = -1;
};

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_BUCKETS_H_
