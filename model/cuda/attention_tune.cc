#include "model/cuda/attention_tune.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "model/cuda/attention.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/gemm.h"

namespace dgca {
namespace cuda {
namespace {

// cudaEvents, destroyed with the object.
class EventPair {
 public:
  ~EventPair() {
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
  }
  Status Create() {
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start_), "cudaEventCreate"));
    return CudaStatus(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  // Milliseconds of one run of fn on st.
  StatusOr<float> Time(cudaStream_t st, const std::function<Status()>& fn) {
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start_, st), "cudaEventRecord"));
    DGCA_RETURN_IF_ERROR(fn());
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stop_, st), "cudaEventRecord"));
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(stop_), "cudaEventSynchronize"));
    float ms = 0;
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime"));
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The median of each fn's times over `reps` rounds after `warmup` rounds;
// a round runs every fn once, in turn, so clock and thermal drift fall on
// all of them alike instead of on whichever was timed last.
StatusOr<std::vector<double>> TimeInRounds(cudaStream_t st, int warmup, int reps,
                                           const std::vector<std::function<Status()>>& fns) {
  EventPair ev;
  DGCA_RETURN_IF_ERROR(ev.Create());
  std::vector<std::vector<float>> ms(fns.size());
  for (int round = 0; round < warmup + reps; ++round) {
    for (size_t k = 0; k < fns.size(); ++k) {
      DGCA_ASSIGN_OR_RETURN(float m, ev.Time(st, fns[k]));
      if (round >= warmup) ms[k].push_back(m);
    }
  }
  std::vector<double> med;
  for (std::vector<float>& v : ms) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

template <typename T>
StatusOr<AttentionTiming> TimeAs(const CudaContext& ctx, int B, int L, int H, int nh, int warmup, int reps,
                                 float dropout) {
  const size_t n_qkv = size_t(B) * L * 3 * H, n_out = size_t(B) * L * H;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random = [&](size_t n) {
    std::vector<T> v(n);
    for (T& x : v) x = FromF<T>(u(rng));
    return v;
  };
  std::vector<int32_t> mask(size_t(B) * L, 1);
  for (int b = 0; b < B; ++b)
    for (int j = L - L / 8; j < L; ++j) mask[size_t(b) * L + j] = 0;
  DeviceArray<T> qkv, out, dout, dqkv, probs, scratch;
  DeviceArray<float> lse, rowdot;
  DeviceArray<int32_t> dmask;
  DeviceArray<uint64_t> keys;
  std::vector<uint64_t> host_keys(static_cast<size_t>(B));
  for (uint64_t& k : host_keys) k = (uint64_t(rng()) << 32) | rng();
  const int64_t gemm_scratch = AttentionSharedScratchElems(B, L, H, nh, dropout > 0.0f);
  for (Status s : {qkv.Upload(random(n_qkv)), dout.Upload(random(n_out)), out.Allocate(n_out),
                   dqkv.Allocate(n_qkv), dmask.Upload(mask), probs.Allocate(size_t(B) * nh * L * L),
                   scratch.Allocate(size_t(gemm_scratch)), lse.Allocate(size_t(B) * nh * L),
                   rowdot.Allocate(size_t(FusedAttentionBackwardScratchFloats(B, L, nh))), keys.Upload(host_keys)}) {
    if (!s.ok()) return Status(s.code(), "attention timing buffers: " + s.message());
  }
  // The uploads ran on the legacy stream; the timed work runs on ctx's.
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  GemmRunner gemm(&ctx);
  cudaStream_t st = ctx.stream();
  const AttentionDropout drop = dropout > 0.0f ? AttentionDropout{keys.get(), 0, dropout} : AttentionDropout{};
  DGCA_ASSIGN_OR_RETURN(
      std::vector<double> ms,
      TimeInRounds(st, warmup, reps,
                   {[&] {
                      return FusedAttentionForward<T>(st, out.get(), lse.get(), qkv.get(), dmask.get(), B, L, H, nh,
                                                      drop);
                    },
                    [&] {
                      return FusedAttentionBackward<T>(st, dqkv.get(), dout.get(), qkv.get(), out.get(), lse.get(),
                                                       dmask.get(), B, L, H, nh, rowdot.get(), drop);
                    },
                    [&] {
                      return AttentionForward<T>(ctx, &gemm, out.get(), probs.get(), qkv.get(), dmask.get(), B, L,
                                                 H, nh, scratch.get(), drop);
                    },
                    [&] {
                      return AttentionBackward<T>(ctx, &gemm, dqkv.get(), dout.get(), qkv.get(), probs.get(), B, L,
                                                  H, nh, scratch.get(), drop);
                    }}));
  AttentionTiming t;
  t.fused_fwd_ms = ms[0];
  t.fused_bwd_ms = ms[1];
  t.gemm_fwd_ms = ms[2];
  t.gemm_bwd_ms = ms[3];
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  t.fused_bytes = lse.size() * sizeof(float) + rowdot.size() * sizeof(float);
  t.gemm_bytes = probs.size() * sizeof(T) + scratch.size() * sizeof(T);
  return t;
}

}  // namespace

StatusOr<AttentionTiming> TimeAttention(const CudaContext& ctx, DType t, int B, int L, int H, int nh,
                                        int warmup, int reps, float attention_dropout) {
  if (reps < 1 || warmup < 0) return InvalidArgumentError("attention timing: reps must be >= 1, warmup >= 0");
  if (B < 1) return InvalidArgumentError("attention timing: batch must be >= 1");
  if (!FusedAttentionSupported(t, L, H, nh)) {
    return InvalidArgumentError(std::string("attention timing: the fused kernels do not take ") + DTypeName(t) +
                                ", seq " + std::to_string(L) + ", hidden " + std::to_string(H) + ", " +
                                std::to_string(nh) + " heads (bf16/fp16, head size 16/32/64, seq <= 512)");
  }
  if (!ValidDropout(attention_dropout))
    return InvalidArgumentError("attention timing: dropout must be in [0, 1), got " + std::to_string(attention_dropout));
  if (t == DType::kBF16) return TimeAs<__nv_bfloat16>(ctx, B, L, H, nh, warmup, reps, attention_dropout);
  return TimeAs<__half>(ctx, B, L, H, nh, warmup, reps, attention_dropout);
}

bool PreferFused(const AttentionTiming& t, double margin) {
  return !(t.gemm_ms() < (1.0 - margin) * t.fused_ms());
}

std::string DescribeTiming(const AttentionTiming& t) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "fused %.3f ms vs GEMM %.3f ms, one layer's forward + backward", t.fused_ms(),
                t.gemm_ms());
  return buf;
}

}  // namespace cuda
}  // namespace dgca
