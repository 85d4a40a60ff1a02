#include "model/train/train_phase.h"

namespace dgca {

const char* TrainPhaseName(TrainPhase p) {
  switch (p) {
    case TrainPhase::kUnknown: return "unknown";
    case TrainPhase::kStarting: return "starting";
    case TrainPhase::kRendezvous: return "rendezvous";
    case TrainPhase::kBroadcast: return "broadcast";
    case TrainPhase::kData: return "data";
    case TrainPhase::kForward: return "forward";
    case TrainPhase::kBackward: return "backward";
    case TrainPhase::kForwardBackward: return "forward/backward";
    case TrainPhase::kAllReduce: return "all-reduce";
    case TrainPhase::kOptimizer: return "optimizer";
    case TrainPhase::kCheckpoint: return "checkpoint";
    case TrainPhase::kCheckpointBarrier: return "checkpoint barrier";
    case TrainPhase::kEval: return "eval";
    case TrainPhase::kFinishing: return "finishing";
  }
  return "unknown";
}

bool TrainPhaseWaits(TrainPhase p) {
  return p == TrainPhase::kRendezvous || p == TrainPhase::kBroadcast ||
         p == TrainPhase::kAllReduce || p == TrainPhase::kCheckpointBarrier ||
         p == TrainPhase::kFinishing;
}

PhaseTracker::PhaseTracker() { since_.store(Ticks(Clock::now()), std::memory_order_relaxed); }

// A seqlock write: seq odd while the fields change, even (and one further)
// after. Readers that saw an odd or changed seq read again.
void PhaseTracker::Enter(TrainPhase phase, int64_t step, int32_t index, int32_t count,
                         int64_t bytes) {
  const int64_t now = Ticks(Clock::now());
  const uint64_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  phase_.store(static_cast<int32_t>(phase), std::memory_order_relaxed);
  step_.store(step, std::memory_order_relaxed);
  index_.store(index, std::memory_order_relaxed);
  count_.store(count, std::memory_order_relaxed);
  bytes_.store(bytes, std::memory_order_relaxed);
  since_.store(now, std::memory_order_relaxed);
  progress_.store(progress_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  seq_.store(s + 2, std::memory_order_release);
}

void PhaseTracker::Progress(int32_t index) {
  const int64_t now = Ticks(Clock::now());
  const uint64_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  index_.store(index, std::memory_order_relaxed);
  since_.store(now, std::memory_order_relaxed);
  progress_.store(progress_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  seq_.store(s + 2, std::memory_order_release);
}

PhaseSnapshot PhaseTracker::Read() const { return ReadAt(Clock::now()); }

PhaseSnapshot PhaseTracker::ReadAt(Clock::time_point now) const {
  PhaseSnapshot out;
  int64_t since = 0;
  // A write is a few stores: a reader that keeps meeting one is unlucky,
  // not waiting for a lock holder. After 100 tries it keeps the last read.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint64_t s1 = seq_.load(std::memory_order_acquire);
    out.phase = static_cast<TrainPhase>(phase_.load(std::memory_order_relaxed));
    out.step = step_.load(std::memory_order_relaxed);
    out.index = index_.load(std::memory_order_relaxed);
    out.count = count_.load(std::memory_order_relaxed);
    out.bytes = bytes_.load(std::memory_order_relaxed);
    since = since_.load(std::memory_order_relaxed);
    out.progress = progress_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint64_t s2 = seq_.load(std::memory_order_relaxed);
    if (s1 == s2 && (s1 & 1) == 0) break;
  }
  const double secs =
      std::chrono::duration<double>(now - Clock::time_point(Clock::duration(since))).count();
  out.seconds = secs > 0 ? secs : 0;
  return out;
}

}  // namespace dgca
