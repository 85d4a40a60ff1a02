// NCCL communicator: GPU collectives over NCCL on the communicator's own CUDA
// stream, ordered against the caller's compute stream with events.
//
// StartAllReduce(data, count, op): records an event on the compute stream
// (NcclOptions::compute_stream; 0 = the legacy default stream), makes the
// communicator's stream wait on it (so the all-reduce sees every gradient the
// compute stream wrote before the call), launches ncclAllReduce (ncclAvg for
// kAverage) on the communicator's stream and records a completion event.
// Wait() polls the completion event and ncclCommGetAsyncError until done or
// the timeout: a collective that does not finish in time (a peer died) aborts
// the communicator (ncclCommAbort) and returns DEADLINE_EXCEEDED; an NCCL
// async error returns UNAVAILABLE with NCCL's message. The communicator is
// then broken: every later operation fails at once with the same error.
// start_time/end_time: host steady-clock times of the launch and of the
// moment Wait() saw the event complete, refined by cudaEventElapsedTime
// between the start and end events (end = start + GPU duration).
// Wait() does not make the compute stream wait for the result; callers that
// then use `data` on the compute stream are ordered by Wait()'s host sync.
//
// Bootstrap: rank 0 calls ncclGetUniqueId and Sets it under
// "<key_prefix>nccl/unique_id" in the injected KeyValueStore; the others Wait
// for it. ncclCommInitRankConfig runs non-blocking (config.blocking = 0) and
// is polled, so a peer that never joins gives DEADLINE_EXCEEDED within the
// timeout. The communicator stays non-blocking: every NCCL call that returns
// ncclInProgress is polled (ncclCommGetAsyncError) until enqueued before the
// completion event is recorded.
//
// Without a visible CUDA device MakeNcclCommunicator returns
// FAILED_PRECONDITION "no CUDA device visible (cudaGetDeviceCount: ...)".
// In a build without NCCL (DGCA_HAVE_NCCL unset) it returns UNIMPLEMENTED.
//
// Thread-safety: as Communicator: one (the training) thread.
#ifndef DGCA_MODEL_COMM_NCCL_COMMUNICATOR_H_
#define DGCA_MODEL_COMM_NCCL_COMMUNICATOR_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "model/comm/communicator.h"
#include "model/comm/kv_store.h"
#include "model/core/status.h"

namespace dgca {

struct NcclOptions {
  // Bound on the bootstrap (unique id exchange, comm init) and on every Wait.
  std::chrono::milliseconds timeout{60000};
  // CUDA device this rank uses; -1 = rank % device count.
  int device = -1;
  // The caller's compute stream (a cudaStream_t; void* so this header needs
  // no CUDA include). nullptr = the legacy default stream.
  void* compute_stream = nullptr;
  // Prefix of the store keys (e.g. per job attempt when the store is shared).
  std::string key_prefix = "dgca/";
  // How long an ncclCommAbort (after a failure or timeout) may take. NCCL's
  // abort joins its proxy thread, which has been reported to hang
  // (NVIDIA/nccl #863, #1777): it runs on a helper thread, and past this
  // the error is returned anyway, saying so, with the communicator left to
  // the process exit. <= 0: wait for the abort however long it takes.
  std::chrono::milliseconds abort_limit{10000};
  // Called (on the thread that saw the failure) when an abort did not
  // return within abort_limit, with the error about to be returned. The
  // process should end soon: NCCL kernels may still spin on the device, and
  // anything that waits for the device (cudaFree, a synchronize) would hang.
  // A program ends itself here (e.g. logs and calls _exit); empty: nothing.
  std::function<void(const Status&)> on_abort_hung;
};

// Number of visible CUDA devices, or FAILED_PRECONDITION "no CUDA device
// visible (cudaGetDeviceCount: <error>)" when none (UNIMPLEMENTED without NCCL).
StatusOr<int> NcclVisibleDevices();

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    std::shared_ptr<KeyValueStore> store, int rank, int world_size,
    const NcclOptions& options = NcclOptions());

// Device buffers for callers without their own CUDA code (the comm probe):
// cudaMalloc'ed floats on the communicator's device, freed by the deleter.
struct DeviceBufferDeleter {
  void operator()(float* p) const;
};
using DeviceBuffer = std::unique_ptr<float, DeviceBufferDeleter>;
StatusOr<DeviceBuffer> AllocateDeviceFloats(size_t count);
// Host <-> device copies (synchronous), for tests and checks.
Status CopyToDevice(float* device, const float* host, size_t count);
Status CopyToHost(float* host, const float* device, size_t count);

}  // namespace dgca

#endif  // DGCA_MODEL_COMM_NCCL_COMMUNICATOR_H_
