// What the two halves of CudaHeads<T> (model/cuda/cuda_heads.h) share:
// cuda_heads.cu (binding, forward, predict) and cuda_heads_backward.cu
// (backward). Launch shapes, the layout of the two-stage column sums, and
// the per-slot scalar maths, line for line as model/nn/heads.cc. Included
// by those two files only.
//
// The helpers have internal linkage (an unnamed namespace): each .cu
// compiles its own device code, and the CUDA emulator's host build of both
// files then links without two definitions of one symbol.
#ifndef DGCA_MODEL_CUDA_CUDA_HEADS_INTERNAL_CUH_
#define DGCA_MODEL_CUDA_CUDA_HEADS_INTERNAL_CUH_

#include <cmath>

namespace dgca {
namespace cuda {
namespace {

constexpr int kThreads = 256;       // per-slot kernels over H and K
constexpr int kVocabThreads = 512;  // per-slot kernels over V
constexpr int kColThreads = 128;    // column-owner kernels

// Column sums over slots, two stages so that many slots do not serialize
// on H threads, with a fixed order (deterministic):
//   stage 1: block (column tile, chunk c) sums slots [c·kChunk, (c+1)·kChunk)
//            in order into part[c][q][j] for the 5 sums q:
//            0 dw_g: dl·h, 1 dw_d: de·h, 2 dγ: du·n, 3 dβ: du, 4 db_c: da;
//   stage 2: thread per column adds the chunks in order into the grads.
constexpr int kChunk = 32;
constexpr int kColSums = 5;

__device__ __forceinline__ double Softplus(double v) { return fmax(v, 0.0) + log1p(exp(-fabs(v))); }
__device__ __forceinline__ double Sigmoid(double v) {
  if (v >= 0) return 1.0 / (1.0 + exp(-v));
  const double e = exp(v);
  return e / (1.0 + e);
}
__device__ __forceinline__ double LogAddExp(double a, double b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  const double m = fmax(a, b);
  return m + log1p(exp(-fabs(a - b)));
}
__device__ __forceinline__ float Gelu(float a) { return 0.5f * a * (1.0f + erff(a * 0.70710678118654752f)); }
__device__ __forceinline__ float GeluGrad(float a) {
  const float cdf = 0.5f * (1.0f + erff(a * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * expf(-0.5f * a * a);
  return cdf + a * pdf;
}

}  // namespace
}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CUDA_HEADS_INTERNAL_CUH_
