#include "model/cuda/attention.h"

#include <cmath>
#include <string>

#include "model/cuda/kernels.h"

namespace dgca {
namespace cuda {
template <typename T>
Status AttentionForward(const CudaContext& ctx, GemmRunner* gemm, T* out, T* probs, const T* qkv,
                        const int32_t* mask, int B, int L, int H, int nh, T* scratch,
                        const AttentionDropout& drop) {
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
  const T* pv = probs;
  if (drop.on()) {  // P V with the masked probabilities, after the four [B,L,H] buffers
    T* pd = scratch + 4 * n;
    DGCA_RETURN_IF_ERROR(DropoutProbs<T>(ctx.stream(), pd, probs, drop, B, nh, L));
    pv = pd;
  }
  GemmArgs o;  // ctx[bh] = probs v
  o.M = L; o.N = d; o.K = L;
  o.A = pv; o.lda = L; o.B = v; o.ldb = d; o.C = hctx; o.ldc = d;
  o.in_type = o.out_type = kDType<T>;
  o.batch = B * nh;
  o.stride_a = int64_t(L) * L; o.stride_b = int64_t(L) * d; o.stride_c = int64_t(L) * d;
  DGCA_RETURN_IF_ERROR(gemm->Run(o));
  return MergeHeads<T>(ctx.stream(), out, hctx, B, L, H, nh);
}

namespace {
// One strided-batched row-major GEMM over the B*nh heads.
template <typename T>
Status HeadGemm(GemmRunner* gemm, bool ta, bool tb, int M, int N, int K, float alpha, const T* A, int64_t lda,
                int64_t sa, const T* B_, int64_t ldb, int64_t sb, T* C, int64_t ldc, int64_t sc, int batch) {
  GemmArgs g;
  g.trans_a = ta; g.trans_b = tb;
  g.M = M; g.N = N; g.K = K; g.alpha = alpha;
  g.A = A; g.lda = lda; g.B = B_; g.ldb = ldb; g.C = C; g.ldc = ldc;
  g.in_type = g.out_type = kDType<T>;
  g.batch = batch; g.stride_a = sa; g.stride_b = sb; g.stride_c = sc;
  return gemm->Run(g);
}
}  // namespace

template <typename T>
Status AttentionBackward(const CudaContext& ctx, GemmRunner* gemm, T* dqkv, const T* dout, const T* qkv,
                         const T* probs, int B, int L, int H, int nh, T* scratch,
                         const AttentionDropout& drop) {
  if (nh <= 0 || H % nh != 0) {
    return InvalidArgumentError("attention: hidden " + std::to_string(H) + " not divisible by heads " +
                                std::to_string(nh));
  }
  if (L <= 0 || L > 512) {
    return InvalidArgumentError("attention: sequence length " + std::to_string(L) + " outside 1..512");
  }
  const int d = H / nh, bh = B * nh;
  const int64_t n = int64_t(B) * L * H, hd = int64_t(L) * d, ll = int64_t(L) * L;
  T* q = scratch;
  T* k = q + n;
  T* v = k + n;
  T* dctx = v + n;
  T* dq = dctx + n;
  T* dk = dq + n;
  T* dv = dk + n;
  T* dp = dv + n;  // dprobs, then dscores in place
  cudaStream_t s = ctx.stream();
  DGCA_RETURN_IF_ERROR(SplitHeads<T>(s, q, k, v, qkv, B, L, H, nh));
  DGCA_RETURN_IF_ERROR(GatherHeads<T>(s, dctx, dout, H, 0, B, L, H, nh));
  // dP = dctx V^T  [L,L]
  DGCA_RETURN_IF_ERROR(HeadGemm<T>(gemm, false, true, L, L, d, 1.0f, dctx, d, hd, v, d, hd, dp, L, ll, bh));
  // dV = Pd^T dctx  [L,d] (Pd: the masked probabilities the forward used)
  const T* pv = probs;
  if (drop.on()) {
    T* pd = dp + int64_t(bh) * ll;
    DGCA_RETURN_IF_ERROR(DropoutProbs<T>(s, pd, probs, drop, B, nh, L));
    DGCA_RETURN_IF_ERROR(DropoutProbs<T>(s, dp, dp, drop, B, nh, L));  // dP = dPd * M / (1-p)
    pv = pd;
  }
  DGCA_RETURN_IF_ERROR(HeadGemm<T>(gemm, true, false, L, d, L, 1.0f, pv, L, ll, dctx, d, hd, dv, d, hd, bh));
  DGCA_RETURN_IF_ERROR(SoftmaxBackward<T>(s, dp, probs, dp, bh * L, L));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // dQ = dS K * scale, dK = dS^T Q * scale
  DGCA_RETURN_IF_ERROR(HeadGemm<T>(gemm, false, false, L, d, L, scale, dp, L, ll, k, d, hd, dq, d, hd, bh));
  DGCA_RETURN_IF_ERROR(HeadGemm<T>(gemm, true, false, L, d, L, scale, dp, L, ll, q, d, hd, dk, d, hd, bh));
  DGCA_RETURN_IF_ERROR(ScatterHeads<T>(s, dqkv, 3 * int64_t(H), 0, dq, B, L, H, nh));
  DGCA_RETURN_IF_ERROR(ScatterHeads<T>(s, dqkv, 3 * int64_t(H), H, dk, B, L, H, nh));
  return ScatterHeads<T>(s, dqkv, 3 * int64_t(H), 2 * int64_t(H), dv, B, L, H, nh);
}

#define DGCA_INSTANTIATE(T)                                                                            \
  template Status AttentionForward<T>(const CudaContext&, GemmRunner*, T*, T*, const T*, const int32_t*, int, \
                                      int, int, int, T*, const AttentionDropout&);                         \
  template Status AttentionBackward<T>(const CudaContext&, GemmRunner*, T*, const T*, const T*, const T*,   \
                                       int, int, int, int, T*, const AttentionDropout&);
DGCA_INSTANTIATE(float)
DGCA_INSTANTIATE(bf16)
DGCA_INSTANTIATE(__half)
#undef DGCA_INSTANTIATE

}  // namespace cuda
}  // namespace dgca
