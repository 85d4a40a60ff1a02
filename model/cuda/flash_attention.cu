// Fused attention kernels (flash_attention.h says what and why). Layout of
// every kernel: a block of 4 warps owns 64 rows of one (batch, head) — 16
// rows per warp, one wmma tile high — and streams the other side (keys, or
// queries in the dK/dV kernel) through shared memory 32 rows at a time.
// Per warp, a 16x32 fp32 score tile and a 16x32 T probability tile live in
// shared memory; the row-wise softmax arithmetic is done there by lane
// pairs (lane 2r and 2r+1 own row r, 16 columns each), because a wmma
// accumulator's element-to-lane mapping is unspecified.
#include "model/cuda/flash_attention.h"

#include <mma.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "model/core/config.h"
#include "model/core/dropout.h"
#include "model/cuda/cuda_context.h"

namespace dgca {
namespace cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpRows = 16;                   // rows a warp owns: one wmma tile high
constexpr int kBlockRows = kWarps * kWarpRows;  // rows a block owns
constexpr int kTile = 32;                       // rows streamed per step
// Shared-memory row pitches, padded so that the 16 rows of a wmma load do
// not all start in the same bank; each keeps rows 16-byte multiples and
// 16-row blocks 32-byte aligned (wmma's requirements).
constexpr int kSP = kTile + 4;  // fp32 score tile
constexpr int kPP = kTile + 8;  // T probability tile
template <int D>
constexpr int kPitch = D + 8;  // T tiles of D columns

// Dropout on the probabilities (model/core/dropout.h), resolved on the
// host: kernels instantiated with kDrop = true read it, the others never do.
struct KernelDrop {
  const uint64_t* keys = nullptr;  // [B], device memory
  int layer = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;
};
// This (batch, head)'s site key; 0 when the kernel does not drop.
template <bool kDrop>
__device__ __forceinline__ uint64_t DropSite(const KernelDrop& drop, int b) {
  if constexpr (kDrop) return DropoutSiteKey(drop.keys[b], drop.layer, kDropAttnProbs);
  return 0;
}

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T, typename Layout>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, Layout>;

// Rows [0, valid) of a [rows, D] tile of T at src (row stride ld elements)
// into shared memory at dst (pitch kPitch<D>), zeros after; 16-byte
// accesses by the whole block.
template <typename T, int D>
__device__ __forceinline__ void LoadTile(T* dst, const T* src, int64_t ld, int rows, int valid) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kPerRow = D / kVec;
  for (int i = threadIdx.x; i < rows * kPerRow; i += kThreads) {
    const int r = i / kPerRow, c = (i % kPerRow) * kVec;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < valid) v = *reinterpret_cast<const uint4*>(src + r * ld + c);
    *reinterpret_cast<uint4*>(dst + r * kPitch<D> + c) = v;
  }
}

// keep[j] = whether key k0 + j (of the tile's kTile) exists and is real
// (keys_real: the batch row's mask). The block's first kTile threads.
__device__ __forceinline__ void KeepKeys(int* keep, const int32_t* keys_real, int k0, int L) {
  if (threadIdx.x < kTile) keep[threadIdx.x] = k0 + int(threadIdx.x) < L && keys_real[k0 + threadIdx.x] != 0;
}

// The index of the batch row's last real key (-1: none), for the whole
// block (every thread gets it; scratch: kWarps ints of shared memory).
// Keys after it have probability zero for every query, so the loops over
// key tiles stop at KeyTiles(last) and a block of keys past it has zero
// gradients: a row shorter than L costs only its own length (the batch is
// trimmed to its longest row; the others are shorter). Skipping them is
// exact: they add 0 * V and 0 * Q. The whole block; syncs the block.
__device__ __forceinline__ int LastRealKey(const int32_t* keys_real, int L, int* scratch) {
  int last = -1;
  for (int j = threadIdx.x; j < L; j += kThreads)
    if (keys_real[j] != 0) last = j;  // j grows: the thread's last is its max
  for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = last;
  __syncthreads();
  last = scratch[0];
  for (int w = 1; w < kWarps; ++w) last = max(last, scratch[w]);
  return last;
}

// Key tiles of kTile that hold keys 0..last.
__device__ __forceinline__ int KeyTiles(int last) { return (last + kTile) / kTile; }

// Calls fn(j) for j = 0..15: the lane's 16 columns c0 + j of its tile row r
// (lane pairs own a row: r = lane / 2, c0 = 16 (lane % 2)), starting at
// column r (mod 16): rows r and r + 8 share banks at pitch kSP, and the
// rotation spreads the lanes of a pass over different banks.
template <typename Fn>
__device__ __forceinline__ void ForLaneColumns(int r, Fn fn) {
  for (int i = 0; i < 16; ++i) fn((i + r) & 15);
}

template <int N>
__device__ __forceinline__ void Zero(Acc (&acc)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::fill_fragment(acc[n], 0.0f);
}

// acc[n] += A * B[:, 16n..16n+16) for A [16, K] row-major (pitch lda) and
// B [K, 16N]: row-major (element (k, j) at b[k * ldb + j]) or col-major
// (at b[j * ldb + k]). The whole warp.
template <typename T, typename BLayout, int K, int N>
__device__ __forceinline__ void Mma(Acc (&acc)[N], const T* a, int lda, const T* b, int ldb) {
  constexpr bool kRowB = std::is_same<BLayout, wmma::row_major>::value;
#pragma unroll
  for (int k = 0; k < K; k += 16) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, a + k, lda);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      FragB<T, BLayout> fb;
      wmma::load_matrix_sync(fb, kRowB ? b + k * ldb + n * 16 : b + n * 16 * ldb + k, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// s [16, kTile] (pitch kSP, fp32) = a [16, D] * b [kTile, D]^T, both T
// tiles of pitch kPitch<D>. The whole warp.
template <typename T, int D>
__device__ __forceinline__ void ProductNT(float* s, const T* a, const T* b) {
  Acc acc[kTile / 16];
  Zero(acc);
  Mma<T, wmma::col_major, D, kTile / 16>(acc, a, kPitch<D>, b, kPitch<D>);
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) wmma::store_matrix_sync(s + n * 16, acc[n], kSP, wmma::mem_row_major);
}

// Writes the warp's [16, D] result (acc) times `mult` as T to dst (row
// stride ld), rows [0, valid) only; `stage` is the warp's fp32 scratch
// (16 x kSP). Each lane converts 8 consecutive values of one row and
// stores them as one 16-byte access (dst, ld and the column offsets keep
// 16-byte alignment: H is a multiple of 16 and the bases are aligned).
// The whole warp.
template <typename T, int D>
__device__ __forceinline__ void WriteRows(T* dst, int64_t ld, int valid, Acc (&acc)[D / 16], float mult,
                                          float* stage) {
  const int lane = threadIdx.x & 31;
  const int r = lane >> 1, c = (lane & 1) * 8;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::store_matrix_sync(stage, acc[n], kSP, wmma::mem_row_major);
    __syncwarp();
    if (r < valid) {
      T v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = FromF<T>(stage[r * kSP + c + e] * mult);
      uint4 u;
      memcpy(&u, v, sizeof(u));
      *reinterpret_cast<uint4*>(dst + r * ld + n * 16 + c) = u;
    }
    __syncwarp();
  }
}

// Grid (ceil(L/64), nh, B). out and lse for 64 queries of one head.
// With kDrop, P V uses P * M / (1-p); lse stays the unmasked softmax's.
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(T* out, float* lse, const T* qkv, const int32_t* mask, int L, int H, int nh, float scale,
                       KernelDrop drop) {
  constexpr int P = kPitch<D>;
  __shared__ __align__(32) T q_s[kBlockRows * P];
  __shared__ __align__(32) T k_s[kTile * P];
  __shared__ __align__(32) T v_s[kTile * P];
  __shared__ __align__(32) float s_s[kWarps][kWarpRows * kSP];
  __shared__ __align__(32) T p_s[kWarps][kWarpRows * kPP];
  __shared__ int keep_s[kTile];
  __shared__ int last_s[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kBlockRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t H3 = 3 * int64_t(H);
  const T* base = qkv + int64_t(b) * L * H3 + int64_t(h) * D;
  const int32_t* keys_real = mask + int64_t(b) * L;
  LoadTile<T, D>(q_s, base + q0 * H3, H3, kBlockRows, min(kBlockRows, L - q0));
  float* s_w = s_s[warp];
  T* p_w = p_s[warp];
  const T* q_w = q_s + warp * kWarpRows * P;
  // This lane's row and columns of a tile (ForLaneColumns).
  const int r = lane >> 1, c0 = (lane & 1) * 16;
  const float* s_row = s_w + r * kSP + c0;
  const int tiles = KeyTiles(LastRealKey(keys_real, L, last_s));
  const int row0 = q0 + warp * kWarpRows;
  const uint64_t site = DropSite<kDrop>(drop, b);

  // Pass 1: each row's max and sum of exp(score - max) over the real keys.
  float mx = -INFINITY, sum = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    const int k0 = t * kTile;
    __syncthreads();  // k_s and keep_s of the previous tile are no longer read
    LoadTile<T, D>(k_s, base + H + k0 * H3, H3, kTile, min(kTile, L - k0));
    KeepKeys(keep_s, keys_real, k0, L);
    __syncthreads();
    ProductNT<T, D>(s_w, q_w, k_s);
    __syncwarp();
    float tmax = -INFINITY;
    ForLaneColumns(r, [&](int j) {
      if (keep_s[c0 + j]) tmax = fmaxf(tmax, s_row[j] * scale);
    });
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    const float nmax = fmaxf(mx, tmax);
    float tsum = 0.0f;
    if (nmax != -INFINITY) {
      ForLaneColumns(r, [&](int j) {
        if (keep_s[c0 + j]) tsum += expf(s_row[j] * scale - nmax);
      });
    }
    tsum += __shfl_xor_sync(0xffffffffu, tsum, 1);
    if (nmax != -INFINITY) {
      sum = sum * expf(mx - nmax) + tsum;  // exp(-inf) = 0 on the first real key
      mx = nmax;
    }
    __syncwarp();  // s_w is rewritten by the next tile
  }

  // Pass 2: P = exp(score - max) / sum rounded to T (as the GEMM version
  // stores its probabilities), out += P V.
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  Acc o[D / 16];
  Zero(o);
  for (int t = 0; t < tiles; ++t) {
    const int k0 = t * kTile, valid = min(kTile, L - k0);
    __syncthreads();
    LoadTile<T, D>(k_s, base + H + k0 * H3, H3, kTile, valid);
    LoadTile<T, D>(v_s, base + 2 * H + k0 * H3, H3, kTile, valid);
    KeepKeys(keep_s, keys_real, k0, L);
    __syncthreads();
    ProductNT<T, D>(s_w, q_w, k_s);
    __syncwarp();
    ForLaneColumns(r, [&](int j) {
      float pv = keep_s[c0 + j] ? expf(s_row[j] * scale - mx) * inv : 0.0f;
      if constexpr (kDrop)
        pv = DropoutKeep(site, DropoutProbsIndex(h, row0 + r, k0 + c0 + j), drop.threshold) ? pv * drop.scale : 0.0f;
      p_w[r * kPP + c0 + j] = FromF<T>(pv);
    });
    __syncwarp();
    Mma<T, wmma::row_major, kTile, D / 16>(o, p_w, kPP, v_s, P);
  }
  if ((lane & 1) == 0 && row0 + r < L)
    lse[(int64_t(b) * nh + h) * L + row0 + r] = sum > 0.0f ? mx + logf(sum) : INFINITY;
  WriteRows<T, D>(out + (int64_t(b) * L + row0) * H + int64_t(h) * D, H, L - row0, o, 1.0f, s_w);
}

// One warp per row of [B*L*nh] (row (b*L + i)*nh + h is dout/out's
// [B,L,H] row (b, i) at columns h*D..): dvec[b, h, i] = sum dout * out.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    RowDotKernel(float* dvec, const T* dout, const T* out, int L, int nh, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // whole warps
  float s = 0.0f;
  for (int c = lane; c < D; c += 32) s += ToF(dout[row * D + c]) * ToF(out[row * D + c]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) {
    const int64_t h = row % nh, bi = row / nh, b = bi / L, i = bi % L;
    dvec[(b * nh + h) * L + i] = s;
  }
}

// Grid (ceil(L/64), nh, B). dK and dV of 64 keys of one head, over every
// query: P^T = exp(K Q^T * scale - lse) (zero for padding keys),
// dV = P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D), dK = scale dS^T Q.
// With kDrop (mask M, scale s = 1/(1-p)): dV = (P o M s)^T dO and
// dS^T = P^T (M s dP^T - D); D = rowsum(dO O) holds as it is, O being the
// masked forward's output.
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKVKernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dvec,
                          const int32_t* mask, int L, int H, int nh, float scale, KernelDrop drop) {
  constexpr int P = kPitch<D>;
  __shared__ __align__(32) T k_s[kBlockRows * P];
  __shared__ __align__(32) T v_s[kBlockRows * P];
  __shared__ __align__(32) T q_s[kTile * P];
  __shared__ __align__(32) T do_s[kTile * P];
  __shared__ __align__(32) float s_s[kWarps][kWarpRows * kSP];
  __shared__ __align__(32) T p_s[kWarps][kWarpRows * kPP];
  __shared__ float lse_s[kTile];
  __shared__ float d_s[kTile];
  __shared__ int last_s[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * kBlockRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t H3 = 3 * int64_t(H);
  const T* base = qkv + int64_t(b) * L * H3 + int64_t(h) * D;
  const T* obase = dout + int64_t(b) * L * H + int64_t(h) * D;
  const float* lse_bh = lse + (int64_t(b) * nh + h) * L;
  const float* d_bh = dvec + (int64_t(b) * nh + h) * L;
  const int valid_keys = min(kBlockRows, L - k0);
  LoadTile<T, D>(k_s, base + H + k0 * H3, H3, kBlockRows, valid_keys);
  LoadTile<T, D>(v_s, base + 2 * H + k0 * H3, H3, kBlockRows, valid_keys);
  float* s_w = s_s[warp];
  T* p_w = p_s[warp];
  const int r = lane >> 1, c0 = (lane & 1) * 16;
  const float* s_row = s_w + r * kSP + c0;
  const int row0 = k0 + warp * kWarpRows;
  const bool keep = row0 + r < L && mask[int64_t(b) * L + row0 + r] != 0;
  const uint64_t site = DropSite<kDrop>(drop, b);
  Acc dk[D / 16], dv[D / 16];
  Zero(dk);
  Zero(dv);
  // A block of keys after the row's last real key: every probability is
  // zero, so are dK and dV (written below without streaming the queries).
  const int tiles = LastRealKey(mask + int64_t(b) * L, L, last_s) < k0 ? 0 : (L + kTile - 1) / kTile;
  for (int t = 0; t < tiles; ++t) {
    const int q0 = t * kTile, valid = min(kTile, L - q0);
    __syncthreads();  // the previous tile's q_s, do_s, lse_s, d_s are no longer read
    LoadTile<T, D>(q_s, base + q0 * H3, H3, kTile, valid);
    LoadTile<T, D>(do_s, obase + q0 * int64_t(H), H, kTile, valid);
    if (threadIdx.x < kTile) {
      const int q = q0 + threadIdx.x;
      lse_s[threadIdx.x] = q < L ? lse_bh[q] : INFINITY;
      d_s[threadIdx.x] = q < L ? d_bh[q] : 0.0f;
    }
    __syncthreads();
    ProductNT<T, D>(s_w, k_s + warp * kWarpRows * P, q_s);  // S^T = K Q^T
    __syncwarp();
    ForLaneColumns(r, [&](int j) {
      p_w[r * kPP + c0 + j] = FromF<T>(keep ? expf(s_row[j] * scale - lse_s[c0 + j]) : 0.0f);
    });
    __syncwarp();
    if constexpr (kDrop) {
      // dP^T first (over S^T, no longer needed); then, per element, dS^T in
      // place of dP^T (it needs the unmasked P^T) and the masked P^T in
      // place of P^T; dV, then dS^T into the T tile for dK.
      ProductNT<T, D>(s_w, v_s + warp * kWarpRows * P, do_s);  // dP^T = V dO^T
      __syncwarp();
      float* s_mut = s_w + r * kSP + c0;
      ForLaneColumns(r, [&](int j) {
        T& p = p_w[r * kPP + c0 + j];
        const float pf = ToF(p);
        const bool m = DropoutKeep(site, DropoutProbsIndex(h, q0 + c0 + j, row0 + r), drop.threshold);
        s_mut[j] = pf * ((m ? s_mut[j] * drop.scale : 0.0f) - d_s[c0 + j]);  // dS^T
        p = FromF<T>(m ? pf * drop.scale : 0.0f);
      });
      // Both syncs order per-lane p_w writes against the warp's wmma loads
      // of it. The CUDA emulator runs a wmma load as a warp barrier, so
      // ctest cannot catch either missing; compute-sanitizer --tool
      // synccheck on a GPU can.
      __syncwarp();
      Mma<T, wmma::row_major, kTile, D / 16>(dv, p_w, kPP, do_s, P);  // dV += (P o M s)^T dO
      __syncwarp();
      ForLaneColumns(r, [&](int j) { p_w[r * kPP + c0 + j] = FromF<T>(s_row[j]); });
    } else {
      Mma<T, wmma::row_major, kTile, D / 16>(dv, p_w, kPP, do_s, P);  // dV += P^T dO
      ProductNT<T, D>(s_w, v_s + warp * kWarpRows * P, do_s);         // dP^T = V dO^T
      __syncwarp();
      ForLaneColumns(r, [&](int j) {
        T& p = p_w[r * kPP + c0 + j];
        p = FromF<T>(ToF(p) * (s_row[j] - d_s[c0 + j]));  // dS^T
      });
    }
    __syncwarp();
    Mma<T, wmma::row_major, kTile, D / 16>(dk, p_w, kPP, q_s, P);  // dK += dS^T Q
  }
  T* dst = dqkv + (int64_t(b) * L + row0) * H3 + int64_t(h) * D;
  WriteRows<T, D>(dst + H, H3, L - row0, dk, scale, s_w);
  WriteRows<T, D>(dst + 2 * H, H3, L - row0, dv, 1.0f, s_w);
}

// Grid (ceil(L/64), nh, B). dQ of 64 queries of one head, over every key:
// P = exp(Q K^T * scale - lse), dP = dO V^T, dS = P (dP - D),
// dQ = scale dS K; with kDrop dS = P (M s dP - D).
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dvec,
                         const int32_t* mask, int L, int H, int nh, float scale, KernelDrop drop) {
  constexpr int P = kPitch<D>;
  __shared__ __align__(32) T q_s[kBlockRows * P];
  __shared__ __align__(32) T do_s[kBlockRows * P];
  __shared__ __align__(32) T k_s[kTile * P];
  __shared__ __align__(32) T v_s[kTile * P];
  __shared__ __align__(32) float s_s[kWarps][kWarpRows * kSP];
  __shared__ __align__(32) T p_s[kWarps][kWarpRows * kPP];
  __shared__ int keep_s[kTile];
  __shared__ int last_s[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kBlockRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t H3 = 3 * int64_t(H);
  const T* base = qkv + int64_t(b) * L * H3 + int64_t(h) * D;
  const int32_t* keys_real = mask + int64_t(b) * L;
  const int valid_rows = min(kBlockRows, L - q0);
  LoadTile<T, D>(q_s, base + q0 * H3, H3, kBlockRows, valid_rows);
  LoadTile<T, D>(do_s, dout + (int64_t(b) * L + q0) * H + int64_t(h) * D, H, kBlockRows, valid_rows);
  float* s_w = s_s[warp];
  T* p_w = p_s[warp];
  const int r = lane >> 1, c0 = (lane & 1) * 16;
  const float* s_row = s_w + r * kSP + c0;
  const int row0 = q0 + warp * kWarpRows;
  const int64_t bh = int64_t(b) * nh + h;
  const float row_lse = row0 + r < L ? lse[bh * L + row0 + r] : INFINITY;
  const float row_d = row0 + r < L ? dvec[bh * L + row0 + r] : 0.0f;
  const uint64_t site = DropSite<kDrop>(drop, b);
  Acc dq[D / 16];
  Zero(dq);
  const int tiles = KeyTiles(LastRealKey(keys_real, L, last_s));
  for (int t = 0; t < tiles; ++t) {
    const int k0 = t * kTile, valid = min(kTile, L - k0);
    __syncthreads();
    LoadTile<T, D>(k_s, base + H + k0 * H3, H3, kTile, valid);
    LoadTile<T, D>(v_s, base + 2 * H + k0 * H3, H3, kTile, valid);
    KeepKeys(keep_s, keys_real, k0, L);
    __syncthreads();
    ProductNT<T, D>(s_w, q_s + warp * kWarpRows * P, k_s);  // S = Q K^T
    __syncwarp();
    ForLaneColumns(r, [&](int j) {
      p_w[r * kPP + c0 + j] = FromF<T>(keep_s[c0 + j] ? expf(s_row[j] * scale - row_lse) : 0.0f);
    });
    __syncwarp();
    ProductNT<T, D>(s_w, do_s + warp * kWarpRows * P, v_s);  // dP = dO V^T
    __syncwarp();
    ForLaneColumns(r, [&](int j) {
      T& p = p_w[r * kPP + c0 + j];
      float dp = s_row[j];
      if constexpr (kDrop)
        dp = DropoutKeep(site, DropoutProbsIndex(h, row0 + r, k0 + c0 + j), drop.threshold) ? dp * drop.scale : 0.0f;
      p = FromF<T>(ToF(p) * (dp - row_d));  // dS
    });
    __syncwarp();
    Mma<T, wmma::row_major, kTile, D / 16>(dq, p_w, kPP, k_s, P);  // dQ += dS K
  }
  WriteRows<T, D>(dqkv + (int64_t(b) * L + row0) * H3 + int64_t(h) * D, H3, L - row0, dq, scale, s_w);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

Status CheckShape(DType type, int B, int L, int H, int nh, std::initializer_list<const void*> pointers,
                  std::initializer_list<const void*> others) {
  if (B < 0 || !FusedAttentionSupported(type, L, H, nh)) {
    return InvalidArgumentError(std::string("fused attention: unsupported shape or type (") + DTypeName(type) +
                                ", B " + std::to_string(B) + ", L " + std::to_string(L) + ", H " +
                                std::to_string(H) + ", heads " + std::to_string(nh) +
                                "); valid: bf16 or fp16, head size 16, 32 or 64, L in 1..512");
  }
  for (const void* p : pointers)
    if (p == nullptr || !Aligned16(p))
      return InvalidArgumentError("fused attention: a tensor is null or not 16-byte aligned");
  for (const void* p : others)
    if (p == nullptr) return InvalidArgumentError("fused attention: null lse, mask or scratch");
  return OkStatus();
}

KernelDrop ResolveDrop(const AttentionDropout& d) {
  KernelDrop k;
  if (!d.on()) return k;
  k.keys = d.keys;
  k.layer = d.layer;
  k.threshold = DropoutThreshold(d.p);
  k.scale = DropoutScale(d.p);
  return k;
}

template <typename T, int D>
Status Forward(cudaStream_t stream, T* out, float* lse, const T* qkv, const int32_t* mask, int B, int L, int H,
               int nh, const AttentionDropout& drop) {
  const dim3 grid((L + kBlockRows - 1) / kBlockRows, nh, B);
  const float scale = 1.0f / std::sqrt(float(D));
  if (drop.on()) {
    FlashForwardKernel<T, D, true><<<grid, kThreads, 0, stream>>>(out, lse, qkv, mask, L, H, nh, scale,
                                                                  ResolveDrop(drop));
  } else {
    FlashForwardKernel<T, D, false><<<grid, kThreads, 0, stream>>>(out, lse, qkv, mask, L, H, nh, scale, KernelDrop());
  }
  return Launched("FlashForwardKernel");
}

// The two backward kernels of one instantiation (with or without dropout).
template <typename T, int D, bool kDrop>
Status BackwardKernels(cudaStream_t stream, T* dqkv, const T* dout, const T* qkv, const float* lse,
                       const float* dvec, const int32_t* mask, int B, int L, int H, int nh, const KernelDrop& kd) {
  const dim3 grid((L + kBlockRows - 1) / kBlockRows, nh, B);
  const float scale = 1.0f / std::sqrt(float(D));
  FlashBackwardKVKernel<T, D, kDrop><<<grid, kThreads, 0, stream>>>(dqkv, dout, qkv, lse, dvec, mask, L, H, nh,
                                                                    scale, kd);
  DGCA_RETURN_IF_ERROR(Launched("FlashBackwardKVKernel"));
  FlashBackwardQKernel<T, D, kDrop><<<grid, kThreads, 0, stream>>>(dqkv, dout, qkv, lse, dvec, mask, L, H, nh,
                                                                   scale, kd);
  return Launched("FlashBackwardQKernel");
}

template <typename T, int D>
Status Backward(cudaStream_t stream, T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                const int32_t* mask, int B, int L, int H, int nh, float* dvec, const AttentionDropout& drop) {
  const int64_t rows = int64_t(B) * L * nh;
  RowDotKernel<T, D><<<unsigned((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(dvec, dout, out, L, nh, rows);
  DGCA_RETURN_IF_ERROR(Launched("RowDotKernel"));
  if (drop.on())
    return BackwardKernels<T, D, true>(stream, dqkv, dout, qkv, lse, dvec, mask, B, L, H, nh, ResolveDrop(drop));
  return BackwardKernels<T, D, false>(stream, dqkv, dout, qkv, lse, dvec, mask, B, L, H, nh, KernelDrop());
}

}  // namespace

bool FusedAttentionSupported(DType type, int L, int H, int nh) {
  return type != DType::kF32 && FusedAttentionShape(L, H, nh);
}

template <typename T>
Status FusedAttentionForward(cudaStream_t stream, T* out, float* lse, const T* qkv, const int32_t* mask,
                             int B, int L, int H, int nh, const AttentionDropout& drop) {
  DGCA_RETURN_IF_ERROR(CheckShape(kDType<T>, B, L, H, nh, {out, qkv}, {lse, mask}));
  if (B == 0) return OkStatus();
  switch (H / nh) {
    case 64: return Forward<T, 64>(stream, out, lse, qkv, mask, B, L, H, nh, drop);
    case 32: return Forward<T, 32>(stream, out, lse, qkv, mask, B, L, H, nh, drop);
    default: return Forward<T, 16>(stream, out, lse, qkv, mask, B, L, H, nh, drop);
  }
}

template <typename T>
Status FusedAttentionBackward(cudaStream_t stream, T* dqkv, const T* dout, const T* qkv, const T* out,
                              const float* lse, const int32_t* mask, int B, int L, int H, int nh,
                              float* scratch, const AttentionDropout& drop) {
  DGCA_RETURN_IF_ERROR(CheckShape(kDType<T>, B, L, H, nh, {dqkv, dout, qkv, out}, {lse, mask, scratch}));
  if (B == 0) return OkStatus();
  switch (H / nh) {
    case 64: return Backward<T, 64>(stream, dqkv, dout, qkv, out, lse, mask, B, L, H, nh, scratch, drop);
    case 32: return Backward<T, 32>(stream, dqkv, dout, qkv, out, lse, mask, B, L, H, nh, scratch, drop);
    default: return Backward<T, 16>(stream, dqkv, dout, qkv, out, lse, mask, B, L, H, nh, scratch, drop);
  }
}

#define DGCA_INSTANTIATE(T)                                                                                 \
  template Status FusedAttentionForward<T>(cudaStream_t, T*, float*, const T*, const int32_t*, int, int, int, \
                                           int, const AttentionDropout&);                                  \
  template Status FusedAttentionBackward<T>(cudaStream_t, T*, const T*, const T*, const T*, const float*,    \
                                            const int32_t*, int, int, int, int, float*, const AttentionDropout&);
DGCA_INSTANTIATE(bf16)
DGCA_INSTANTIATE(__half)
#undef DGCA_INSTANTIATE

}  // namespace cuda
}  // namespace dgca
