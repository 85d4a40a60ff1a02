// Fused attention kernels (flash_attention.h says what and why), written
// as FlashAttention-2 does: a block of 4 warps owns 64 rows of one
// (batch, head) — 16 rows per warp — and streams the other side (keys, or
// queries in the dK/dV kernel) through shared memory a tile at a time.
// Every product is mma.sync m16n8k16 on operands loaded with ldmatrix
// (model/cuda/mma_fragments.cuh), whose register layout is documented: a
// lane holds rows g = lane/4 and g+8 of each accumulator, so the softmax
// and the gradient of the scores are computed in registers (the row's four
// lanes combine with two shuffles), and a score accumulator becomes the
// next product's A operand (PackA) without a trip through shared memory.
// The warp's own rows (queries, or keys and values) are loaded into
// registers once.
//
// Exponentials are base 2 on scores pre-multiplied by scale * log2(e)
// (one FFMA + EX2 per score instead of a multiply, a subtract and expf);
// the log-sum-exp stored for the backward is natural-log.
#include "model/cuda/flash_attention.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>

#include "model/core/config.h"
#include "model/core/dropout.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/mma_fragments.cuh"

namespace dgca {
namespace cuda {
namespace {

using mma::FragA;
using mma::FragB;
using mma::FragC;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpRows = 16;                   // rows a warp owns: one mma tile high
constexpr int kBlockRows = kWarps * kWarpRows;  // rows a block owns
constexpr int kForwardKeyTile = 64;             // keys streamed per step by the forward
constexpr int kBackwardTile = 32;               // rows streamed per step by the backward kernels
// (the backward keeps two score-sized accumulators, S and dP, live per
// step next to its one or two operand and result fragment sets; at 64 the
// dK/dV kernel at d = 64 would not fit 255 registers without spilling.
// ptxas's counts per kernel: ctest cuda_kernel_resources prints them.)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Shared-memory row pitch of a [rows, D] tile: D + 8 elements keeps each
// row 16-byte aligned (ldmatrix) and puts the 8 rows one ldmatrix reads
// in 8 different 16-byte bank groups ((D + 8) * 2 / 16 is odd for D = 16,
// 32, 64).
template <int D>
constexpr int kPitch = D + 8;

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

// keep[j] = whether key k0 + j (of a tile of kTile) exists and is real
// (keys_real: the batch row's mask). The block's first kTile threads.
template <int kTile>
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

// Tiles of kTile keys that hold keys 0..last.
template <int kTile>
__device__ __forceinline__ int KeyTiles(int last) {
  return (last + kTile) / kTile;
}

template <int N>
__device__ __forceinline__ void Zero(FragC (&acc)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) mma::Zero(acc[n]);
}

// The warp's 16 rows of a [16, D] tile at `rows` (pitch kPitch<D>) as D/16
// A fragments (one per 16 columns). The whole warp.
template <int D>
__device__ __forceinline__ void LoadRowsA(FragA (&a)[D / 16], const void* rows_base) {
  const int lane = threadIdx.x & 31;
  const char* base = static_cast<const char*>(rows_base);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    // Matrix i = lane / 8: rows 0..7 (i even) or 8..15, columns 16kk (i < 2) or 16kk + 8.
    const int row = lane % 16, col = kk * 16 + (lane / 16) * 8;
    mma::LdMatrixX4(a[kk].x, base + 2 * (row * kPitch<D> + col));
  }
}

// acc[j] += a * B[:, 8j..8j+8) for N score columns: a [16, D] (D/16 A
// fragments), B = tile^T, tile [N, D] in shared memory (pitch kPitch<D>):
// scores of the warp's rows against N streamed rows. The whole warp.
template <typename T, int D, int N>
__device__ __forceinline__ void ProductNT(FragC (&acc)[N / 8], const FragA (&a)[D / 16], const T* tile) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int j = 0; j < N / 8; j += 2) {
      // Matrices: rows 8j..8j+7 (lane < 16) or 8j+8.., columns 16kk or 16kk + 8 (by lane / 8 odd).
      const int row = j * 8 + (lane % 8) + 8 * (lane / 16), col = kk * 16 + 8 * ((lane / 8) % 2);
      uint32_t r[4];
      mma::LdMatrixX4(r, tile + row * kPitch<D> + col);
      mma::Mma<T>(acc[j], a[kk], FragB{{r[0], r[1]}});
      mma::Mma<T>(acc[j + 1], a[kk], FragB{{r[2], r[3]}});
    }
  }
}

// acc[n] += A * tile[:, 8n..8n+8) for the [16, D] result: A [16, N] given
// as N/8 accumulators (rounded to T here), tile [N, D] row-major in shared
// memory (pitch kPitch<D>). The whole warp.
template <typename T, int D, int N>
__device__ __forceinline__ void ProductNN(FragC (&acc)[D / 8], const FragC (&a)[N / 8], const T* tile) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ks = 0; ks < N / 16; ++ks) {
    const FragA fa = mma::PackA<T>(a[2 * ks], a[2 * ks + 1]);
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      // Transposed matrices: rows 16ks..+7 or +8..+15 (by lane / 8 odd), columns 8n (lane < 16) or 8n + 8.
      const int row = ks * 16 + (lane % 8) + 8 * ((lane / 8) % 2), col = n * 8 + 8 * (lane / 16);
      uint32_t r[4];
      mma::LdMatrixX4Trans(r, tile + row * kPitch<D> + col);
      mma::Mma<T>(acc[n], fa, FragB{{r[0], r[1]}});
      mma::Mma<T>(acc[n + 1], fa, FragB{{r[2], r[3]}});
    }
  }
}

// Writes the warp's [16, D] result (acc, row g scaled by mult[0], row g+8
// by mult[1]) as T to dst (row stride ld), rows [0, valid) only, through
// `stage` (the warp's own 16 rows of a shared tile, pitch kPitch<D>, no
// longer read) so every global store is 16 bytes. The whole warp.
template <typename T, int D>
__device__ __forceinline__ void WriteRows(T* dst, int64_t ld, int valid, const FragC (&acc)[D / 8],
                                          const float (&mult)[2], T* stage) {
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
  // Orders the warp's earlier ldmatrix reads of `stage` (LoadRowsA) before
  // these stores: with no key tile streamed there was no barrier between.
  __syncwarp();
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)  // a lane's two adjacent columns: one 32-bit store
      *reinterpret_cast<uint32_t*>(stage + (g + 8 * rr) * kPitch<D> + n * 8 + 2 * t) =
          mma::Pack<T>(acc[n].x[2 * rr] * mult[rr], acc[n].x[2 * rr + 1] * mult[rr]);
  __syncwarp();
  for (int i = lane; i < kWarpRows * (D / 8); i += 32) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    if (r < valid) *reinterpret_cast<uint4*>(dst + r * ld + c) = *reinterpret_cast<const uint4*>(stage + r * kPitch<D> + c);
  }
  __syncwarp();
}

// The maximum over the four lanes that share a row (lanes 4g..4g+3).
__device__ __forceinline__ float RowMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float RowSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Grid (ceil(L/64), nh, B). out and lse for 64 queries of one head, in
// one pass over the keys with the online softmax: per row the running
// max m and sum l (of exp(s - m)); a key tile that raises m rescales l
// and the output accumulator by exp(m_old - m_new); out = acc / l at the
// end. P V uses P rounded to T (unnormalized, values in [0, 1]); with
// kDrop, P * M / (1-p), while l sums the unmasked P (lse is the unmasked
// softmax's).
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(T* out, float* lse, const T* qkv, const int32_t* mask, int L, int H, int nh, float scale,
                       KernelDrop drop) {
  constexpr int P = kPitch<D>;
  constexpr int KT = kForwardKeyTile;
  __shared__ __align__(16) T q_s[kBlockRows * P];
  __shared__ __align__(16) T k_s[KT * P];
  __shared__ __align__(16) T v_s[KT * P];
  __shared__ int keep_s[KT];
  __shared__ int last_s[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kBlockRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / 4, t4 = lane % 4;
  const int64_t H3 = 3 * int64_t(H);
  const T* base = qkv + int64_t(b) * L * H3 + int64_t(h) * D;
  const int32_t* keys_real = mask + int64_t(b) * L;
  LoadTile<T, D>(q_s, base + q0 * H3, H3, kBlockRows, min(kBlockRows, L - q0));
  const int tiles = KeyTiles<KT>(LastRealKey(keys_real, L, last_s));  // syncs: q_s is loaded
  T* q_w = q_s + warp * kWarpRows * P;
  FragA qa[D / 16];
  LoadRowsA<D>(qa, q_w);
  const int row0 = q0 + warp * kWarpRows;
  const uint64_t site = DropSite<kDrop>(drop, b);
  const float sl2 = scale * kLog2e;

  float m[2] = {-INFINITY, -INFINITY};  // rows g and g+8: running max of s * scale * log2(e)
  float l[2] = {0.0f, 0.0f};            // this lane's part of the running sum
  FragC o[D / 8];
  Zero(o);
  for (int t = 0; t < tiles; ++t) {
    const int k0 = t * KT, valid = min(KT, L - k0);
    __syncthreads();  // k_s, v_s and keep_s of the previous tile are no longer read
    LoadTile<T, D>(k_s, base + H + k0 * H3, H3, KT, valid);
    LoadTile<T, D>(v_s, base + 2 * H + k0 * H3, H3, KT, valid);
    KeepKeys<KT>(keep_s, keys_real, k0, L);
    __syncthreads();
    FragC s[KT / 8];
    Zero(s);
    ProductNT<T, D, KT>(s, qa, k_s);
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < KT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = keep_s[j * 8 + 2 * t4 + (e % 2)] ? s[j].x[e] * sl2 : -INFINITY;
        s[j].x[e] = x;
        tmax[e / 2] = fmaxf(tmax[e / 2], x);
      }
    float mu[2], alpha[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const float nm = fmaxf(m[rr], RowMax(tmax[rr]));
      mu[rr] = nm == -INFINITY ? 0.0f : nm;  // no real key yet: every exp2 below is of -inf
      alpha[rr] = exp2f(m[rr] - mu[rr]);     // 0 while m is -inf
      m[rr] = nm;
      l[rr] *= alpha[rr];
    }
#pragma unroll
    for (int j = 0; j < KT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[j].x[e] - mu[e / 2]);
        l[e / 2] += p;
        if constexpr (kDrop) {
          const int row = row0 + g + 8 * (e / 2), key = k0 + j * 8 + 2 * t4 + (e % 2);
          p = DropoutKeep(site, DropoutProbsIndex(h, row, key), drop.threshold) ? p * drop.scale : 0.0f;
        }
        s[j].x[e] = p;
      }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n].x[e] *= alpha[e / 2];
    ProductNN<T, D, KT>(o, s, v_s);
  }
  float inv[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const float sum = RowSum(l[rr]);
    inv[rr] = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int row = row0 + g + 8 * rr;
    if (t4 == 0 && row < L) lse[(int64_t(b) * nh + h) * L + row] = sum > 0.0f ? (m[rr] + log2f(sum)) * kLn2 : INFINITY;
  }
  WriteRows<T, D>(out + (int64_t(b) * L + row0) * H + int64_t(h) * D, H, L - row0, o, inv, q_w);
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
// query (32 at a time): P^T = exp(K Q^T * scale - lse) (zero for padding
// keys), dV = P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D),
// dK = scale dS^T Q. With kDrop (mask M, scale s = 1/(1-p)):
// dV = (P o M s)^T dO and dS^T = P^T (M s dP^T - D); D = rowsum(dO O)
// holds as it is, O being the masked forward's output.
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKVKernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dvec,
                          const int32_t* mask, int L, int H, int nh, float scale, KernelDrop drop) {
  constexpr int P = kPitch<D>;
  constexpr int QT = kBackwardTile;
  __shared__ __align__(16) T k_s[kBlockRows * P];
  __shared__ __align__(16) T v_s[kBlockRows * P];
  __shared__ __align__(16) T q_s[QT * P];
  __shared__ __align__(16) T do_s[QT * P];
  __shared__ float lse_s[QT];  // scaled by log2(e)
  __shared__ float d_s[QT];
  __shared__ int last_s[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * kBlockRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / 4, t4 = lane % 4;
  const int64_t H3 = 3 * int64_t(H);
  const T* base = qkv + int64_t(b) * L * H3 + int64_t(h) * D;
  const T* obase = dout + int64_t(b) * L * H + int64_t(h) * D;
  const float* lse_bh = lse + (int64_t(b) * nh + h) * L;
  const float* d_bh = dvec + (int64_t(b) * nh + h) * L;
  const int valid_keys = min(kBlockRows, L - k0);
  LoadTile<T, D>(k_s, base + H + k0 * H3, H3, kBlockRows, valid_keys);
  LoadTile<T, D>(v_s, base + 2 * H + k0 * H3, H3, kBlockRows, valid_keys);
  // A block of keys after the row's last real key: every probability is
  // zero, so are dK and dV (written below without streaming the queries).
  const int tiles = LastRealKey(mask + int64_t(b) * L, L, last_s) < k0 ? 0 : (L + QT - 1) / QT;  // syncs
  T* k_w = k_s + warp * kWarpRows * P;
  T* v_w = v_s + warp * kWarpRows * P;
  FragA ka[D / 16], va[D / 16];
  LoadRowsA<D>(ka, k_w);
  LoadRowsA<D>(va, v_w);
  const int row0 = k0 + warp * kWarpRows;
  bool keep[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int key = row0 + g + 8 * rr;
    keep[rr] = key < L && mask[int64_t(b) * L + key] != 0;
  }
  const uint64_t site = DropSite<kDrop>(drop, b);
  const float sl2 = scale * kLog2e;
  FragC dk[D / 8], dv[D / 8];
  Zero(dk);
  Zero(dv);
  for (int t = 0; t < tiles; ++t) {
    const int q0 = t * QT, valid = min(QT, L - q0);
    __syncthreads();  // the previous tile's q_s, do_s, lse_s, d_s are no longer read
    LoadTile<T, D>(q_s, base + q0 * H3, H3, QT, valid);
    LoadTile<T, D>(do_s, obase + q0 * int64_t(H), H, QT, valid);
    if (threadIdx.x < QT) {
      const int q = q0 + threadIdx.x;
      lse_s[threadIdx.x] = q < L ? lse_bh[q] * kLog2e : INFINITY;
      d_s[threadIdx.x] = q < L ? d_bh[q] : 0.0f;
    }
    __syncthreads();
    FragC s[QT / 8], dp[QT / 8];
    Zero(s);
    Zero(dp);
    ProductNT<T, D, QT>(s, ka, q_s);    // S^T = K Q^T
    ProductNT<T, D, QT>(dp, va, do_s);  // dP^T = V dO^T
#pragma unroll
    for (int j = 0; j < QT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + 2 * t4 + (e % 2);  // the query, in the tile
        // P rounded to T, as the forward multiplied it and as the GEMM
        // version stores it: dS from the unrounded P drifts from both.
        const float p = keep[e / 2] ? ToF(FromF<T>(exp2f(s[j].x[e] * sl2 - lse_s[col]))) : 0.0f;
        float dpv = dp[j].x[e], pv = p;
        if constexpr (kDrop) {
          const bool kept = DropoutKeep(site, DropoutProbsIndex(h, q0 + col, row0 + g + 8 * (e / 2)), drop.threshold);
          dpv = kept ? dpv * drop.scale : 0.0f;
          pv = kept ? p * drop.scale : 0.0f;
        }
        s[j].x[e] = pv;                      // (P o M s)^T, for dV
        dp[j].x[e] = p * (dpv - d_s[col]);  // dS^T, for dK
      }
    ProductNN<T, D, QT>(dv, s, do_s);  // dV += P^T dO
    ProductNN<T, D, QT>(dk, dp, q_s);  // dK += dS^T Q
  }
  T* dst = dqkv + (int64_t(b) * L + row0) * H3 + int64_t(h) * D;
  const float kscale[2] = {scale, scale}, one[2] = {1.0f, 1.0f};
  WriteRows<T, D>(dst + H, H3, L - row0, dk, kscale, k_w);
  WriteRows<T, D>(dst + 2 * H, H3, L - row0, dv, one, v_w);
}

// Grid (ceil(L/64), nh, B). dQ of 64 queries of one head, over every key
// (32 at a time): P = exp(Q K^T * scale - lse), dP = dO V^T,
// dS = P (dP - D), dQ = scale dS K; with kDrop dS = P (M s dP - D).
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dvec,
                         const int32_t* mask, int L, int H, int nh, float scale, KernelDrop drop) {
  constexpr int P = kPitch<D>;
  constexpr int KT = kBackwardTile;
  __shared__ __align__(16) T q_s[kBlockRows * P];
  __shared__ __align__(16) T do_s[kBlockRows * P];
  __shared__ __align__(16) T k_s[KT * P];
  __shared__ __align__(16) T v_s[KT * P];
  __shared__ int keep_s[KT];
  __shared__ int last_s[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kBlockRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / 4, t4 = lane % 4;
  const int64_t H3 = 3 * int64_t(H);
  const T* base = qkv + int64_t(b) * L * H3 + int64_t(h) * D;
  const int32_t* keys_real = mask + int64_t(b) * L;
  const int valid_rows = min(kBlockRows, L - q0);
  LoadTile<T, D>(q_s, base + q0 * H3, H3, kBlockRows, valid_rows);
  LoadTile<T, D>(do_s, dout + (int64_t(b) * L + q0) * H + int64_t(h) * D, H, kBlockRows, valid_rows);
  const int tiles = KeyTiles<KT>(LastRealKey(keys_real, L, last_s));  // syncs: q_s, do_s are loaded
  T* q_w = q_s + warp * kWarpRows * P;
  FragA qa[D / 16], da[D / 16];
  LoadRowsA<D>(qa, q_w);
  LoadRowsA<D>(da, do_s + warp * kWarpRows * P);
  const int row0 = q0 + warp * kWarpRows;
  const int64_t bh = int64_t(b) * nh + h;
  float row_lse[2], row_d[2];  // row_lse scaled by log2(e)
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = row0 + g + 8 * rr;
    row_lse[rr] = row < L ? lse[bh * L + row] * kLog2e : INFINITY;
    row_d[rr] = row < L ? dvec[bh * L + row] : 0.0f;
  }
  const uint64_t site = DropSite<kDrop>(drop, b);
  const float sl2 = scale * kLog2e;
  FragC dq[D / 8];
  Zero(dq);
  for (int t = 0; t < tiles; ++t) {
    const int k0 = t * KT, valid = min(KT, L - k0);
    __syncthreads();
    LoadTile<T, D>(k_s, base + H + k0 * H3, H3, KT, valid);
    LoadTile<T, D>(v_s, base + 2 * H + k0 * H3, H3, KT, valid);
    KeepKeys<KT>(keep_s, keys_real, k0, L);
    __syncthreads();
    FragC s[KT / 8], dp[KT / 8];
    Zero(s);
    Zero(dp);
    ProductNT<T, D, KT>(s, qa, k_s);   // S = Q K^T
    ProductNT<T, D, KT>(dp, da, v_s);  // dP = dO V^T
#pragma unroll
    for (int j = 0; j < KT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + 2 * t4 + (e % 2);  // the key, in the tile
        const float p = keep_s[col] ? ToF(FromF<T>(exp2f(s[j].x[e] * sl2 - row_lse[e / 2]))) : 0.0f;  // as the dK/dV kernel
        float dpv = dp[j].x[e];
        if constexpr (kDrop)
          dpv = DropoutKeep(site, DropoutProbsIndex(h, row0 + g + 8 * (e / 2), k0 + col), drop.threshold)
                    ? dpv * drop.scale
                    : 0.0f;
        s[j].x[e] = p * (dpv - row_d[e / 2]);  // dS
      }
    ProductNN<T, D, KT>(dq, s, k_s);  // dQ += dS K
  }
  const float qscale[2] = {scale, scale};
  WriteRows<T, D>(dqkv + (int64_t(b) * L + row0) * H3 + int64_t(h) * D, H3, L - row0, dq, qscale, q_w);
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
