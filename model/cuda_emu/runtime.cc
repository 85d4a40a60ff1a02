// The emulator's CUDA runtime API (emulator.h): the cudart entry points the
// project calls, over lazy streams. Work runs only when the host must see
// its effect; the order respects each stream's order, event waits, and the
// legacy default stream's implicit synchronization with blocking streams.
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "model/cuda_emu/internal.h"

namespace dgca {
namespace cuda {
namespace emu {
namespace internal {

struct StreamImpl;

struct Dep {
  StreamImpl* stream;
  uint64_t seq;  // that stream's work up to and including its seq-th item
};

struct Op {
  Work work;
  std::string what;
  std::vector<Dep> deps;
  // Null, or: the work may run only once this returns true (a collective
  // waiting for its peers; see EnqueueWhenReady).
  ReadyFn ready;
};

}  // namespace internal
}  // namespace emu
}  // namespace cuda
}  // namespace dgca

// A captured or instantiated graph: the captured work in stream order
// (captures span one stream: work from another stream joining through an
// event is reported as not emulated).
struct CUgraph_st {
  std::vector<dgca::cuda::emu::internal::Op> ops;
};
struct CUgraphExec_st {
  std::shared_ptr<const std::vector<dgca::cuda::emu::internal::Op>> ops;
};

namespace dgca {
namespace cuda {
namespace emu {
namespace internal {

struct StreamImpl {
  bool blocking = true;
  bool legacy = false;
  bool destroyed = false;
  std::deque<Op> pending;
  uint64_t enqueued = 0;
  uint64_t executed = 0;
  // Stream capture (cudaStreamBeginCapture): new work goes to `capture`.
  CUgraph_st* capture = nullptr;
  bool capture_invalid = false;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  std::thread::id capture_thread;
};

}  // namespace internal
}  // namespace emu
}  // namespace cuda
}  // namespace dgca

// The runtime's opaque handle types, defined here.
struct CUstream_st {
  dgca::cuda::emu::internal::StreamImpl impl;
};
struct CUevent_st {
  CUgraph_st* captured = nullptr;  // recorded inside this capture (not yet ended)
  bool timing = true;
  dgca::cuda::emu::internal::StreamImpl* stream = nullptr;
  uint64_t seq = 0;
  // Set by the last record's stream work; shared with it, so an event
  // destroyed before its record ran (allowed: CUDA defers the release)
  // leaves nothing dangling.
  struct Mark {
    bool happened = false;
    std::chrono::steady_clock::time_point when;
  };
  std::shared_ptr<Mark> mark;
};

namespace dgca {
namespace cuda {
namespace emu {
namespace internal {
namespace {

constexpr size_t kMaxPending = 100000;  // run everything beyond this many queued items
constexpr size_t kDefaultTotalMemory = size_t{80} << 30;

// The emulated device memory: DGCA_EMU_DEVICE_MEMORY (bytes, a positive
// decimal integer) or 80 GiB. Read at every call, so a test can shrink it
// after building what must fit (to make a later cudaMalloc run out).
size_t TotalMemory() {
  const char* e = std::getenv("DGCA_EMU_DEVICE_MEMORY");
  if (e == nullptr || *e == '\0') return kDefaultTotalMemory;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(e, &end, 10);
  return *end == '\0' && v > 0 ? static_cast<size_t>(v) : kDefaultTotalMemory;
}

cudaError_t g_sticky = cudaSuccess;
cudaError_t g_last = cudaSuccess;
size_t g_pending = 0;

StreamImpl& Legacy() {
  static auto* s = [] {
    auto* l = new StreamImpl;
    l->legacy = true;
    return l;
  }();
  return *s;
}
// Every stream ever created (destroyed ones are kept: dependencies may
// still name them).
std::set<StreamImpl*>& Streams() {
  static auto* s = new std::set<StreamImpl*>{&Legacy()};
  return *s;
}

StreamImpl* Resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &Legacy();
  StreamImpl* impl = &s->impl;
  if (Streams().count(impl) == 0 || impl->destroyed) return nullptr;
  return impl;
}

void DropAll() {
  for (StreamImpl* s : Streams()) {
    s->executed = s->enqueued;
    s->pending.clear();
  }
  g_pending = 0;
}

// kBlock waits for work that is not ready (a collective whose peers have
// not arrived); kQuery stops there (cudaStreamQuery, cudaEventQuery).
enum class Mode { kBlock, kQuery };

double CollectiveTimeoutSeconds() {
  static const double t = [] {
    const char* e = std::getenv("DGCA_EMU_COLLECTIVE_TIMEOUT_S");
    return e != nullptr ? std::atof(e) : 300.0;
  }();
  return t;
}

bool DepsDone(const Op& op) {
  for (const Dep& d : op.deps)
    if (d.stream->executed < d.seq) return false;
  return true;
}

// What a GPU does without being asked: a collective at the head of a stream
// whose inputs are complete starts (deposits this rank's data), so peers
// waiting on it progress while this host thread waits for something else.
// `waiting` (the op the caller just asked) is skipped.
void PumpCollectives(const Op& waiting) {
  std::string failure;
  for (StreamImpl* s : Streams()) {
    if (s->pending.empty()) continue;
    const Op& head = s->pending.front();
    if (&head != &waiting && head.ready && DepsDone(head)) head.ready(&failure);
  }
}

std::string SecondsText(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

bool WaitReady(const Op& op, Mode mode) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(CollectiveTimeoutSeconds()));
  for (bool first = true;; first = false) {
    std::string failure;
    if (op.ready(&failure)) return true;
    if (mode == Mode::kQuery) return false;
    if (!failure.empty()) {
      DeviceFault(cudaErrorLaunchFailure, "a blocking synchronization waits for " + op.what +
                                              ", which can never complete: " + failure +
                                              " (on a GPU this call would hang; abort the communicator first)");
      return true;
    }
    if (!first) PumpCollectives(op);
    if (std::chrono::steady_clock::now() > deadline) {
      DeviceFault(cudaErrorLaunchTimeout, op.what + " did not complete within " +
                                              SecondsText(CollectiveTimeoutSeconds()) +
                                              " s (DGCA_EMU_COLLECTIVE_TIMEOUT_S): a peer never arrived");
      return true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Runs s's work up to its seq-th item (with what it depends on). False when
// kQuery stopped at work that is not ready.
bool ExecuteUntil(StreamImpl* s, uint64_t seq, Mode mode = Mode::kBlock) {
  if (s->executed >= seq || s->pending.empty()) return true;
  DeviceAccessScope access;  // one protection flip for the whole run
  while (s->executed < seq && g_sticky == cudaSuccess && !s->pending.empty()) {
    Op& front = s->pending.front();
    for (const Dep& d : front.deps)
      if (!ExecuteUntil(d.stream, d.seq, mode)) return false;
    if (g_sticky != cudaSuccess) break;
    if (front.ready && !WaitReady(front, mode)) return false;
    if (g_sticky != cudaSuccess) break;
    Op op = std::move(front);
    s->pending.pop_front();
    --g_pending;
    SetCurrentWork(op.what);
    op.work();
    SetCurrentWork("");
    ++s->executed;
  }
  if (g_sticky != cudaSuccess) DropAll();
  return true;
}

void Invalidate(StreamImpl* s, const std::string& why) {
  if (!s->capture_invalid)
    std::fprintf(stderr, "dgca CUDA emulator: stream capture invalidated: %s\n", why.c_str());
  s->capture_invalid = true;
}

// A call CUDA forbids while a capture that covers this thread is active
// (every non-relaxed capture begun by this thread, and global-mode captures
// begun by any): invalidates them and returns
// cudaErrorStreamCaptureUnsupported if there was one, else cudaSuccess.
cudaError_t UnsafeDuringCapture(const std::string& what) {
  bool hit = false;
  for (StreamImpl* s : Streams()) {
    if (s->capture == nullptr || s->capture_mode == cudaStreamCaptureModeRelaxed) continue;
    if (s->capture_mode == cudaStreamCaptureModeGlobal || s->capture_thread == std::this_thread::get_id()) {
      Invalidate(s, what + " while the stream captures");
      hit = true;
    }
  }
  return hit ? ApiError(cudaErrorStreamCaptureUnsupported, what + " during stream capture") : cudaSuccess;
}

cudaError_t EnqueueOp(StreamImpl* s, std::string what, Work work, std::vector<Dep> deps, ReadyFn ready = nullptr) {
  if (g_sticky != cudaSuccess) return g_sticky;
  if (s->capture != nullptr) {
    if (s->capture_invalid) return cudaErrorStreamCaptureInvalidated;
    if (!deps.empty()) {
      Invalidate(s, what + " depends on work outside the capture");
      return ApiError(cudaErrorStreamCaptureIsolation, what + ": a capturing stream may not wait on work outside the capture");
    }
    s->capture->ops.push_back(Op{std::move(work), std::move(what), {}});
    return cudaSuccess;
  }
  if (s->legacy) {
    for (StreamImpl* c : Streams()) {
      if (c->capture != nullptr && c->blocking) {
        Invalidate(c, what + " on the legacy stream (an implicit synchronization with a capturing blocking stream)");
        return ApiError(cudaErrorStreamCaptureImplicit, what + ": the legacy stream would synchronize with a capturing stream");
      }
    }
  }
  if (s->legacy) {
    // The legacy stream waits for all prior work of blocking streams.
    for (StreamImpl* b : Streams())
      if (b != s && b->blocking && !b->destroyed && b->enqueued > b->executed) deps.push_back({b, b->enqueued});
  } else if (s->blocking) {
    StreamImpl& l = Legacy();
    if (l.enqueued > l.executed) deps.push_back({&l, l.enqueued});
  }
  s->pending.push_back(Op{std::move(work), std::move(what), std::move(deps), std::move(ready)});
  ++s->enqueued;
  if (++g_pending > kMaxPending) DrainAll();
  return g_sticky;
}

// Returns the sticky error if set, else `e`.
cudaError_t Result(cudaError_t e = cudaSuccess) { return g_sticky != cudaSuccess ? g_sticky : e; }

// cudaFree and cudaFreeHost: both synchronize the device first.
cudaError_t FreeOf(void* p, MemKind kind, const std::string& call, const std::string& kind_name) {
  std::lock_guard<std::recursive_mutex> lock(Lock());
  if (cudaError_t e = UnsafeDuringCapture(call); e != cudaSuccess) return e;
  if (p == nullptr) return Result();
  DrainAll();
  std::string overrun;
  if (!Free(p, kind, &overrun)) {
    return ApiError(cudaErrorInvalidValue, call + ": not the start of a live " + kind_name + " allocation");
  }
  if (!overrun.empty()) DeviceFault(cudaErrorIllegalAddress, call + ": " + overrun);
  return Result();
}

enum class Space { kPageable, kPinned, kDevice };
// Where a pointer lies, looked up once: its space and, unless pageable,
// the allocation it is in.
struct Place {
  Space space = Space::kPageable;
  AllocationInfo alloc;
};
Place PlaceOf(const void* p) {
  Place pl;
  if (FindAllocation(p, 0, &pl.alloc)) pl.space = pl.alloc.kind == MemKind::kDevice ? Space::kDevice : Space::kPinned;
  return pl;
}
const char* SpaceName(Space s) {
  return s == Space::kDevice ? "device" : s == Space::kPinned ? "pinned host" : "pageable host";
}

cudaError_t CheckRange(const void* p, size_t bytes, const Place& pl, const char* role, const std::string& call) {
  if (pl.space == Space::kPageable) return cudaSuccess;
  const uintptr_t offset = reinterpret_cast<uintptr_t>(p) - pl.alloc.begin;
  if (offset + bytes <= pl.alloc.size) return cudaSuccess;
  return ApiError(cudaErrorInvalidValue, call + ": the " + role + " range of " + std::to_string(bytes) +
                                             " bytes at offset " + std::to_string(offset) + " overruns its " +
                                             SpaceName(pl.space) + " allocation of " +
                                             std::to_string(pl.alloc.size) + " bytes");
}

cudaError_t Copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream, bool async) {
  std::lock_guard<std::recursive_mutex> lock(Lock());
  const std::string call = async ? "cudaMemcpyAsync" : "cudaMemcpy";
  if (g_sticky != cudaSuccess) return g_sticky;
  if (count == 0) return cudaSuccess;
  StreamImpl* s = Resolve(async ? stream : nullptr);
  if (s == nullptr) return ApiError(cudaErrorInvalidResourceHandle, call + ": unknown or destroyed stream");
  const Place pd = PlaceOf(dst), ps = PlaceOf(src);
  const Space sd = pd.space, ss = ps.space;
  const bool dst_dev = sd == Space::kDevice, src_dev = ss == Space::kDevice;
  bool kind_ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: kind_ok = !src_dev && dst_dev; break;
    case cudaMemcpyDeviceToHost: kind_ok = src_dev && !dst_dev; break;
    case cudaMemcpyDeviceToDevice: kind_ok = src_dev && dst_dev; break;
    case cudaMemcpyHostToHost: kind_ok = !src_dev && !dst_dev; break;
    case cudaMemcpyDefault: break;
    default: return ApiError(cudaErrorInvalidMemcpyDirection, call + ": unknown direction");
  }
  if (!kind_ok) {
    return ApiError(cudaErrorInvalidValue, call + ": direction " + std::to_string(int(kind)) + " but the source is " +
                                               SpaceName(ss) + " memory and the destination " + SpaceName(sd) +
                                               " memory");
  }
  if (cudaError_t e = CheckRange(dst, count, pd, "destination", call); e != cudaSuccess) return e;
  if (cudaError_t e = CheckRange(src, count, ps, "source", call); e != cudaSuccess) return e;
  const std::string what = call + " of " + std::to_string(count) + " bytes " + SpaceName(ss) + " -> " + SpaceName(sd);
  if (!async)
    if (cudaError_t e = UnsafeDuringCapture(call); e != cudaSuccess) return e;
  if (s->capture != nullptr && (ss == Space::kPageable || sd == Space::kPageable)) {
    Invalidate(s, what + ": graphs copy from and to pinned or device memory only");
    return ApiError(cudaErrorStreamCaptureUnsupported, what + " during stream capture (pageable memory)");
  }
  if (ss == Space::kPageable && dst_dev) {
    // Staged at the call; the DMA happens in stream order.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + count);
    return EnqueueOp(s, what, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); }, {});
  }
  if (cudaError_t e = EnqueueOp(s, what, [dst, src, count] { std::memcpy(dst, src, count); }, {});
      e != cudaSuccess)
    return e;  // e.g. the capture was invalidated
  // Returns only once complete: to pageable host memory (both forms), any
  // host-host copy, and the synchronous form of copies to or from pinned
  // memory. Device-to-device and the async pinned forms stay queued.
  const bool wait = (src_dev && sd == Space::kPageable) || (!src_dev && !dst_dev) ||
                    (!async && (sd == Space::kPinned || ss == Space::kPinned));
  if (wait) ExecuteUntil(s, s->enqueued);
  return Result();
}

cudaError_t Set(void* p, int value, size_t count, cudaStream_t stream, bool async) {
  std::lock_guard<std::recursive_mutex> lock(Lock());
  const std::string call = async ? "cudaMemsetAsync" : "cudaMemset";
  if (g_sticky != cudaSuccess) return g_sticky;
  if (count == 0) return cudaSuccess;
  StreamImpl* s = Resolve(async ? stream : nullptr);
  if (s == nullptr) return ApiError(cudaErrorInvalidResourceHandle, call + ": unknown or destroyed stream");
  const Place pl = PlaceOf(p);
  const Space sp = pl.space;
  if (sp == Space::kPageable) {
    return ApiError(cudaErrorInvalidValue, call + ": the pointer is pageable host memory, not device memory");
  }
  if (cudaError_t e = CheckRange(p, count, pl, "destination", call); e != cudaSuccess) return e;
  if (!async)
    if (cudaError_t e = UnsafeDuringCapture(call); e != cudaSuccess) return e;
  if (cudaError_t e = EnqueueOp(s, call + " of " + std::to_string(count) + " bytes",
                                [p, value, count] { std::memset(p, value, count); }, {});
      e != cudaSuccess)
    return e;  // e.g. the capture was invalidated
  if (sp == Space::kPinned) ExecuteUntil(s, s->enqueued);
  return Result();
}

}  // namespace

std::recursive_mutex& Lock() {
  static auto* m = new std::recursive_mutex;
  return *m;
}

void DrainAll() {
  for (StreamImpl* s : Streams()) ExecuteUntil(s, s->enqueued);
}

}  // namespace internal

cudaError_t Enqueue(cudaStream_t stream, std::string what, Work work) {
  std::lock_guard<std::recursive_mutex> lock(internal::Lock());
  internal::StreamImpl* s = internal::Resolve(stream);
  if (s == nullptr) return ApiError(cudaErrorInvalidResourceHandle, what + ": unknown or destroyed stream");
  return internal::EnqueueOp(s, std::move(what), std::move(work), {});
}

cudaError_t EnqueueWhenReady(cudaStream_t stream, std::string what, ReadyFn ready, Work work) {
  std::lock_guard<std::recursive_mutex> lock(internal::Lock());
  internal::StreamImpl* s = internal::Resolve(stream);
  if (s == nullptr) return ApiError(cudaErrorInvalidResourceHandle, what + ": unknown or destroyed stream");
  if (s->capture != nullptr) {
    internal::Invalidate(s, what + " (work that waits for peers) while the stream captures");
    return ApiError(cudaErrorNotSupported, what + ": collectives in a graph capture are not emulated");
  }
  return internal::EnqueueOp(s, std::move(what), std::move(work), {}, std::move(ready));
}

namespace {
// cudaStreamSynchronize (kBlock) and cudaStreamQuery (kQuery).
cudaError_t RunStream(cudaStream_t stream, internal::Mode mode) {
  std::lock_guard<std::recursive_mutex> lock(internal::Lock());
  const std::string call = mode == internal::Mode::kQuery ? "cudaStreamQuery" : "cudaStreamSynchronize";
  internal::StreamImpl* s = internal::Resolve(stream);
  if (s == nullptr) return ApiError(cudaErrorInvalidResourceHandle, call + ": unknown or destroyed stream");
  if (s->capture != nullptr) {
    internal::Invalidate(s, call + " of the capturing stream");
    return ApiError(cudaErrorStreamCaptureUnsupported, call + " of a capturing stream");
  }
  if (!internal::ExecuteUntil(s, s->enqueued, mode)) return cudaErrorNotReady;
  return internal::Result();
}
}  // namespace

cudaError_t QueryStream(cudaStream_t stream) { return RunStream(stream, internal::Mode::kQuery); }
cudaError_t SyncStream(cudaStream_t stream) { return RunStream(stream, internal::Mode::kBlock); }

void DeviceFault(cudaError_t code, const std::string& message) {
  std::lock_guard<std::recursive_mutex> lock(internal::Lock());
  std::fprintf(stderr, "dgca CUDA emulator: device fault (%s): %s\n", cudaGetErrorName(code), message.c_str());
  if (internal::g_sticky == cudaSuccess) internal::g_sticky = code;
}

cudaError_t ApiError(cudaError_t code, const std::string& message) {
  std::lock_guard<std::recursive_mutex> lock(internal::Lock());
  std::fprintf(stderr, "dgca CUDA emulator: %s: %s\n", cudaGetErrorName(code), message.c_str());
  internal::g_last = code;
  return code;
}

}  // namespace emu
}  // namespace cuda
}  // namespace dgca

// ====================================================================== cudart
namespace emu = dgca::cuda::emu;
namespace ei = dgca::cuda::emu::internal;
using Guard = std::lock_guard<std::recursive_mutex>;

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define DGCA_EMU_NAME(x) case x: return #x;
    DGCA_EMU_NAME(cudaSuccess)
    DGCA_EMU_NAME(cudaErrorInvalidValue)
    DGCA_EMU_NAME(cudaErrorMemoryAllocation)
    DGCA_EMU_NAME(cudaErrorInitializationError)
    DGCA_EMU_NAME(cudaErrorInvalidConfiguration)
    DGCA_EMU_NAME(cudaErrorInvalidDevice)
    DGCA_EMU_NAME(cudaErrorInvalidMemcpyDirection)
    DGCA_EMU_NAME(cudaErrorInvalidResourceHandle)
    DGCA_EMU_NAME(cudaErrorNotReady)
    DGCA_EMU_NAME(cudaErrorIllegalAddress)
    DGCA_EMU_NAME(cudaErrorLaunchFailure)
    DGCA_EMU_NAME(cudaErrorNoDevice)
    DGCA_EMU_NAME(cudaErrorInvalidDevicePointer)
    DGCA_EMU_NAME(cudaErrorNotSupported)
    DGCA_EMU_NAME(cudaErrorLaunchTimeout)
    DGCA_EMU_NAME(cudaErrorIllegalState)
    DGCA_EMU_NAME(cudaErrorStreamCaptureUnsupported)
    DGCA_EMU_NAME(cudaErrorStreamCaptureInvalidated)
    DGCA_EMU_NAME(cudaErrorStreamCaptureIsolation)
    DGCA_EMU_NAME(cudaErrorStreamCaptureImplicit)
    DGCA_EMU_NAME(cudaErrorStreamCaptureWrongThread)
#undef DGCA_EMU_NAME
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (CUDA emulator)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (CUDA emulator: see its message on stderr)";
    default: return "error (CUDA emulator)";
  }
}

cudaError_t cudaGetLastError() {
  Guard g(ei::Lock());
  if (ei::g_sticky != cudaSuccess) return ei::g_sticky;
  cudaError_t e = ei::g_last;
  ei::g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  Guard g(ei::Lock());
  return ei::g_sticky != cudaSuccess ? ei::g_sticky : ei::g_last;
}

// DGCA_EMU_DEVICES (default 1): how many devices the emulator shows (they
// share one memory; for ranks placed on GPU 1, 2, ... of a fixture node).
static int DeviceCount() {
  static const int n = [] {
    const char* e = std::getenv("DGCA_EMU_DEVICES");
    const int v = e != nullptr ? std::atoi(e) : 1;
    return v >= 1 && v <= 64 ? v : 1;
  }();
  return n;
}
static thread_local int g_device = 0;

cudaError_t cudaGetDeviceCount(int* count) {
  *count = DeviceCount();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= DeviceCount())
    return emu::ApiError(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): the emulator shows " +
                                                     std::to_string(DeviceCount()) + " device(s) (DGCA_EMU_DEVICES)");
  g_device = device;
  return ei::Result();
}
cudaError_t cudaGetDevice(int* device) {
  *device = g_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= DeviceCount())
    return emu::ApiError(cudaErrorInvalidDevice, "cudaGetDeviceProperties(" + std::to_string(device) + "): no such emulated device");
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "dgca CUDA emulator (CPU; sm_90 limits)");
  prop->totalGlobalMem = ei::TotalMemory();
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->l2CacheSize = 50 * 1024 * 1024;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->memoryBusWidth = 5120;
  prop->unifiedAddressing = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  if (cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *value = 32; break;
    default: return emu::ApiError(cudaErrorNotSupported, "cudaDeviceGetAttribute: attribute " + std::to_string(int(attr)) + " not emulated");
  }
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  Guard g(ei::Lock());
  *total = ei::TotalMemory();
  const size_t used = ei::BytesInUse(emu::MemKind::kDevice);
  *free_bytes = used < *total ? *total - used : 0;
  return ei::Result();
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  Guard g(ei::Lock());
  if (cudaError_t e = ei::UnsafeDuringCapture("cudaMalloc"); e != cudaSuccess) return e;
  *p = nullptr;
  if (ei::g_sticky != cudaSuccess) return ei::g_sticky;
  if (bytes == 0) return cudaSuccess;
  if (const size_t total = ei::TotalMemory(); ei::BytesInUse(emu::MemKind::kDevice) + bytes > total) {
    return emu::ApiError(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) + " bytes: the emulated " +
                                                        std::to_string(total) + " bytes are used up");
  }
  *p = ei::Allocate(bytes, emu::MemKind::kDevice);
  if (*p == nullptr) return emu::ApiError(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) + " bytes: mmap failed");
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) { return ei::FreeOf(p, emu::MemKind::kDevice, "cudaFree", "device"); }
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  Guard g(ei::Lock());
  if (cudaError_t e = ei::UnsafeDuringCapture("cudaMallocHost"); e != cudaSuccess) return e;
  *p = nullptr;
  if (ei::g_sticky != cudaSuccess) return ei::g_sticky;
  *p = ei::Allocate(bytes, emu::MemKind::kPinnedHost);
  if (*p == nullptr) return emu::ApiError(cudaErrorMemoryAllocation, "cudaMallocHost: mmap failed");
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return cudaMallocHost(p, bytes); }
cudaError_t cudaFreeHost(void* p) { return ei::FreeOf(p, emu::MemKind::kPinnedHost, "cudaFreeHost", "pinned"); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return ei::Copy(dst, src, count, kind, nullptr, false);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  return ei::Copy(dst, src, count, kind, stream, true);
}
cudaError_t cudaMemset(void* p, int value, size_t count) { return ei::Set(p, value, count, nullptr, false); }
cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
  return ei::Set(p, value, count, stream, true);
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  Guard g(ei::Lock());
  auto* st = new CUstream_st;
  st->impl.blocking = (flags & cudaStreamNonBlocking) == 0;
  ei::Streams().insert(&st->impl);
  *s = st;
  return ei::Result();
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Guard g(ei::Lock());
  ei::StreamImpl* impl = ei::Resolve(s);
  if (impl == nullptr || impl->legacy) return emu::ApiError(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: unknown stream");
  ei::ExecuteUntil(impl, impl->enqueued);
  impl->destroyed = true;  // kept: queued dependencies may name it
  return ei::Result();
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return emu::SyncStream(s); }
cudaError_t cudaStreamQuery(cudaStream_t s) { return emu::QueryStream(s); }
cudaError_t cudaDeviceSynchronize() {
  Guard g(ei::Lock());
  if (cudaError_t e = ei::UnsafeDuringCapture("cudaDeviceSynchronize"); e != cudaSuccess) return e;
  ei::DrainAll();
  return ei::Result();
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  Guard g(ei::Lock());
  *e = new CUevent_st;
  (*e)->timing = (flags & cudaEventDisableTiming) == 0;
  return ei::Result();
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Guard g(ei::Lock());
  if (e == nullptr) return emu::ApiError(cudaErrorInvalidResourceHandle, "cudaEventDestroy(null)");
  delete e;  // a pending record keeps its Mark; waits hold (stream, seq)
  return ei::Result();
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  Guard g(ei::Lock());
  ei::StreamImpl* s = ei::Resolve(stream);
  if (s == nullptr || e == nullptr) return emu::ApiError(cudaErrorInvalidResourceHandle, "cudaEventRecord: unknown stream or event");
  if (s->capture != nullptr) {
    e->captured = s->capture;  // orders nothing outside the capture (single-stream captures)
    return ei::Result();
  }
  e->captured = nullptr;
  auto mark = std::make_shared<CUevent_st::Mark>();
  e->mark = mark;
  cudaError_t r = ei::EnqueueOp(s, "event record", [mark] {
    mark->happened = true;
    mark->when = std::chrono::steady_clock::now();
  }, {});
  e->stream = s;
  e->seq = s->enqueued;
  return r;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int) {
  Guard g(ei::Lock());
  ei::StreamImpl* s = ei::Resolve(stream);
  if (s == nullptr || e == nullptr) return emu::ApiError(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: unknown stream or event");
  if (e->captured != nullptr) {
    if (s->capture == e->captured) return ei::Result();  // the same capture, the same stream: in order already
    return emu::ApiError(cudaErrorNotSupported,
                         "cudaStreamWaitEvent on an event recorded in another stream's capture: multi-stream "
                         "capture is not emulated");
  }
  if (e->stream == nullptr) return ei::Result();  // never recorded: nothing to wait for
  return ei::EnqueueOp(s, "wait event", [] {}, {ei::Dep{e->stream, e->seq}});
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  Guard g(ei::Lock());
  if (e == nullptr) return emu::ApiError(cudaErrorInvalidResourceHandle, "cudaEventSynchronize(null)");
  if (e->stream != nullptr) ei::ExecuteUntil(e->stream, e->seq);
  return ei::Result();
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  Guard g(ei::Lock());
  if (e == nullptr) return emu::ApiError(cudaErrorInvalidResourceHandle, "cudaEventQuery(null)");
  if (e->stream != nullptr && !ei::ExecuteUntil(e->stream, e->seq, ei::Mode::kQuery)) return cudaErrorNotReady;
  return ei::Result();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Guard g(ei::Lock());
  if (start == nullptr || end == nullptr) return emu::ApiError(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: null event");
  if (!start->timing || !end->timing) return emu::ApiError(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  if (!start->mark || !end->mark || !start->mark->happened || !end->mark->happened)
    return emu::ApiError(cudaErrorNotReady, "cudaEventElapsedTime: an event has not completed (synchronize first)");
  *ms = std::chrono::duration<float, std::milli>(end->mark->when - start->mark->when).count();
  return ei::Result();
}

// ---------------------------------------------------------------- graphs
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  Guard g(ei::Lock());
  ei::StreamImpl* s = ei::Resolve(stream);
  if (s == nullptr || s->legacy)
    return emu::ApiError(cudaErrorInvalidValue, "cudaStreamBeginCapture: unknown stream or the legacy stream");
  if (s->capture != nullptr) return emu::ApiError(cudaErrorIllegalState, "cudaStreamBeginCapture: already capturing");
  s->capture = new CUgraph_st;
  s->capture_invalid = false;
  s->capture_mode = mode;
  s->capture_thread = std::this_thread::get_id();
  return ei::Result();
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Guard g(ei::Lock());
  *graph = nullptr;
  ei::StreamImpl* s = ei::Resolve(stream);
  if (s == nullptr || s->capture == nullptr)
    return emu::ApiError(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
  if (s->capture_mode != cudaStreamCaptureModeRelaxed && s->capture_thread != std::this_thread::get_id())
    return emu::ApiError(cudaErrorStreamCaptureWrongThread, "cudaStreamEndCapture from another thread");
  CUgraph_st* captured = s->capture;
  const bool invalid = s->capture_invalid;
  s->capture = nullptr;
  s->capture_invalid = false;
  if (invalid) {
    delete captured;
    return emu::ApiError(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture: the capture was invalidated");
  }
  *graph = captured;
  return ei::Result();
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  Guard g(ei::Lock());
  ei::StreamImpl* s = ei::Resolve(stream);
  if (s == nullptr) return emu::ApiError(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing: unknown stream");
  *status = s->capture == nullptr ? cudaStreamCaptureStatusNone
            : s->capture_invalid  ? cudaStreamCaptureStatusInvalidated
                                  : cudaStreamCaptureStatusActive;
  return ei::Result();
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  Guard g(ei::Lock());
  if (graph == nullptr) return emu::ApiError(cudaErrorInvalidValue, "cudaGraphInstantiate(null graph)");
  // Named once here, shared by every launch (a launch may outlive the exec).
  auto ops = std::make_shared<std::vector<ei::Op>>(graph->ops);
  for (ei::Op& op : *ops) op.what += " (in a graph)";
  *exec = new CUgraphExec_st{std::move(ops)};
  return ei::Result();
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  Guard g(ei::Lock());
  ei::StreamImpl* s = ei::Resolve(stream);
  if (exec == nullptr || s == nullptr) return emu::ApiError(cudaErrorInvalidValue, "cudaGraphLaunch: null graph or unknown stream");
  if (s->capture != nullptr) return emu::ApiError(cudaErrorNotSupported, "cudaGraphLaunch into a capture is not emulated");
  // The nodes in captured order, as one piece of stream work (the kernels'
  // arguments are those of the capture, as on a GPU).
  std::shared_ptr<const std::vector<ei::Op>> ops = exec->ops;
  return ei::EnqueueOp(s, "graph launch (" + std::to_string(ops->size()) + " nodes)", [ops] {
    for (const ei::Op& op : *ops) {
      if (ei::g_sticky != cudaSuccess) break;  // a faulted device runs nothing more
      ei::SetCurrentWork(op.what);
      op.work();
    }
  }, {});
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Guard g(ei::Lock());
  delete exec;
  return ei::Result();
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Guard g(ei::Lock());
  delete graph;
  return ei::Result();
}
