// FallbackGemm (gemm.h): a plain shared-memory tiled GEMM with the row-major
// semantics of GemmArgs, for the shapes cuBLASLt's heuristic has no
// algorithm for (e.g. bf16 operands only 2-byte aligned). Correct, not
// fast: GemmRunner counts its uses (fallback_plans) so benchmarks can tell.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "model/cuda/gemm.h"

namespace dgca {
namespace cuda {
namespace {

constexpr int kTile = 16;

// One 16x16 tile of C per block; blockIdx.z = batch. fp32 accumulation.
template <typename Tin, typename Tout>
__global__ void TiledGemmKernel(bool ta, bool tb, int M, int N, int K, float alpha, float beta,
                                const Tin* A, int64_t lda, int64_t sa, const Tin* B, int64_t ldb,
                                int64_t sb, Tout* C, int64_t ldc, int64_t sc, const Tout* bias,
                                const Tout* C_in) {
  __shared__ float as[kTile][kTile + 1];
  __shared__ float bs[kTile][kTile + 1];
  const int64_t z = blockIdx.z;
  A += z * sa;
  B += z * sb;
  C += z * sc;
  if (C_in != nullptr) C_in += z * sc;
  const int i = blockIdx.y * kTile + threadIdx.y;  // row of C
  const int j = blockIdx.x * kTile + threadIdx.x;  // column of C
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    // as[y][x] = op(A)[i][k0 + x]; bs[y][x] = op(B)[k0 + y][j].
    const int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    float a = 0.0f, b = 0.0f;
    if (i < M && ka < K) a = ta ? ToF(A[int64_t(ka) * lda + i]) : ToF(A[int64_t(i) * lda + ka]);
    if (j < N && kb < K) b = tb ? ToF(B[int64_t(j) * ldb + kb]) : ToF(B[int64_t(kb) * ldb + j]);
    as[threadIdx.y][threadIdx.x] = a;
    bs[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
    __syncthreads();
  }
  if (i < M && j < N) {
    float out = alpha * acc;
    const int64_t o = int64_t(i) * ldc + j;
    if (beta != 0.0f) out += beta * ToF(C_in != nullptr ? C_in[o] : C[o]);
    if (bias != nullptr) out += ToF(bias[j]);
    C[o] = FromF<Tout>(out);
  }
}

template <typename Tin, typename Tout>
Status Launch(cudaStream_t stream, const GemmArgs& g) {
  dim3 block(kTile, kTile);
  dim3 grid((g.N + kTile - 1) / kTile, (g.M + kTile - 1) / kTile, g.batch);
  TiledGemmKernel<Tin, Tout><<<grid, block, 0, stream>>>(
      g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, g.beta, static_cast<const Tin*>(g.A), g.lda,
      g.stride_a, static_cast<const Tin*>(g.B), g.ldb, g.stride_b, static_cast<Tout*>(g.C), g.ldc,
      g.stride_c, static_cast<const Tout*>(g.bias), static_cast<const Tout*>(g.C_in));
  return Launched("FallbackGemm");
}

}  // namespace

Status FallbackGemm(cudaStream_t stream, const GemmArgs& g) {
  if (g.batch > 65535) return InvalidArgumentError("FallbackGemm: batch > 65535");
  const bool same = g.out_type == g.in_type;
  switch (g.in_type) {
    case DType::kF32: return Launch<float, float>(stream, g);
    case DType::kBF16:
      return same ? Launch<__nv_bfloat16, __nv_bfloat16>(stream, g) : Launch<__nv_bfloat16, float>(stream, g);
    case DType::kF16: return same ? Launch<__half, __half>(stream, g) : Launch<__half, float>(stream, g);
  }
  return InvalidArgumentError("FallbackGemm: unknown type");
}

}  // namespace cuda
}  // namespace dgca
