// Force-included (-include) into every model/cuda/*.cu translation unit the
// CUDA emulator compiles with the host compiler (see emulator.h): CUDA's
// execution-space keywords, built-in variables, intrinsics and the launch
// operators that rewrite_launches.cmake's output calls.
//
// Not for hand-written code: include model/cuda_emu/emulator.h instead.
#ifndef DGCA_MODEL_CUDA_EMU_DEVICE_H_
#define DGCA_MODEL_CUDA_EMU_DEVICE_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/cuda_emu/emulator.h"

// Static __shared__ variables become function statics in one section,
// which the emulator refills with the poison pattern before every block
// (shared memory starts undefined on a GPU). Blocks run one at a time.
#undef __shared__
#define __shared__ static __attribute__((section("dgca_emu_shared")))

#undef __launch_bounds__
#define __launch_bounds__(...)

#define threadIdx (::dgca::cuda::emu::Coords().thread_idx)
#define blockIdx (::dgca::cuda::emu::Coords().block_idx)
#define blockDim (::dgca::cuda::emu::Coords().block_dim)
#define gridDim (::dgca::cuda::emu::Coords().grid_dim)
#define warpSize 32

#define __syncthreads() ::dgca::cuda::emu::SyncThreads(__FILE__, __LINE__)
#define __syncwarp(...) \
  ((void)::dgca::cuda::emu::WarpCollective(::dgca::cuda::emu::WarpOp::kSync, ::dgca::cuda::emu::detail::SyncwarpMask(__VA_ARGS__), 0, 0, 32, __FILE__, __LINE__))

namespace dgca {
namespace cuda {
namespace emu {
namespace detail {

inline unsigned SyncwarpMask() { return 0xffffffffu; }
inline unsigned SyncwarpMask(unsigned m) { return m; }

template <typename T>
uint64_t Bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

template <typename T>
T Shfl(WarpOp op, unsigned mask, T v, int arg, int width, const char* file, int line) {
  return FromBits<T>(WarpCollective(op, mask, Bits(v), arg, width, file, line));
}

// A pointer argument's address, for the launch-time check.
template <typename T>
void CollectPointer(std::vector<std::pair<int, const void*>>* out, int index, const T& v) {
  if constexpr (std::is_pointer<T>::value) {
    out->emplace_back(index, static_cast<const void*>(v));
  } else {
    (void)out;
    (void)index;
    (void)v;
  }
}

template <typename Tuple, size_t... I>
std::vector<std::pair<int, const void*>> Pointers(const Tuple& t, std::index_sequence<I...>) {
  std::vector<std::pair<int, const void*>> out;
  (CollectPointer(&out, int(I), std::get<I>(t)), ...);
  return out;
}

}  // namespace detail

// `kernel<<<grid, block, shmem, stream>>>(args...)` is rewritten to
// `kernel | LaunchAt(__FILE__, __LINE__, grid, block, shmem, stream) | Args(args...)`.
inline LaunchConfig LaunchAt(const char* file, int line, dim3 grid, dim3 block, size_t shmem = 0,
                             cudaStream_t stream = nullptr) {
  LaunchConfig c;
  c.site.file = file;
  c.site.line = line;
  c.grid = grid;
  c.block = block;
  c.dynamic_shared_bytes = shmem;
  c.stream = stream;
  return c;
}

template <typename... P>
struct BoundKernel {
  void (*kernel)(P...);
  LaunchConfig config;
};

template <typename... A>
struct ArgPack {
  std::tuple<A...> args;
};

template <typename... A>
ArgPack<std::decay_t<A>...> Args(A&&... a) {
  return ArgPack<std::decay_t<A>...>{std::tuple<std::decay_t<A>...>(std::forward<A>(a)...)};
}

template <typename... P>
BoundKernel<P...> operator|(void (*kernel)(P...), const LaunchConfig& config) {
  return BoundKernel<P...>{kernel, config};
}

// Launches: the arguments are converted to the kernel's parameter types
// now (as a real launch copies them), the grid runs when the stream does.
template <typename... P, typename... A>
void operator|(const BoundKernel<P...>& k, ArgPack<A...>&& pack) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(std::move(pack.args));
  auto pointers = detail::Pointers(*params, std::index_sequence_for<P...>{});
  void (*kernel)(P...) = k.kernel;
  LaunchKernel(k.config, pointers, [kernel, params] { std::apply(kernel, *params); });
}

}  // namespace emu
}  // namespace cuda
}  // namespace dgca

// `extern __shared__ T name[];` is rewritten to
// `T* name = DGCA_EMU_DYNAMIC_SHARED(T);`.
#define DGCA_EMU_DYNAMIC_SHARED(T) static_cast<T*>(::dgca::cuda::emu::DynamicSharedMemory())

// ---------------------------------------------------------------- warp intrinsics
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return ::dgca::cuda::emu::detail::Shfl(::dgca::cuda::emu::WarpOp::kShflIdx, mask, v, src, width, "", 0);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::dgca::cuda::emu::detail::Shfl(::dgca::cuda::emu::WarpOp::kShflUp, mask, v, int(delta), width, "", 0);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::dgca::cuda::emu::detail::Shfl(::dgca::cuda::emu::WarpOp::kShflDown, mask, v, int(delta), width, "", 0);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return ::dgca::cuda::emu::detail::Shfl(::dgca::cuda::emu::WarpOp::kShflXor, mask, v, lane_mask, width, "", 0);
}
inline int __any_sync(unsigned mask, int pred) {
  return int(::dgca::cuda::emu::WarpCollective(::dgca::cuda::emu::WarpOp::kAny, mask, pred != 0, 0, 32, "", 0));
}
inline int __all_sync(unsigned mask, int pred) {
  return int(::dgca::cuda::emu::WarpCollective(::dgca::cuda::emu::WarpOp::kAll, mask, pred != 0, 0, 32, "", 0));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return unsigned(
      ::dgca::cuda::emu::WarpCollective(::dgca::cuda::emu::WarpOp::kBallot, mask, pred != 0, 0, 32, "", 0));
}
inline unsigned __activemask() { return 0xffffffffu; }

// ---------------------------------------------------------------- atomics
// Blocks and threads never run concurrently: a plain read-modify-write is
// atomic here.
template <typename T>
T atomicAdd(T* p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
T atomicMax(T* p, T v) {
  T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <typename T>
T atomicMin(T* p, T v) {
  T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <typename T>
T atomicExch(T* p, T v) {
  T old = *p;
  *p = v;
  return old;
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---------------------------------------------------------------- math
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
using std::isfinite;
using std::isinf;
using std::isnan;
using std::max;
using std::min;
inline float max(float a, int b) { return std::max(a, float(b)); }
inline int64_t min(int64_t a, int b) { return std::min(a, int64_t(b)); }
inline int64_t min(int a, int64_t b) { return std::min(int64_t(a), b); }
inline int64_t max(int64_t a, int b) { return std::max(a, int64_t(b)); }
inline int64_t max(int a, int64_t b) { return std::max(int64_t(a), b); }

#endif  // DGCA_MODEL_CUDA_EMU_DEVICE_H_
