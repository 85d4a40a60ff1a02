// The element types of the CUDA backend — float, __nv_bfloat16 (bf16) and
// __half (fp16) — their DType tags, and the fp32 conversions every kernel
// uses (host and device): arithmetic is fp32 inside kernels, T is only how
// values are stored.
//
// Thread-safety: constants and pure functions.
#ifndef DGCA_MODEL_CUDA_DTYPE_H_
#define DGCA_MODEL_CUDA_DTYPE_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace dgca {
namespace cuda {

using bf16 = __nv_bfloat16;

enum class DType { kF32, kBF16, kF16 };
const char* DTypeName(DType t);  // "fp32", "bf16", "fp16"

template <typename T> constexpr DType kDType = DType::kF32;
template <> constexpr DType kDType<bf16> = DType::kBF16;
template <> constexpr DType kDType<__half> = DType::kF16;

__host__ __device__ __forceinline__ float ToF(float x) { return x; }
__host__ __device__ __forceinline__ float ToF(bf16 x) { return __bfloat162float(x); }
__host__ __device__ __forceinline__ float ToF(__half x) { return __half2float(x); }

// Round-to-nearest-even conversion from fp32.
template <typename T> __host__ __device__ __forceinline__ T FromF(float x);
template <> __host__ __device__ __forceinline__ float FromF<float>(float x) { return x; }
template <> __host__ __device__ __forceinline__ bf16 FromF<bf16>(float x) { return __float2bfloat16(x); }
template <> __host__ __device__ __forceinline__ __half FromF<__half>(float x) { return __float2half(x); }

// x as a t-typed buffer holds it (the CPU side of the GPU checks).
inline float RoundTo(DType t, float x) {
  if (t == DType::kBF16) return ToF(FromF<bf16>(x));
  if (t == DType::kF16) return ToF(FromF<__half>(x));
  return x;
}

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_DTYPE_H_
