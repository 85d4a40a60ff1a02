// Communicator: the collective operations the data-parallel trainer needs.
//
// Implementations: LocalCommunicator (world size 1, no-ops; here), Gloo (CPU,
// TCP transport; model/comm/gloo_communicator.h, built outside
// DGCA_MODEL_ONLY), NCCL (GPU). The trainer never moves gradients itself: it
// hands buckets to a Communicator.
//
// Thread-safety: one Communicator belongs to one rank. Async operations may
// run on an internal thread; Start*/Wait may be called from the training
// thread only. Operations complete in the order they were started.
#ifndef DGCA_MODEL_COMM_COMMUNICATOR_H_
#define DGCA_MODEL_COMM_COMMUNICATOR_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model/core/status.h"

namespace dgca {

enum class ReduceOp { kSum, kAverage };

// Handle of an asynchronous collective. Wait() blocks until it completes (or
// the communicator's timeout expires, giving DEADLINE_EXCEEDED / UNAVAILABLE
// naming the peer that was lost where known).
class CollectiveHandle {
 public:
  virtual ~CollectiveHandle() = default;
  virtual Status Wait() = 0;
  // Wall-clock times (steady clock, seconds since the communicator was made)
  // when the operation actually started and finished running; for overlap
  // accounting. Valid after Wait() returned OK.
  virtual double start_time() const = 0;
  virtual double end_time() const = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "local", "gloo", "nccl"

  // In-place all-reduce of `count` floats at `data` (host memory for Gloo,
  // device memory for NCCL). `data` must stay valid until Wait() returns.
  virtual StatusOr<std::unique_ptr<CollectiveHandle>> StartAllReduce(
      float* data, size_t count, ReduceOp op) = 0;

  // Synchronous helpers built on the primitives.
  Status AllReduce(float* data, size_t count, ReduceOp op) {
    auto h = StartAllReduce(data, count, op);
    if (!h.ok()) return h.status();
    return (*h)->Wait();
  }
  // Broadcast `count` floats from `root` to every rank, in place.
  virtual Status Broadcast(float* data, size_t count, int root) = 0;
  virtual Status Barrier() = 0;

  // Seconds since construction on the steady clock: the time base of
  // CollectiveHandle::start_time/end_time.
  virtual double Now() const = 0;
};

// World of one: every collective is a no-op that completes at once.
std::unique_ptr<Communicator> MakeLocalCommunicator();

// Leaves `comm` to the process exit instead of destroying it, for a rank
// that stopped or failed while its peers may be inside a collective it will
// never join: destroying it would run the teardown barrier with those peers
// and only wait out the timeout. At exit the OS closes its sockets: Gloo
// peers fail at once ("connection closed by peer"); NCCL peers on one
// machine (shared memory, P2P) get no such signal and fail when their
// collective times out (NcclOptions::timeout). It is kept in a
// process-lifetime list, so it stays reachable and leak checkers (ASan's
// LeakSanitizer, tools/sanitize.sh) do not count it. Thread-safe.
void AbandonUntilExit(std::unique_ptr<Communicator> comm);

}  // namespace dgca

#endif  // DGCA_MODEL_COMM_COMMUNICATOR_H_
