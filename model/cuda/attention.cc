#include "model/cuda/attention.h"

#include <cmath>
#include <string>

#include "model/cuda/kernels.h"

namespace dgca {
namespace cuda {
namespace {
template <typename T> constexpr DType kDType = DType::kF32;
template <> constexpr DType kDType<bf16> = DType::kBF16;
}  // namespace

template <typename T>
Status AttentionForward(const CudaContext& ctx, GemmRunner* gemm, T* out, T* probs, const T* qkv,
                        const int32_t* mask, int B, int L, int H, int nh, T* scratch) {
  if (nh <= 0 || H % nh != 0) {
    return InvalidArgumentError("attention: hidden " + std::to_string(H) + " not divisible by heads " +
                                std::to_string(nh));
  }
  if (L <= 0 || L > 512) {
    return InvalidArgumentError("attention: sequence length " + std::to_string(L) + " outside 1..512");
  }
  const int d = H / nh;
  const int64_t n = int64_t(B) * L * H;
  T* q = scratch;
  T* k = scratch + n;
  T* v = scratch + 2 * n;
  T* hctx = scratch + 3 * n;
  DGCA_RETURN_IF_ERROR(SplitHeads<T>(ctx.stream(), q, k, v, qkv, B, L, H, nh));
  GemmArgs s;  // scores[bh] = q k^T / sqrt(d)
  s.trans_b = true;
  s.M = L; s.N = L; s.K = d;
  s.alpha = 1.0f / std::sqrt(static_cast<float>(d));
  s.A = q; s.lda = d; s.B = k; s.ldb = d; s.C = probs; s.ldc = L;
  s.in_type = s.out_type = kDType<T>;
  s.batch = B * nh;
  s.stride_a = int64_t(L) * d; s.stride_b = int64_t(L) * d; s.stride_c = int64_t(L) * L;
  DGCA_RETURN_IF_ERROR(gemm->Run(s));
  DGCA_RETURN_IF_ERROR(MaskedSoftmax<T>(ctx.stream(), probs, probs, mask, B, nh, L));
  GemmArgs o;  // ctx[bh] = probs v
  o.M = L; o.N = d; o.K = L;
  o.A = probs; o.lda = L; o.B = v; o.ldb = d; o.C = hctx; o.ldc = d;
  o.in_type = o.out_type = kDType<T>;
  o.batch = B * nh;
  o.stride_a = int64_t(L) * L; o.stride_b = int64_t(L) * d; o.stride_c = int64_t(L) * d;
  DGCA_RETURN_IF_ERROR(gemm->Run(o));
  return MergeHeads<T>(ctx.stream(), out, hctx, B, L, H, nh);
}

template Status AttentionForward<float>(const CudaContext&, GemmRunner*, float*, float*, const float*,
                                        const int32_t*, int, int, int, int, float*);
template Status AttentionForward<bf16>(const CudaContext&, GemmRunner*, bf16*, bf16*, const bf16*,
                                       const int32_t*, int, int, int, int, bf16*);

}  // namespace cuda
}  // namespace dgca
