// Warp- and block-wide reductions for the CUDA kernels (kernels.cu,
// cuda_heads.cu). Fixed shuffle trees: the result does not depend on
// scheduling, so the kernels that use them are deterministic.
//
// Device code only; include from .cu files.
#ifndef DGCA_MODEL_CUDA_WARP_REDUCE_CUH_
#define DGCA_MODEL_CUDA_WARP_REDUCE_CUH_

#include <cuda_runtime.h>

#include <cmath>

namespace dgca {
namespace cuda {

// Sum / max over the 32 lanes of a full warp; every lane gets the result.
template <typename F>
__device__ __forceinline__ F WarpSum(F x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Block-wide sum (kMax false) or max (kMax true) of x (blockDim.x a
// multiple of 32, at most 1024); every thread gets the result. `sh` holds
// 32 floats of shared memory. The whole block; syncs it.
template <bool kMax>
__device__ float BlockReduce(float x, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = kMax ? WarpMax(x) : WarpSum(x);
  __syncthreads();  // sh may still be read by a previous reduction
  if (lane == 0) sh[warp] = x;
  __syncthreads();
  float y = lane < nw ? sh[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? WarpMax(y) : WarpSum(y);
}

// As BlockReduce<false> in double (`sh`: 32 doubles).
__device__ __forceinline__ double BlockSumD(double x, double* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = WarpSum(x);
  __syncthreads();  // sh may still be read by a previous reduction
  if (lane == 0) sh[warp] = x;
  __syncthreads();
  double y = lane < nw ? sh[lane] : 0.0;
  return WarpSum(y);
}

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_WARP_REDUCE_CUH_
