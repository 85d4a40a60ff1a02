// Pieces the CUDA emulator's files share (emulator.h is the public side).
// Not thread-safe by themselves: callers hold Lock().
#ifndef DGCA_MODEL_CUDA_EMU_INTERNAL_H_
#define DGCA_MODEL_CUDA_EMU_INTERNAL_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "model/cuda_emu/emulator.h"

namespace dgca {
namespace cuda {
namespace emu {
namespace internal {

// The one lock of the emulated device (recursive: device work may call
// back into the runtime, e.g. a kernel fault).
std::recursive_mutex& Lock();

// ---------------------------------------------------------------- memory
// A mapping with inaccessible pages around it, filled with the poison
// pattern. Null when the address space is exhausted.
void* Allocate(size_t bytes, MemKind kind);
// Unmaps (keeps the range inaccessible). False if `p` is not the start of a
// live allocation of `kind`; *overrun (may be null) gets a description when
// bytes after the allocation's end were written.
bool Free(void* p, MemKind kind, std::string* overrun);
size_t BytesInUse(MemKind kind);
// Fills with the 16-bit pattern 0x7FC0 (NaN in fp32/bf16/fp16/fp64).
void FillPoison(void* p, size_t bytes);

// While at least one scope is alive, device memory is readable and
// writable by the host (device work runs inside one). Nests.
class DeviceAccessScope {
 public:
  DeviceAccessScope();
  ~DeviceAccessScope();
  DeviceAccessScope(const DeviceAccessScope&) = delete;
  DeviceAccessScope& operator=(const DeviceAccessScope&) = delete;
};

// SIGSEGV/SIGBUS handler that names the allocation (and the running work)
// a fault hit, then lets the process die. Installed once.
void InstallFaultHandler();
// An alternate signal stack for the calling thread (fibers' stacks are
// small; a stack overflow must still be reported). Idempotent per thread.
void EnsureSignalStack();

// What the device is running, for fault messages ("" when idle). The
// kernel runner appends the block and thread.
void SetCurrentWork(const std::string& what);
// The kernel runner's description of the running CUDA thread ("" outside
// kernels); async-signal-safe enough for the fault handler.
const char* CurrentThreadDescription();

// ---------------------------------------------------------------- streams
// Runs everything pending on every stream.
void DrainAll();

// Runs a grid now (called from the work LaunchKernel enqueues).
void RunGrid(const LaunchConfig& config, const std::function<void()>& body);

}  // namespace internal
}  // namespace emu
}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_EMU_INTERNAL_H_
