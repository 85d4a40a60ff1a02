#include "model/train/buckets.h"

#include <algorithm>

namespace dgca {

std::vector<Bucket> PlanBuckets(const ParamStore& params, double bucket_mb) {
  std::vector<Bucket> out;
  const int64_t cap = std::max<int64_t>(
      1, static_cast<int64_t>(bucket_mb * 1024.0 * 1024.0 / sizeof(float)));
  int i = params.size() - 1;
  while (i >= 0) {
    Bucket b;
    b.end_param = i + 1;
    int64_t n = 0;
    // Take tensors while they fit; always at least one.
    while (i >= 0 && (n == 0 || n + params.info(i).numel <= cap)) {
      n += params.info(i).numel;
      --i;
    }
    b.first_param = i + 1;
    b.offset = params.info(b.first_param).offset;
    // The slice from the first tensor to the end of the last, alignment
    // gaps included (ParamStore: they hold zeros).
    const ParamInfo& last = params.info(b.end_param - 1);
    b.numel = last.offset + last.numel - b.offset;
    out.push_back(b);
  }
  return out;
}

GradientBuckets::GradientBuckets(Communicator* comm, ParamStore* params, double bucket_mb,
                                 float* grad_buffer)
    : comm_(comm),
      grads_(grad_buffer != nullptr ? grad_buffer : params->grads()),
      buckets_(PlanBuckets(*params, bucket_mb)) {}

void GradientBuckets::BeginStep(bool enabled) {
  enabled_ = enabled && comm_ != nullptr && comm_->world_size() > 1;
  next_ = 0;
  handles_.clear();
  issued_.clear();
  error_ = OkStatus();
  backward_end_ = -1;
}

void GradientBuckets::StartBucket(int b) {
  const Bucket& bk = buckets_[b];
  issued_.push_back(comm_->Now());
  auto h = comm_->StartAllReduce(grads_ + bk.offset, static_cast<size_t>(bk.numel),
                                 ReduceOp::kAverage);
  if (!h.ok()) {
    if (error_.ok()) error_ = h.status();
    handles_.push_back(nullptr);
    return;
  }
  handles_.push_back(std::move(h).value());
}

void GradientBuckets::OnGradReady(int first_complete_param) {
  if (!enabled_) return;
  while (next_ < static_cast<int>(buckets_.size()) &&
         buckets_[next_].first_param >= first_complete_param) {
    StartBucket(next_++);
  }
}

void GradientBuckets::MarkBackwardEnd() {
  if (comm_ != nullptr) backward_end_ = comm_->Now();
}

StatusOr<CommStats> GradientBuckets::WaitAll(PhaseTracker* phases, int64_t step) {
  CommStats stats;
  stats.backward_end = backward_end_;
  if (!enabled_) return stats;
  const double t0 = comm_->Now();
  while (next_ < static_cast<int>(buckets_.size())) StartBucket(next_++);
  Status first = error_;
  for (size_t b = 0; b < handles_.size(); ++b) {
    if (!handles_[b]) continue;
    if (phases != nullptr) {
      phases->Enter(TrainPhase::kAllReduce, step, static_cast<int32_t>(b + 1),
                    static_cast<int32_t>(handles_.size()),
                    buckets_[b].numel * static_cast<int64_t>(sizeof(float)));
    }
    Status st = handles_[b]->Wait();
    if (!st.ok()) {
      if (first.ok()) first = st;
      continue;
    }
    BucketEvent ev;
    ev.bucket = static_cast<int>(b);
    ev.start = handles_[b]->start_time();
    ev.end = handles_[b]->end_time();
    ev.issued = issued_[b];
    stats.allreduce_seconds += ev.end - ev.start;
    stats.bytes += buckets_[b].numel * static_cast<int64_t>(sizeof(float));
    stats.events.push_back(ev);
  }
  stats.exposed_seconds = comm_->Now() - t0;
  handles_.clear();
  enabled_ = false;
  if (!first.ok()) return first;
  const int n = comm_->world_size();
  if (stats.allreduce_seconds > 0) {
    stats.bus_bandwidth = static_cast<double>(stats.bytes) / stats.allreduce_seconds *
                          2.0 * (n - 1) / n;
  }
  return stats;
}

}  // namespace dgca
