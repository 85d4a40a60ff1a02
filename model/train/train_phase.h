// TrainPhase and PhaseTracker: what a rank's training thread is doing right
// now and since when, for hang diagnosis (docs/operations.md, "Hangs").
//
// The training thread (Train(), the rank's main) calls Enter() at every
// phase change; another thread (the rank's heartbeat) calls Read() to send
// the current phase to the coordinator, which fails an attempt whose ranks
// stop advancing (train.progress_timeout_s) and names what each was doing.
//
// Cheap by design: Enter() is a handful of relaxed atomic stores and one
// steady-clock read, no lock and no allocation, so it may run per layer.
// Read() is a seqlock read: it retries while a write is under way and, in
// the unlikely case that the writer keeps it busy, returns what it last saw
// (every field is atomic: never torn, at worst a mix of two phases).
//
// Thread-safety: one writer thread (Enter/Progress), any number of readers.
#ifndef DGCA_MODEL_TRAIN_TRAIN_PHASE_H_
#define DGCA_MODEL_TRAIN_TRAIN_PHASE_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace dgca {

// In the order a rank goes through them. "Collective" phases (Waits()) are
// those where a rank waits for its peers: a rank stuck there is usually
// waiting for another one that is stuck elsewhere.
enum class TrainPhase : int32_t {
  kUnknown = 0,
  kStarting,          // before training: assignment, data, model, init
  kRendezvous,        // building the communicator with the other ranks (collective)
  kBroadcast,         // rank 0's weights to every rank (collective)
  kData,              // waiting for the loader's next micro-batch
  kForward,
  kBackward,
  kForwardBackward,   // a device that does not say where forward ends (GPU without overlap)
  kAllReduce,         // gradient all-reduce `index`/`count` of the step, `bytes` (collective)
  kOptimizer,         // clip + AdamW (+ the GPU's end-of-step sync)
  kCheckpoint,        // writing a checkpoint (rank 0)
  kCheckpointBarrier, // every rank waits for the checkpoint to be written (collective)
  kEval,              // evaluation batch `index`/`count`
  kFinishing,         // training done: the teardown barrier with the peers (collective)
};

// "all-reduce", "data", ... (the words of docs/operations.md).
const char* TrainPhaseName(TrainPhase p);
// True for the phases where a rank waits for its peers.
bool TrainPhaseWaits(TrainPhase p);

struct PhaseSnapshot {
  TrainPhase phase = TrainPhase::kUnknown;
  int64_t step = 0;        // 1-based optimizer step it belongs to; 0 = before the first
  int32_t index = 0;       // all-reduce bucket or eval batch, 1-based (0 = none)
  int32_t count = 0;       // of how many
  int64_t bytes = 0;       // the all-reduce's bytes
  double seconds = 0;      // since the last progress (Enter or Progress)
  int64_t progress = 0;    // counts every Enter and Progress: "advanced" = changed
};

class PhaseTracker {
 public:
  using Clock = std::chrono::steady_clock;

  PhaseTracker();
  // The training thread enters `phase` of optimizer step `step`.
  void Enter(TrainPhase phase, int64_t step, int32_t index = 0, int32_t count = 0,
             int64_t bytes = 0);
  // Progress within the current phase (an eval batch): the clock restarts,
  // the phase stays; `index` replaces the current one.
  void Progress(int32_t index);
  PhaseSnapshot Read() const;
  // For tests: Read() as of `now`.
  PhaseSnapshot ReadAt(Clock::time_point now) const;

 private:
  static int64_t Ticks(Clock::time_point t) { return t.time_since_epoch().count(); }

  std::atomic<uint64_t> seq_{0};  // odd while a write is under way
  std::atomic<int32_t> phase_{0};
  std::atomic<int64_t> step_{0};
  std::atomic<int32_t> index_{0};
  std::atomic<int32_t> count_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> since_{0};  // Clock ticks
  std::atomic<int64_t> progress_{0};
};

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_TRAIN_PHASE_H_
