// The CUDA emulator's <mma.h>: nvcuda::wmma (warp-level matrix multiply on
// tensor cores) for kernels compiled by the host compiler (emulator.h).
// It shadows the toolkit's mma.h, which is device-only.
//
// CUDA leaves the distribution of a fragment's elements over the 32 lanes
// unspecified; here every lane holds the whole tile (logically row-major:
// x[r * cols + c]), so code that treats fragment elements uniformly (fill,
// scale every x[i]) behaves as on a GPU, and code that relies on a
// particular mapping would not be portable anyway.
//
// What it checks, as device faults (sticky error, like a GPU's): every
// wmma call is a warp collective, so all 32 lanes of the warp must reach
// the same call (a lane that skips it or exited is a deadlock or a
// "lanes disagree" fault from the warp scheduler); the pointer and ldm must
// be the same on every lane; the pointer 256-bit (32-byte) aligned and
// ldm a multiple of 16 bytes, as the CUDA programming guide requires.
// mma_sync accumulates in fp32 with exact products of the 16-bit inputs
// (what the tensor cores do; their summation order is unspecified).
#ifndef DGCA_MODEL_CUDA_EMU_INCLUDE_MMA_H_
#define DGCA_MODEL_CUDA_EMU_INCLUDE_MMA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "model/cuda/dtype.h"  // ToF / FromF
#include "model/cuda_emu/emulator.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <typename Use, int M, int N, int K>
struct Shape;
template <int M, int N, int K>
struct Shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

// The warp-collective checks of one wmma call (see the header comment).
// One collective per call (each costs a round of the warp's fibers): for a
// memory operand, lane 0's pointer and ldm broadcast in one 64-bit word
// (user-space x86-64 pointers fit 47 bits, ldm 16), which also requires
// every lane of the warp at this call site.
inline void Collective(const char* op, const void* p, unsigned ldm, size_t elem_bytes, const char* file,
                       int line) {
  namespace emu = ::dgca::cuda::emu;
  if (p == nullptr) {  // mma_sync / fill_fragment: no memory operand
    emu::WarpCollective(emu::WarpOp::kSync, 0xffffffffu, 0, 0, 32, file, line);
    return;
  }
  const uint64_t mine = (static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)) << 16) | (ldm & 0xffffu);
  const uint64_t lane0 = emu::WarpCollective(emu::WarpOp::kShflIdx, 0xffffffffu, mine, 0, 32, file, line);
  std::string bad;
  if (lane0 != mine || ldm > 0xffffu) {
    bad = "the pointer or ldm differs between lanes of the warp";
  } else if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
    bad = "the pointer is not 256-bit aligned";
  } else if ((ldm * elem_bytes) % 16 != 0) {
    bad = "ldm " + std::to_string(ldm) + " is not a multiple of 16 bytes";
  }
  if (!bad.empty()) {
    emu::DeviceFault(cudaErrorMisalignedAddress,
                     std::string(file) + ":" + std::to_string(line) + ": wmma::" + op + ": " + bad);
  }
}

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int rows = detail::Shape<Use, M, N, K>::rows;
  static constexpr int cols = detail::Shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  using element_type = T;
  T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const T& v, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  detail::Collective("fill_fragment", nullptr, 0, sizeof(T), file, line);
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = v;
}

// matrix_a / matrix_b: the layout is the fragment's.
template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load names its layout");
  detail::Collective("load_matrix_sync", p, ldm, sizeof(T), file, line);
  constexpr bool row = std::is_same<Layout, row_major>::value;
  for (int r = 0; r < f.rows; ++r)
    for (int c = 0; c < f.cols; ++c) f.x[r * f.cols + c] = row ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}

template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  detail::Collective("load_matrix_sync", p, ldm, sizeof(T), file, line);
  for (int r = 0; r < f.rows; ++r)
    for (int c = 0; c < f.cols; ++c)
      f.x[r * f.cols + c] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout,
                       const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  detail::Collective("store_matrix_sync", p, ldm, sizeof(T), file, line);
  for (int r = 0; r < f.rows; ++r)
    for (int c = 0; c < f.cols; ++c)
      (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[r * f.cols + c];
}

// d = a * b + c (d may be c). Every lane of the warp holds the same
// operands, so the product is computed by the first lane and kept in a
// one-entry cache that the next lanes use when their operands are
// byte-identical (the lanes of a warp run one after another here); any
// difference just computes again, so the result never depends on it.
template <int M, int N, int K, typename Tin, typename LA, typename LB, typename Tacc>
void mma_sync(fragment<accumulator, M, N, K, Tacc>& d, const fragment<matrix_a, M, N, K, Tin, LA>& a,
              const fragment<matrix_b, M, N, K, Tin, LB>& b, const fragment<accumulator, M, N, K, Tacc>& c,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  detail::Collective("mma_sync", nullptr, 0, sizeof(Tin), file, line);
  struct Cache {
    bool valid = false;
    fragment<matrix_a, M, N, K, Tin, LA> a;
    fragment<matrix_b, M, N, K, Tin, LB> b;
    fragment<accumulator, M, N, K, Tacc> c, d;
  };
  static thread_local Cache cache;
  if (cache.valid && std::memcmp(&cache.a, &a, sizeof(a)) == 0 && std::memcmp(&cache.b, &b, sizeof(b)) == 0 &&
      std::memcmp(&cache.c, &c, sizeof(c)) == 0) {
    d = cache.d;
    return;
  }
  std::memcpy(&cache.a, &a, sizeof(a));
  std::memcpy(&cache.b, &b, sizeof(b));
  std::memcpy(&cache.c, &c, sizeof(c));
  float fa[M * K], fbt[N * K], out[M * N];  // b transposed: both operands read along k
  for (int i = 0; i < M * K; ++i) fa[i] = ::dgca::cuda::ToF(a.x[i]);
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < N; ++j) fbt[j * K + k] = ::dgca::cuda::ToF(b.x[k * N + j]);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = ::dgca::cuda::ToF(c.x[i * N + j]);
      for (int k = 0; k < K; ++k) acc += fa[i * K + k] * fbt[j * K + k];
      out[i * N + j] = acc;
    }
  for (int i = 0; i < M * N; ++i) d.x[i] = ::dgca::cuda::FromF<Tacc>(out[i]);
  cache.d = d;
  cache.valid = true;
}

}  // namespace wmma
}  // namespace nvcuda

#endif  // DGCA_MODEL_CUDA_EMU_INCLUDE_MMA_H_
