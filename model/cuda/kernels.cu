// CUDA kernels mirroring model/cpu/ops.cc. Straightforward first versions:
// correct, coalesced, fp32 arithmetic; the fused and vectorized versions
// (16-byte accesses, persistent grids) come with the CUDA
// model once there is a GPU to time them on.
#include "model/cuda/kernels.h"

#include <cfloat>
#include <cmath>

#include "model/cuda/cuda_context.h"
#include "model/cuda/warp_reduce.cuh"

namespace dgca {
namespace cuda {
namespace {

int Blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b > 65535 * 16 ? 65535 * 16 : b);  // grid-stride beyond
}

template <typename T>
__global__ void CastFromFloatKernel(T* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = FromF<T>(inp[i]);
}

// One warp per row. Two passes over the row (mean, then centered variance:
// the CPU kernel accumulates in double; two-pass fp32 is close enough for
// the 1e-4 budget at c <= a few thousand).
template <typename T>
__global__ void LayerNormForwardKernel(T* out, float* mean, float* rstd, const T* inp,
                                       const T* gamma, const T* beta, int n, int c, float eps) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const T* x = inp + int64_t(row) * c;
  float s = 0.0f;
  for (int i = lane; i < c; i += 32) s += ToF(x[i]);
  const float mu = WarpSum(s) / c;
  float q = 0.0f;
  for (int i = lane; i < c; i += 32) { const float d = ToF(x[i]) - mu; q += d * d; }
  const float rs = rsqrtf(WarpSum(q) / c + eps);
  T* y = out + int64_t(row) * c;
  for (int i = lane; i < c; i += 32)
    y[i] = FromF<T>((ToF(x[i]) - mu) * rs * ToF(gamma[i]) + ToF(beta[i]));
  if (lane == 0) { mean[row] = mu; rstd[row] = rs; }
}

// dinp = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)), one warp per row.
template <typename T>
__global__ void LayerNormBackwardDinpKernel(T* dinp, bool accumulate, const T* dout, const T* inp,
                                            const T* gamma, const float* mean, const float* rstd,
                                            int n, int c) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const int64_t off = int64_t(row) * c;
  const float mu = mean[row], rs = rstd[row];
  float a = 0.0f, b = 0.0f;
  for (int i = lane; i < c; i += 32) {
    const float gdy = ToF(gamma[i]) * ToF(dout[off + i]);
    a += gdy;
    b += gdy * (ToF(inp[off + i]) - mu) * rs;
  }
  a = WarpSum(a) / c;
  b = WarpSum(b) / c;
  for (int i = lane; i < c; i += 32) {
    const float xhat = (ToF(inp[off + i]) - mu) * rs;
    float d = rs * (ToF(gamma[i]) * ToF(dout[off + i]) - a - xhat * b);
    if (accumulate) d += ToF(dinp[off + i]);
    dinp[off + i] = FromF<T>(d);
  }
}

// Column reductions over many rows (LayerNorm's dgamma/dbeta, bias grads),
// in two stages so that the whole GPU works on them (one block per column
// tile left 24 blocks busy for H = 768 and 16k rows):
//   1. block (column tile, chunk) sums rows [chunk*kColumnChunkRows, ...)
//      of kColTile columns: its kRowLanes thread rows take every
//      kRowLanes-th row in order, then the lanes are added in lane order;
//      the chunk's sums go to `part` [nchunks, cols] (or straight into dst
//      when there is one chunk);
//   2. a thread per column adds the chunks in order into dst.
// Deterministic: the order depends only on the sizes.
constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

int ColumnChunks(int rows) { return (rows + kColumnChunkRows - 1) / kColumnChunkRows; }

// Column sums of up to two [rows, cols] quantities per block (Q = 1: the
// values; Q = 2 for LayerNorm: dy * xhat and dy).
template <typename T, bool kLayerNorm>
__global__ void ColumnPartialKernel(float* part0, float* part1, float* dst0, float* dst1, const T* src,
                                    const T* inp, const float* mean, const float* rstd, int rows,
                                    int cols) {
  __shared__ float s0[kRowLanes][kColTile + 1];
  __shared__ float s1[kRowLanes][kColTile + 1];
  const int col = blockIdx.x * kColTile + threadIdx.x;
  const int r0 = blockIdx.y * kColumnChunkRows;
  const int r1 = min(rows, r0 + kColumnChunkRows);
  float a = 0.0f, b = 0.0f;
  if (col < cols) {
    for (int r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float v = ToF(src[int64_t(r) * cols + col]);
      if (kLayerNorm) a += v * (ToF(inp[int64_t(r) * cols + col]) - mean[r]) * rstd[r];
      b += v;
    }
  }
  s0[threadIdx.y][threadIdx.x] = a;
  s1[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float ta = 0.0f, tb = 0.0f;
    for (int l = 0; l < kRowLanes; ++l) {
      ta += s0[l][threadIdx.x];
      tb += s1[l][threadIdx.x];
    }
    if (gridDim.y == 1) {  // one chunk: no second stage
      if (kLayerNorm && dst0 != nullptr) dst0[col] += ta;
      if (dst1 != nullptr) dst1[col] += tb;
    } else {
      const int64_t o = int64_t(blockIdx.y) * cols + col;
      if (kLayerNorm) part0[o] = ta;
      part1[o] = tb;
    }
  }
}

__global__ void ColumnFinishKernel(float* dst0, float* dst1, const float* part0, const float* part1,
                                   int nchunks, int cols) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float a = 0.0f, b = 0.0f;
  for (int c = 0; c < nchunks; ++c) {
    if (dst0 != nullptr) a += part0[int64_t(c) * cols + col];
    if (dst1 != nullptr) b += part1[int64_t(c) * cols + col];
  }
  if (dst0 != nullptr) dst0[col] += a;
  if (dst1 != nullptr) dst1[col] += b;
}

// The launches of both stages; dst0/part0 only with kLayerNorm.
template <typename T, bool kLayerNorm>
Status ColumnReduce(cudaStream_t stream, float* dst0, float* dst1, const T* src, const T* inp,
                    const float* mean, const float* rstd, int rows, int cols, float* scratch,
                    const char* what) {
  const int nchunks = ColumnChunks(rows);
  float* part0 = nullptr;
  float* part1 = nullptr;
  if (nchunks > 1) {
    part0 = kLayerNorm ? scratch : nullptr;
    part1 = kLayerNorm ? scratch + int64_t(nchunks) * cols : scratch;
  }
  if (nchunks > 1 && scratch == nullptr)
    return InvalidArgumentError(std::string(what) + ": " + std::to_string(rows) + " rows need scratch (" +
                                std::to_string(ColumnSumScratchElems(rows, cols)) + " floats per sum)");
  ColumnPartialKernel<T, kLayerNorm><<<dim3((cols + kColTile - 1) / kColTile, nchunks), dim3(kColTile, kRowLanes),
                                       0, stream>>>(part0, part1, dst0, dst1, src, inp, mean, rstd, rows, cols);
  DGCA_RETURN_IF_ERROR(Launched(what));
  if (nchunks == 1) return OkStatus();
  ColumnFinishKernel<<<(cols + 255) / 256, 256, 0, stream>>>(dst0, dst1, part0, part1, nchunks, cols);
  return Launched(what);
}

template <typename T>
__global__ void GeluForwardKernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = ToF(inp[i]);
    out[i] = FromF<T>(0.5f * x * (1.0f + erff(x * 0.70710678118654752f)));
  }
}
template <typename T>
__global__ void GeluBackwardKernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = ToF(inp[i]);
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
    dinp[i] = FromF<T>(ToF(dout[i]) * (cdf + x * pdf));
  }
}

// One block per row; mask (nullable) is indexed [row / (nh*L) * L + j] and
// masks key j when 0.
template <typename T>
__global__ void SoftmaxKernel(T* out, const T* inp, int cols, const int32_t* mask, int rows_per_batch) {
  __shared__ float sh[32];
  const int64_t off = int64_t(blockIdx.x) * cols;
  const int32_t* mrow = mask != nullptr ? mask + int64_t(blockIdx.x / rows_per_batch) * cols : nullptr;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    if (mrow == nullptr || mrow[j] != 0) mx = fmaxf(mx, ToF(inp[off + j]));
  mx = BlockReduce<true>(mx, sh);
  float s = 0.0f;
  if (mx != -INFINITY) {
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
      if (mrow == nullptr || mrow[j] != 0) s += expf(ToF(inp[off + j]) - mx);
  }
  s = BlockReduce<false>(s, sh);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const bool keep = (mrow == nullptr || mrow[j] != 0) && mx != -INFINITY;
    out[off + j] = FromF<T>(keep ? expf(ToF(inp[off + j]) - mx) * inv : 0.0f);
  }
}

int SoftmaxThreads(int cols) {
  int t = 32;
  while (t < cols && t < 512) t *= 2;
  return t;
}

template <typename T, bool kAdd>
__global__ void EmbeddingKernel(T* out, const int32_t* ids, const T* table, int n, int c) {
  const int64_t total = int64_t(n) * c;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, col = i % c;
    const float t = ToF(table[int64_t(ids[r]) * c + col]);
    out[i] = FromF<T>(kAdd ? ToF(out[i]) + t : t);
  }
}
template <typename T>
__global__ void EmbeddingBackwardColumnKernel(float* dtable, const int32_t* ids, const T* dout, int n, int c) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= c) return;
  for (int r = 0; r < n; ++r) {
    const int id = ids[r];
    if (id >= 0) dtable[int64_t(id) * c + col] += ToF(dout[int64_t(r) * c + col]);
  }
}
template <typename T>
__global__ void EmbeddingBackwardAtomicKernel(float* dtable, const int32_t* ids, const T* dout, int n, int c) {
  const int64_t total = int64_t(n) * c;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, col = i % c;
    const int id = ids[r];
    if (id >= 0) atomicAdd(dtable + int64_t(id) * c + col, ToF(dout[i]));
  }
}

template <typename T>
__global__ void BiasAddKernel(T* out, const T* bias, int n, int c) {
  const int64_t total = int64_t(n) * c;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = FromF<T>(ToF(out[i]) + ToF(bias[i % c]));
}
// One block per row: max, sum of exp, then loss and (softmax - onehot)*dscale.
template <typename T>
__global__ void CrossEntropyKernel(float* row_loss, T* dlogits, const T* logits,
                                   const int32_t* targets, int v, float dscale) {
  __shared__ float sh[32];
  const int64_t off = int64_t(blockIdx.x) * v;
  const int t = targets[blockIdx.x];
  if (t < 0 || t >= v) {  // ignored row (ignore_index -100 or any negative)
    if (threadIdx.x == 0) row_loss[blockIdx.x] = 0.0f;
    if (dlogits != nullptr)
      for (int j = threadIdx.x; j < v; j += blockDim.x) dlogits[off + j] = FromF<T>(0.0f);
    return;
  }
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, ToF(logits[off + j]));
  mx = BlockReduce<true>(mx, sh);
  float s = 0.0f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) s += expf(ToF(logits[off + j]) - mx);
  s = BlockReduce<false>(s, sh);
  const float lse = mx + logf(s);
  const float xt = ToF(logits[off + t]);  // read before dlogits (may alias) is written
  __syncthreads();
  if (threadIdx.x == 0) row_loss[blockIdx.x] = lse - xt;
  if (dlogits != nullptr) {
    const float inv = 1.0f / s;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
      const float p = expf(ToF(logits[off + j]) - mx) * inv;
      dlogits[off + j] = FromF<T>((p - (j == t ? 1.0f : 0.0f)) * dscale);
    }
  }
}

template <typename H>
__global__ void AdamWKernel(float* param, float* m, float* v, const float* grad, H* out,
                            int64_t n, float lr, float b1, float b2, float eps, float decay,
                            float step_size, float inv_sqrt_bc2, float grad_scale, DecayRuns runs) {
  const int64_t block_start = blockIdx.x * int64_t(blockDim.x);
  if (block_start >= n) return;
  // The run holding the block's first element, by a binary search every
  // thread of the block does alike (the same addresses: broadcast loads);
  // each thread's elements come after it, so their runs are found by
  // stepping forward (bounded by the table: its last end is n).
  int k = 0;
  if (runs.runs > 0) {
    int hi = runs.runs - 1;
    while (k < hi) {
      const int mid = (k + hi) / 2;
      if (runs.run_ends[mid] > block_start) hi = mid; else k = mid + 1;
    }
  }
  for (int64_t i = block_start + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float d = decay;
    if (runs.runs > 0) {
      while (k + 1 < runs.runs && runs.run_ends[k] <= i) ++k;
      if (((k % 2) == 0) != runs.first_decays) d = 0.0f;
    }
    const float g = grad[i] * grad_scale;
    float p = param[i];
    if (d != 0.0f) p -= d * p;  // decoupled, before the Adam update
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    param[i] = p;
    if (out != nullptr) out[i] = FromF<H>(p);
  }
}

// Each block's sum of squares into partials[blockIdx.x]; SumPartialsKernel
// adds them in a fixed order (no atomics: the same gradients give the same
// norm bit for bit, which deterministic mode promises).
__global__ void SumSquaresKernel(double* partials, const float* x, int64_t n) {
  __shared__ float sh[32];
  float acc = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    acc += x[i] * x[i];
  }
  acc = BlockReduce<false>(acc, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = double(acc);
}

// One block of kSumSquaresMaxBlocks threads: a fixed tree over `count`
// partials, *out += their sum.
__global__ void __launch_bounds__(kSumSquaresMaxBlocks) SumPartialsKernel(double* out, const double* partials,
                                                                          int count) {
  __shared__ double sh[kSumSquaresMaxBlocks];
  const int t = threadIdx.x;
  sh[t] = t < count ? partials[t] : 0.0;
  for (int stride = kSumSquaresMaxBlocks / 2; stride > 0; stride >>= 1) {
    __syncthreads();
    if (t < stride) sh[t] += sh[t + stride];
  }
  if (t == 0) *out += sh[0];
}

__global__ void UnscaleCheckKernel(float* grad, int64_t n, float s, int32_t* found_inf) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = grad[i] * s;
    grad[i] = g;
    bad |= !isfinite(g);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *found_inf = 1;
}

template <typename T>
__global__ void SplitHeadsKernel(T* q, T* k, T* v, const T* qkv, int B, int L, int H, int nh) {
  const int d = H / nh;
  const int64_t total = int64_t(B) * L * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    // i indexes [B, L, H]; channel h*d+e goes to [b, h, l, e].
    const int64_t b = i / (int64_t(L) * H), rem = i % (int64_t(L) * H);
    const int l = int(rem / H), ch = int(rem % H), h = ch / d, e = ch % d;
    const int64_t src = (b * L + l) * 3 * H + ch;
    const int64_t dst = ((b * nh + h) * L + l) * d + e;
    q[dst] = qkv[src];
    k[dst] = qkv[src + H];
    v[dst] = qkv[src + 2 * H];
  }
}
template <typename T>
__global__ void MergeHeadsKernel(T* out, const T* ctx, int B, int L, int H, int nh) {
  const int d = H / nh;
  const int64_t total = int64_t(B) * L * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / (int64_t(L) * H), rem = i % (int64_t(L) * H);
    const int l = int(rem / H), ch = int(rem % H), h = ch / d, e = ch % d;
    out[i] = ctx[((b * nh + h) * L + l) * d + e];
  }
}

// Where element i of a [B, nh, L, d] head-major tensor (d = H / nh) sits
// in a [B * L, row_stride] row-major matrix whose head h occupies columns
// offset + h * d .. + d.
__device__ __forceinline__ int64_t HeadElementOffset(int64_t i, int64_t row_stride, int64_t offset, int L,
                                                     int d, int nh) {
  const int e = int(i % d);
  const int64_t bhl = i / d;
  const int l = int(bhl % L);
  const int64_t bh = bhl / L;
  const int h = int(bh % nh);
  const int64_t b = bh / nh;
  return (b * L + l) * row_stride + offset + h * d + e;
}
template <typename T>
__global__ void GatherHeadsKernel(T* dst, const T* src, int64_t row_stride, int64_t offset, int B, int L,
                                  int H, int nh) {
  const int64_t total = int64_t(B) * L * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[HeadElementOffset(i, row_stride, offset, L, H / nh, nh)];
}
template <typename T>
__global__ void ScatterHeadsKernel(T* dst, int64_t row_stride, int64_t offset, const T* src, int B, int L,
                                   int H, int nh) {
  const int64_t total = int64_t(B) * L * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    dst[HeadElementOffset(i, row_stride, offset, L, H / nh, nh)] = src[i];
}
// One block per row.
template <typename T>
__global__ void SoftmaxBackwardKernel(T* dscores, const T* probs, const T* dprobs, int cols) {
  __shared__ float sh[32];
  const int64_t off = int64_t(blockIdx.x) * cols;
  float dot = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) dot += ToF(probs[off + j]) * ToF(dprobs[off + j]);
  dot = BlockReduce<false>(dot, sh);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float p = ToF(probs[off + j]);
    dscores[off + j] = FromF<T>(p * (ToF(dprobs[off + j]) - dot));
  }
}

}  // namespace

int64_t ColumnSumScratchElems(int rows, int cols) {
  const int nchunks = ColumnChunks(rows);
  return nchunks > 1 ? int64_t(nchunks) * cols : 0;
}

template <typename T>
Status GatherHeads(cudaStream_t stream, T* dst, const T* src, int64_t row_stride, int64_t offset, int B, int L,
                   int H, int nh) {
  if (B <= 0) return OkStatus();
  GatherHeadsKernel<T><<<Blocks(int64_t(B) * L * H, 256), 256, 0, stream>>>(dst, src, row_stride, offset, B, L, H, nh);
  return Launched("GatherHeads");
}
template <typename T>
Status ScatterHeads(cudaStream_t stream, T* dst, int64_t row_stride, int64_t offset, const T* src, int B, int L,
                    int H, int nh) {
  if (B <= 0) return OkStatus();
  ScatterHeadsKernel<T><<<Blocks(int64_t(B) * L * H, 256), 256, 0, stream>>>(dst, row_stride, offset, src, B, L, H, nh);
  return Launched("ScatterHeads");
}
template <typename T>
Status SoftmaxBackward(cudaStream_t stream, T* dscores, const T* probs, const T* dprobs, int rows, int cols) {
  if (rows <= 0) return OkStatus();
  SoftmaxBackwardKernel<T><<<rows, SoftmaxThreads(cols), 0, stream>>>(dscores, probs, dprobs, cols);
  return Launched("SoftmaxBackward");
}

template <typename T>
Status CastFromFloat(cudaStream_t stream, T* out, const float* inp, int64_t n) {
  if (n <= 0) return OkStatus();
  CastFromFloatKernel<T><<<Blocks(n, 256), 256, 0, stream>>>(out, inp, n);
  return Launched("CastFromFloat");
}

template <typename T>
Status LayerNormForward(cudaStream_t stream, T* out, float* mean, float* rstd, const T* inp,
                        const T* gamma, const T* beta, int n, int c, float eps) {
  if (n <= 0) return OkStatus();
  LayerNormForwardKernel<T><<<(n + 7) / 8, 256, 0, stream>>>(out, mean, rstd, inp, gamma, beta, n, c, eps);
  return Launched("LayerNormForward");
}
template <typename T>
Status LayerNormBackward(cudaStream_t stream, T* dinp, bool accumulate, float* dgamma,
                         float* dbeta, const T* dout, const T* inp, const T* gamma,
                         const float* mean, const float* rstd, int n, int c, float* scratch) {
  if (n <= 0) return OkStatus();
  if (dinp != nullptr) {
    LayerNormBackwardDinpKernel<T><<<(n + 7) / 8, 256, 0, stream>>>(dinp, accumulate, dout, inp, gamma, mean, rstd, n, c);
    DGCA_RETURN_IF_ERROR(Launched("LayerNormBackward dinp"));
  }
  if (dgamma != nullptr || dbeta != nullptr) {
    return ColumnReduce<T, true>(stream, dgamma, dbeta, dout, inp, mean, rstd, n, c, scratch,
                                 "LayerNormBackward params");
  }
  return OkStatus();
}

template <typename T>
Status GeluForward(cudaStream_t stream, T* out, const T* inp, int64_t n) {
  if (n <= 0) return OkStatus();
  GeluForwardKernel<T><<<Blocks(n, 256), 256, 0, stream>>>(out, inp, n);
  return Launched("GeluForward");
}
template <typename T>
Status GeluBackward(cudaStream_t stream, T* dinp, const T* inp, const T* dout, int64_t n) {
  if (n <= 0) return OkStatus();
  GeluBackwardKernel<T><<<Blocks(n, 256), 256, 0, stream>>>(dinp, inp, dout, n);
  return Launched("GeluBackward");
}

template <typename T>
Status SoftmaxRows(cudaStream_t stream, T* out, const T* inp, int rows, int cols) {
  if (rows <= 0) return OkStatus();
  SoftmaxKernel<T><<<rows, SoftmaxThreads(cols), 0, stream>>>(out, inp, cols, nullptr, 1);
  return Launched("SoftmaxRows");
}
template <typename T>
Status MaskedSoftmax(cudaStream_t stream, T* probs, const T* scores, const int32_t* mask, int B,
                     int nh, int L) {
  if (B <= 0) return OkStatus();
  SoftmaxKernel<T><<<B * nh * L, SoftmaxThreads(L), 0, stream>>>(probs, scores, L, mask, nh * L);
  return Launched("MaskedSoftmax");
}

template <typename T>
Status EmbeddingForward(cudaStream_t stream, T* out, const int32_t* ids, const T* table, int n, int c) {
  if (n <= 0) return OkStatus();
  EmbeddingKernel<T, false><<<Blocks(int64_t(n) * c, 256), 256, 0, stream>>>(out, ids, table, n, c);
  return Launched("EmbeddingForward");
}
template <typename T>
Status EmbeddingAdd(cudaStream_t stream, T* out, const int32_t* ids, const T* table, int n, int c) {
  if (n <= 0) return OkStatus();
  EmbeddingKernel<T, true><<<Blocks(int64_t(n) * c, 256), 256, 0, stream>>>(out, ids, table, n, c);
  return Launched("EmbeddingAdd");
}
template <typename T>
Status EmbeddingBackward(cudaStream_t stream, float* dtable, const int32_t* ids, const T* dout,
                         int n, int c, bool deterministic) {
  if (n <= 0) return OkStatus();
  if (deterministic) {
    EmbeddingBackwardColumnKernel<T><<<(c + 127) / 128, 128, 0, stream>>>(dtable, ids, dout, n, c);
  } else {
    EmbeddingBackwardAtomicKernel<T><<<Blocks(int64_t(n) * c, 256), 256, 0, stream>>>(dtable, ids, dout, n, c);
  }
  return Launched("EmbeddingBackward");
}

template <typename T>
Status BiasAdd(cudaStream_t stream, T* out, const T* bias, int n, int c) {
  if (n <= 0) return OkStatus();
  BiasAddKernel<T><<<Blocks(int64_t(n) * c, 256), 256, 0, stream>>>(out, bias, n, c);
  return Launched("BiasAdd");
}
template <typename T>
Status ColumnSumAdd(cudaStream_t stream, float* dst, const T* src, int rows, int cols, float* scratch) {
  if (cols <= 0 || rows <= 0) return OkStatus();
  return ColumnReduce<T, false>(stream, nullptr, dst, src, nullptr, nullptr, nullptr, rows, cols, scratch,
                                "ColumnSumAdd");
}

template <typename T>
Status CrossEntropy(cudaStream_t stream, float* row_loss, T* dlogits, const T* logits,
                    const int32_t* targets, int n, int v, float dscale) {
  if (n <= 0) return OkStatus();
  CrossEntropyKernel<T><<<n, 512, 0, stream>>>(row_loss, dlogits, logits, targets, v, dscale);
  return Launched("CrossEntropy");
}

template <typename H>
Status AdamW(cudaStream_t stream, float* param, float* m, float* v, const float* grad,
             H* half_out, int64_t n, float lr, float beta1, float beta2, float eps,
             float weight_decay, int64_t step, float grad_scale, const DecayRuns& runs) {
  if (n <= 0) return OkStatus();
  if (runs.runs < 0 || (runs.runs > 0 && runs.run_ends == nullptr))
    return InvalidArgumentError("AdamW: decay runs without a table (runs " + std::to_string(runs.runs) + ")");
  // Bias corrections in double on the host, as model/train/optimizer.cc.
  const double bc1 = 1.0 - std::pow(double(beta1), double(step));
  const double bc2 = 1.0 - std::pow(double(beta2), double(step));
  const float step_size = float(lr / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  AdamWKernel<H><<<Blocks(n, 256), 256, 0, stream>>>(param, m, v, grad, half_out, n, lr, beta1, beta2, eps,
                                                   lr * weight_decay, step_size, inv_sqrt_bc2, grad_scale, runs);
  return Launched("AdamW");
}

Status SumSquares(cudaStream_t stream, double* out, const float* x, int64_t n, double* partials) {
  if (n <= 0) return OkStatus();
  // One block per 1024 elements, at most kSumSquaresMaxBlocks blocks; each
  // thread's fp32 partial covers n / (blocks x 256) elements (about 400 for
  // bert-base's 110M parameters), and the block sums meet in double.
  const int64_t want = (n + 1023) / 1024;
  const int blocks = static_cast<int>(want < kSumSquaresMaxBlocks ? want : kSumSquaresMaxBlocks);
  SumSquaresKernel<<<blocks, 256, 0, stream>>>(partials, x, n);
  DGCA_RETURN_IF_ERROR(Launched("SumSquares"));
  SumPartialsKernel<<<1, kSumSquaresMaxBlocks, 0, stream>>>(out, partials, blocks);
  return Launched("SumSquares partials");
}

Status UnscaleCheck(cudaStream_t stream, float* grad, int64_t n, float inv_scale, int32_t* found_inf) {
  if (n <= 0) return OkStatus();
  UnscaleCheckKernel<<<Blocks(n, 256), 256, 0, stream>>>(grad, n, inv_scale, found_inf);
  return Launched("UnscaleCheck");
}

template <typename T>
Status SplitHeads(cudaStream_t stream, T* q, T* k, T* v, const T* qkv, int B, int L, int H, int nh) {
  if (B <= 0) return OkStatus();
  SplitHeadsKernel<T><<<Blocks(int64_t(B) * L * H, 256), 256, 0, stream>>>(q, k, v, qkv, B, L, H, nh);
  return Launched("SplitHeads");
}
template <typename T>
Status MergeHeads(cudaStream_t stream, T* out, const T* ctx, int B, int L, int H, int nh) {
  if (B <= 0) return OkStatus();
  MergeHeadsKernel<T><<<Blocks(int64_t(B) * L * H, 256), 256, 0, stream>>>(out, ctx, B, L, H, nh);
  return Launched("MergeHeads");
}

namespace {

template <typename T>
__global__ void DropoutRowsKernel(T* out, const T* in, const T* residual, const uint64_t* keys, int layer, int site,
                                  uint32_t threshold, float scale, int L, int H, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / H;
    const int col = static_cast<int>(i % H), pos = static_cast<int>(row % L);
    const uint64_t key = DropoutSiteKey(keys[row / L], layer, site);
    float v = DropoutKeep(key, DropoutHiddenIndex(pos, col), threshold) ? ToF(in[i]) * scale : 0.0f;
    if (residual != nullptr) v += ToF(residual[i]);
    out[i] = FromF<T>(v);
  }
}

template <typename T>
__global__ void DropoutProbsKernel(T* out, const T* in, const uint64_t* keys, int layer, uint32_t threshold,
                                   float scale, int nh, int L, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int k = static_cast<int>(i % L);
    const int64_t r = i / L;
    const int q = static_cast<int>(r % L);
    const int64_t bh = r / L;
    const int h = static_cast<int>(bh % nh);
    const uint64_t key = DropoutSiteKey(keys[bh / nh], layer, kDropAttnProbs);
    out[i] = FromF<T>(DropoutKeep(key, DropoutProbsIndex(h, q, k), threshold) ? ToF(in[i]) * scale : 0.0f);
  }
}

}  // namespace

template <typename T>
Status DropoutRows(cudaStream_t stream, T* out, const T* in, const T* residual, const uint64_t* keys, int layer,
                   int site, float p, int B, int L, int H) {
  const int64_t total = int64_t(B) * L * H;
  if (total <= 0) return OkStatus();
  if (keys == nullptr) return InvalidArgumentError("DropoutRows: null keys");
  DropoutRowsKernel<T><<<Blocks(total, 256), 256, 0, stream>>>(out, in, residual, keys, layer, site,
                                                               DropoutThreshold(p), DropoutScale(p), L, H, total);
  return Launched("DropoutRows");
}

template <typename T>
Status DropoutProbs(cudaStream_t stream, T* out, const T* in, const AttentionDropout& drop, int B, int nh, int L) {
  const int64_t total = int64_t(B) * nh * L * L;
  if (total <= 0) return OkStatus();
  if (drop.keys == nullptr) return InvalidArgumentError("DropoutProbs: null keys");
  DropoutProbsKernel<T><<<Blocks(total, 256), 256, 0, stream>>>(
      out, in, drop.keys, drop.layer, DropoutThreshold(drop.p), DropoutScale(drop.p), nh, L, total);
  return Launched("DropoutProbs");
}

#define DGCA_INSTANTIATE(T)                                                                      \
  template Status DropoutRows<T>(cudaStream_t, T*, const T*, const T*, const uint64_t*, int, int, float, int, \
                                 int, int);                                                      \
  template Status DropoutProbs<T>(cudaStream_t, T*, const T*, const AttentionDropout&, int, int, int); \
  template Status LayerNormForward<T>(cudaStream_t, T*, float*, float*, const T*, const T*,      \
                                      const T*, int, int, float);                                \
  template Status LayerNormBackward<T>(cudaStream_t, T*, bool, float*, float*, const T*,         \
                                       const T*, const T*, const float*, const float*, int, int,  \
                                       float*);                                                  \
  template Status GeluForward<T>(cudaStream_t, T*, const T*, int64_t);                           \
  template Status GeluBackward<T>(cudaStream_t, T*, const T*, const T*, int64_t);                \
  template Status SoftmaxRows<T>(cudaStream_t, T*, const T*, int, int);                          \
  template Status MaskedSoftmax<T>(cudaStream_t, T*, const T*, const int32_t*, int, int, int);   \
  template Status EmbeddingForward<T>(cudaStream_t, T*, const int32_t*, const T*, int, int);     \
  template Status EmbeddingAdd<T>(cudaStream_t, T*, const int32_t*, const T*, int, int);         \
  template Status EmbeddingBackward<T>(cudaStream_t, float*, const int32_t*, const T*, int, int, \
                                       bool);                                                    \
  template Status BiasAdd<T>(cudaStream_t, T*, const T*, int, int);                              \
  template Status ColumnSumAdd<T>(cudaStream_t, float*, const T*, int, int, float*);             \
  template Status CrossEntropy<T>(cudaStream_t, float*, T*, const T*, const int32_t*, int, int,  \
                                  float);                                                        \
  template Status SplitHeads<T>(cudaStream_t, T*, T*, T*, const T*, int, int, int, int);         \
  template Status MergeHeads<T>(cudaStream_t, T*, const T*, int, int, int, int);                \
  template Status GatherHeads<T>(cudaStream_t, T*, const T*, int64_t, int64_t, int, int, int, int); \
  template Status ScatterHeads<T>(cudaStream_t, T*, int64_t, int64_t, const T*, int, int, int, int); \
  template Status SoftmaxBackward<T>(cudaStream_t, T*, const T*, const T*, int, int);

DGCA_INSTANTIATE(float)
DGCA_INSTANTIATE(bf16)
DGCA_INSTANTIATE(__half)
#undef DGCA_INSTANTIATE

#define DGCA_INSTANTIATE_HALF(H)                                                                  \
  template Status CastFromFloat<H>(cudaStream_t, H*, const float*, int64_t);                      \
  template Status AdamW<H>(cudaStream_t, float*, float*, float*, const float*, H*, int64_t, float, \
                           float, float, float, float, int64_t, float, const DecayRuns&);
DGCA_INSTANTIATE_HALF(bf16)
DGCA_INSTANTIATE_HALF(__half)
#undef DGCA_INSTANTIATE_HALF

}  // namespace cuda
}  // namespace dgca
