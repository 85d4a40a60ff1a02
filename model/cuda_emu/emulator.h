// The CUDA emulator: model/cuda's kernels, launches, streams, events,
// memory, cuBLASLt calls, CUB sorts and nvcuda::wmma tiles (include/mma.h:
// warp-collective, alignment and ldm checks) executed on the CPU, so the CUDA
// backend is exercised (against its CPU reference) on machines without a
// GPU. It is what nvcc's old "device emulation" mode was, plus the checks a
// GPU would not give you:
//
//   - Kernels: every block runs on the calling host thread, each CUDA thread
//     a fiber; __syncthreads and warp intrinsics (__shfl_*_sync, __any_sync,
//     __all_sync, __ballot_sync, __syncwarp) switch fibers. A barrier some
//     threads never reach, a shuffle whose mask names a lane that exited or
//     is not in the block, or a lane reading a non-participating lane is a
//     device fault naming the launch site, block and thread.
//   - Launch configuration is validated as the driver does (block <= 1024
//     threads, grid y/z <= 65535, dynamic shared memory <= 48 KiB, no empty
//     grid): cudaErrorInvalidConfiguration from cudaGetLastError.
//   - Kernel pointer arguments must be null, device memory or pinned host
//     memory (cudaMallocHost), as on a GPU.
//   - Memory: every allocation is its own mapping with an inaccessible page
//     after it (and before it); freed allocations stay inaccessible, so an
//     overrun or a use after free faults with the allocation named. Fresh
//     device, pinned and shared memory is filled with 0x7FC0 halves: NaN as
//     fp32/bf16/fp16/fp64, a huge int32 index. Device memory is inaccessible
//     to host code outside device work (DGCA_EMU_PROTECT=0 turns that off),
//     so host code dereferencing a device pointer faults, as on a GPU.
//   - Streams are lazy: work runs only when the host must see it
//     (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize,
//     a device-to-host cudaMemcpy, cudaFree, ...), in an order that respects
//     stream order, events, and the legacy default stream's implicit
//     synchronization with blocking streams, and nothing else. A missing
//     synchronization (reading pinned memory an async copy has not filled,
//     reusing a staging buffer a pending copy still reads, a non-blocking
//     stream racing the legacy stream) gives stale data instead of passing
//     by luck. Pageable host-to-device copies are staged at the call, as
//     the CUDA documentation says ("API synchronization behavior").
//   - Scheduling order inside a block: DGCA_EMU_ORDER=forward (default),
//     reverse or alternate, so a missing __syncthreads that one order hides
//     shows in another.
//   - CUDA graphs: stream capture records the work instead of running it,
//     cudaGraphLaunch replays it; what CUDA forbids during capture
//     (synchronizing, a legacy-stream operation) invalidates the capture.
//   - NCCL (nccl.cc): communicators between rank PROCESSES of one machine
//     over /dev/shm, collectives as stream work that becomes ready when
//     every rank's deposit is there, so the multi-rank GPU path (rank
//     processes, NCCL all-reduce of device gradients, broadcast, barrier,
//     a lost peer, ranks issuing different collectives) runs without GPUs.
//     DGCA_EMU_DEVICES=N (default 1) is the number of devices
//     cudaGetDeviceCount reports, so N ranks can each take their own.
//     DGCA_EMU_NCCL_ABORT_HANG_MS=N makes ncclCommAbort take N ms first
//     (real NCCL's abort has hung joining its proxy thread), so the
//     communicator's bound on it (NcclOptions::abort_limit) is tested.
//   - Device memory: 80 GiB, or DGCA_EMU_DEVICE_MEMORY bytes (read at every
//     cudaMalloc and cudaMemGetInfo), past which cudaMalloc fails with
//     cudaErrorMemoryAllocation, so out-of-memory paths can be tested.
//
// What it does not model: performance, registers (a kernel over its
// block's register budget fails only on a GPU; ctest cuda_kernel_resources
// checks the real build's ptxas report instead), the memory model of concurrent
// threads (a fiber runs until it blocks: races between __syncthreads are
// only exposed by the scheduling order), real cuBLASLt algorithm
// availability (its heuristic always returns one algorithm, unless
// DGCA_EMU_CUBLASLT_REFUSE=heuristic|matmul makes it, or cublasLtMatmul,
// answer NOT_SUPPORTED as real cuBLASLt does for a shape it has no
// algorithm for: GemmRunner's fallback is tested so), NCCL's
// transports, algorithms and data types other than float.
//
// Built as the library dgca_model_cuda_emu from the same sources as
// dgca_model_cuda: model/cuda/*.cu are rewritten at build time
// (rewrite_launches.cmake: `k<<<g, b, s, st>>>(args)` becomes
// `k | LaunchAt(file, line, g, b, s, st) | Args(args)`) and compiled by the
// host compiler with device.h force-included. Programs linking it must not
// link libcudart or libcublasLt: it defines their entry points.
//
// Thread-safety: the runtime entry points take one global lock; device work
// runs on whichever host thread made it due.
#ifndef DGCA_MODEL_CUDA_EMU_EMULATOR_H_
#define DGCA_MODEL_CUDA_EMU_EMULATOR_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dgca {
namespace cuda {
namespace emu {

// ------------------------------------------------------------------ memory
enum class MemKind { kDevice, kPinnedHost };

struct AllocationInfo {
  uintptr_t begin = 0;
  size_t size = 0;
  MemKind kind = MemKind::kDevice;
};

// The live allocation containing [p, p + bytes), if any.
bool FindAllocation(const void* p, size_t bytes, AllocationInfo* info);
// True for null, device memory and pinned host memory: what a kernel may
// dereference.
bool DeviceAccessible(const void* p);

// ------------------------------------------------------------------ work
// Device work: runs later (see the header comment), in stream order.
using Work = std::function<void()>;

// Enqueues `work` on `stream` (0 = the legacy default stream). `what`
// names it in fault messages. Returns the sticky error if the device has
// faulted, else cudaSuccess.
cudaError_t Enqueue(cudaStream_t stream, std::string what, Work work);

// Enqueues `work` that may run only once `ready(&failure)` returns true: a
// collective waiting for its peers (the emulated NCCL). `ready` is called
// repeatedly, also while the host waits for other streams (as a GPU starts
// a collective on its own once its inputs are done), so its first call may
// do the work's side effect towards the peers (deposit this rank's data).
// It returns false with `failure` empty while waiting, and false with
// `failure` set once the work can never complete (a lost peer, ranks that
// disagree): like a GPU's hung collective kernel, cudaStreamQuery and
// cudaEventQuery then answer cudaErrorNotReady until the owner releases it
// (ncclCommAbort makes `ready` true); a blocking synchronization, which
// would hang on a GPU, is a device fault quoting `failure`. A collective
// still waiting after DGCA_EMU_COLLECTIVE_TIMEOUT_S (default 300 s) of a
// blocking synchronization is a device fault too. Progress needs this
// process's host thread inside a CUDA call (a GPU would go on without it).
using ReadyFn = std::function<bool(std::string* failure)>;
cudaError_t EnqueueWhenReady(cudaStream_t stream, std::string what, ReadyFn ready, Work work);

// The emulated NCCL's transport directory for the ncclUniqueId at
// `unique_id` (/dev/shm/dgca-emu-nccl-<hex>), or "" when the id was not
// made by the emulated ncclGetUniqueId. Tests use it to check cleanup.
std::string NcclTransportDir(const void* unique_id);

// Runs every pending piece of work enqueued on `stream` so far (with what
// it depends on).
cudaError_t SyncStream(cudaStream_t stream);
// cudaStreamQuery: the same, but cudaErrorNotReady at work that is not ready.
cudaError_t QueryStream(cudaStream_t stream);

// Called from running device work: records a sticky fault (as a GPU's
// illegal address or launch failure: every later call returns it) and
// prints `message` to stderr. Work already queued is dropped.
void DeviceFault(cudaError_t code, const std::string& message);

// Reports an error from an API call the way the runtime does: the last
// error (cleared by cudaGetLastError) is set; returns `code`.
cudaError_t ApiError(cudaError_t code, const std::string& message);

// ------------------------------------------------------------------ kernels
struct LaunchSite {
  const char* file = "";
  int line = 0;
};

struct LaunchConfig {
  LaunchSite site;
  dim3 grid;
  dim3 block;
  size_t dynamic_shared_bytes = 0;
  cudaStream_t stream = nullptr;
};

// Validates the configuration (cudaErrorInvalidConfiguration, with the
// message on stderr, as the last error: not sticky, nothing runs) and
// enqueues a grid whose every thread runs `body`. `pointer_args` are the
// kernel's pointer arguments (index, value), checked with DeviceAccessible:
// a pageable host pointer or a freed one is the sticky fault the kernel
// would raise on a GPU (cudaErrorIllegalAddress), reported at the launch
// with the argument named.
cudaError_t LaunchKernel(const LaunchConfig& config, const std::vector<std::pair<int, const void*>>& pointer_args,
                         std::function<void()> body);

// Inside a running kernel: the calling CUDA thread's coordinates.
struct ThreadCoords {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
const ThreadCoords& Coords();

// Synchronization points of the current CUDA thread (fiber).
void SyncThreads(const char* file, int line);
enum class WarpOp { kSync, kShflIdx, kShflUp, kShflDown, kShflXor, kAny, kAll, kBallot };
// Deposits `value` (shuffles: the 64-bit pattern of the value; votes: the
// predicate) and `arg` (source lane, delta or lane mask), waits for every
// lane of `mask`, and returns the shuffled value or the vote.
uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file,
                        int line);
// The current launch's dynamic shared memory (extern __shared__).
void* DynamicSharedMemory();

// The fiber stack size (bytes) of an emulated CUDA thread.
constexpr size_t kFiberStackBytes = size_t{256} << 10;

}  // namespace emu
}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_EMU_EMULATOR_H_
