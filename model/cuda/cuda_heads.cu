// CudaHeads<T>: see cuda_heads.h. Binding, forward and predict; the
// backward pass is cuda_heads_backward.cu, and what both use is
// cuda_heads_internal.cuh. Checked on the CUDA emulator and on an H200
// (docs/benchmarks.md).
//
// Kernels (one block per slot unless noted), in call order:
//   Forward:  [GEMM act = h W_c^T]  SlotForwardKernel (detector, candidate
//             head GELU+LN, scores, log q, gate, logsumexp of z_t, per-slot
//             losses and fusion weights)  ReduceLossesKernel (1 block).
//   Predict:  [GEMM]  SlotForwardKernel<kPredict> (heads + block argmax).
// The per-slot scalar maths (losses, w_A/w_B, candidate log-softmax) runs
// on thread 0 of the slot's block in double, line for line as heads.cc.
#include "model/cuda/cuda_heads.h"

#include <cub/device/device_radix_sort.cuh>

#include <cfloat>
#include <climits>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "model/cuda/cuda_heads_internal.cuh"
#include "model/cuda/kernels.h"
#include "model/cuda/warp_reduce.cuh"

namespace dgca {
namespace cuda {
namespace {

// (value, id) argmax with ties to the smallest id; id INT_MAX = none.
__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  if (i == INT_MAX) return false;
  if (bi == INT_MAX) return true;
  return v > bv || (v == bv && i < bi);
}
__device__ void BlockArgMax(float* v, int* i, float* shv, int* shi) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, *i, o);
    if (Better(ov, oi, *v, *i)) { *v = ov; *i = oi; }
  }
  __syncthreads();
  if (lane == 0) { shv[warp] = *v; shi[warp] = *i; }
  __syncthreads();
  float bv = lane < nw ? shv[lane] : -INFINITY;
  int bi = lane < nw ? shi[lane] : INT_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (Better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
  }
  *v = bv;
  *i = bi;
}

// ---------------------------------------------------------------- forward
template <typename T>
struct FwdArgs {
  const T* h;
  const T* z;
  const T* E;
  const int32_t* cand;  // caller's ids [T*K] (null when the candidate head is off)
  const int32_t* x;
  const int32_t* y;     // null in Predict
  int H, K, V;
  float eps;
  bool det, cand_on, gated;
  // fp32 master weights.
  const float* wd;
  const float* bd;
  const float* bc;
  const float* gam;
  const float* bet;
  const float* wg;
  const float* ga;
  const float* gb;
  // State written.
  int32_t* cand_s;
  int32_t* y_s;
  int32_t* label_s;
  float* e;
  float* gl;
  float* act;  // in: h W_c^T (GEMM); out: + b_c
  float* nrm;
  float* u;
  float* rstd;
  float* logq;
  float* logQ;
  float* zmax;
  float* zsum;
  float* loss_t;
  float* wA;
  float* wB;
  int32_t* pred;  // Predict only
};

// Dynamic shared memory: double s_lq[K], int s_c[K].
template <typename T, bool kPredict>
__global__ void __launch_bounds__(kThreads) SlotForwardKernel(FwdArgs<T> a) {
  extern __shared__ double s_lq[];
  int* s_c = reinterpret_cast<int*>(s_lq + a.K);
  __shared__ float sh[32];
  __shared__ int shi[32];
  const int t = blockIdx.x, tid = threadIdx.x, nth = blockDim.x;
  const int H = a.H, K = a.K, V = a.V;
  const T* ht = a.h + int64_t(t) * H;
  const T* zt = a.z + int64_t(t) * V;
  int yt = -1;
  if (!kPredict) {
    yt = a.y[t];
    if (tid == 0) {
      a.y_s[t] = yt;
      a.label_s[t] = a.x[t] != yt ? 1 : 0;
    }
  }
  if (a.cand_on) {
    for (int k = tid; k < K; k += nth) {
      const int c = a.cand[int64_t(t) * K + k];
      s_c[k] = (c >= 0 && c < V) ? c : -1;  // out of range = padding (ids are trusted)
      if (!kPredict) a.cand_s[int64_t(t) * K + k] = s_c[k];
    }
  }
  __syncthreads();

  // Detector logit e = w_d·h + b_d.
  float e = 0.0f;
  if (a.det) {
    float s = 0.0f;
    for (int j = tid; j < H; j += nth) s += a.wd[j] * ToF(ht[j]);
    e = BlockReduce<false>(s, sh) + a.bd[0];
    if (tid == 0) a.e[t] = e;
  }

  // Candidate head: a += b_c; u = LN(GELU(a)); scores; log-softmax over real candidates.
  double logQ = -INFINITY;
  if (a.cand_on) {
    float* act = a.act + int64_t(t) * H;
    float* nrm = a.nrm + int64_t(t) * H;
    float* u = a.u + int64_t(t) * H;
    float s = 0.0f;
    for (int j = tid; j < H; j += nth) {
      const float v = act[j] + a.bc[j];
      act[j] = v;
      const float g = Gelu(v);
      nrm[j] = g;  // GELU output, normalized below (same thread, same j)
      s += g;
    }
    const float mean = BlockReduce<false>(s, sh) / H;
    float q = 0.0f;
    for (int j = tid; j < H; j += nth) {
      const float d = nrm[j] - mean;
      q += d * d;
    }
    const float var = BlockReduce<false>(q, sh) / H;
    const float rs = 1.0f / sqrtf(var + a.eps);
    if (tid == 0) a.rstd[t] = rs;
    for (int j = tid; j < H; j += nth) {
      const float n = (nrm[j] - mean) * rs;
      nrm[j] = n;
      u[j] = n * a.gam[j] + a.bet[j];
    }
    for (int k = 0; k < K; ++k) {
      const int c = s_c[k];  // block-uniform
      if (c < 0) continue;
      const T* er = a.E + int64_t(c) * H;
      float p = 0.0f;
      for (int j = tid; j < H; j += nth) p += u[j] * ToF(er[j]);  // u[j] written by this thread
      p = BlockReduce<false>(p, sh);
      if (tid == 0) s_lq[k] = p;
    }
    if (tid == 0) {
      double m = -INFINITY;
      for (int k = 0; k < K; ++k)
        if (s_c[k] >= 0) m = fmax(m, s_lq[k]);
      if (m != -INFINITY) {
        double sum = 0.0;
        for (int k = 0; k < K; ++k)
          if (s_c[k] >= 0) sum += exp(s_lq[k] - m);
        const double lse = m + log(sum);
        for (int k = 0; k < K; ++k)
          if (s_c[k] >= 0) s_lq[k] -= lse;
      }
      for (int k = 0; k < K; ++k) {
        if (s_c[k] < 0) s_lq[k] = -INFINITY;
        a.logq[int64_t(t) * K + k] = static_cast<float>(s_lq[k]);
        if (!kPredict && s_c[k] >= 0 && s_c[k] == yt) logQ = LogAddExp(logQ, s_lq[k]);
      }
    }
  }

  // Gate logit l = w_g·h + b_g (+ a·e).
  float gl = 0.0f;
  if (a.gated) {
    float s = 0.0f;
    for (int j = tid; j < H; j += nth) s += a.wg[j] * ToF(ht[j]);
    gl = BlockReduce<false>(s, sh) + a.gb[0];
    if (a.det) gl += a.ga[0] * e;
    if (tid == 0) a.gl[t] = gl;
  }

  if (kPredict && !a.gated) {
    // Fusion none: argmax z_t, first maximum.
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = tid; j < V; j += nth) {
      const float v = ToF(zt[j]);
      if (Better(v, j, bv, bi)) { bv = v; bi = j; }
    }
    BlockArgMax(&bv, &bi, sh, shi);
    if (tid == 0) a.pred[t] = bi == INT_MAX ? 0 : bi;
    return;
  }

  // logsumexp of z_t: one pass for the max, one for the sum.
  float mx = -INFINITY;
  for (int j = tid; j < V; j += nth) mx = fmaxf(mx, ToF(zt[j]));
  mx = BlockReduce<true>(mx, sh);
  float se = 0.0f;
  for (int j = tid; j < V; j += nth) se += expf(ToF(zt[j]) - mx);
  se = BlockReduce<false>(se, sh);

  if (kPredict) {
    // Gated: the best non-candidate is the largest z outside C (P is
    // monotone in z there); candidates get (1-g) p_c + g Σ_{k: c_k = c} q_k.
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = tid; j < V; j += nth) {
      bool is_c = false;
      for (int k = 0; k < K; ++k) is_c |= s_c[k] == j;
      if (is_c) continue;
      const float v = ToF(zt[j]);
      if (Better(v, j, bv, bi)) { bv = v; bi = j; }
    }
    __syncthreads();
    BlockArgMax(&bv, &bi, sh, shi);
    if (tid == 0) {
      const double lse = double(mx) + log(double(se));
      const double g = Sigmoid(gl);
      int best = -1;
      double best_p = -1.0;
      auto offer = [&](int v, double p) {
        if (p > best_p || (p == best_p && v < best)) { best = v; best_p = p; }
      };
      if (bi != INT_MAX) offer(bi, (1.0 - g) * exp(double(ToF(zt[bi])) - lse));
      for (int k = 0; k < K; ++k) {
        const int c = s_c[k];
        if (c < 0) continue;
        bool seen = false;
        for (int j = 0; j < k; ++j) seen |= s_c[j] == c;
        if (seen) continue;
        double qs = 0.0;
        for (int j = k; j < K; ++j)
          if (s_c[j] == c) qs += exp(s_lq[j]);
        offer(c, (1.0 - g) * exp(double(ToF(zt[c])) - lse) + g * qs);
      }
      a.pred[t] = best;
    }
    return;
  }

  // Per-slot losses and fusion weights (thread 0, double; heads.cc Forward).
  if (tid == 0) {
    const double lse = double(mx) + log(double(se));
    const bool y_ok = yt >= 0 && yt < V;
    const double logp_y = y_ok ? double(ToF(zt[yt])) - lse : 0.0;
    a.zmax[t] = mx;
    a.zsum[t] = se;
    const int label = a.x[t] != yt ? 1 : 0;
    float* lt = a.loss_t + 3 * int64_t(t);
    lt[1] = a.det ? static_cast<float>(Softplus(e) - label * double(e)) : 0.0f;
    lt[2] = logQ == -INFINITY ? 0.0f : static_cast<float>(-logQ);
    a.logQ[t] = static_cast<float>(logQ);
    if (a.gated) {
      const double l = gl;
      const double logA = -Softplus(l) + logp_y;
      const double logB = logQ == -INFINITY ? -INFINITY : -Softplus(-l) + logQ;
      const double logP = LogAddExp(logA, logB);
      lt[0] = static_cast<float>(-logP);
      a.wA[t] = static_cast<float>(exp(logA - logP));
      a.wB[t] = logB == -INFINITY ? 0.0f : static_cast<float>(exp(logB - logP));
    } else {
      lt[0] = static_cast<float>(-logp_y);
      a.wA[t] = 1.0f;
      a.wB[t] = 0.0f;
    }
  }
}

// One block: sums in a fixed order (thread i takes slots i, i+n, ...; fixed
// shuffle tree), then the means and the total, as heads.cc.
__global__ void ReduceLossesKernel(DeviceHeadLosses* out, const float* loss_t, const float* logQ,
                                   int nslots, bool det, bool cand_on, float lam_det,
                                   float lam_cand) {
  __shared__ double sh[32];
  double f = 0.0, d = 0.0, c = 0.0, n = 0.0;
  for (int t = threadIdx.x; t < nslots; t += blockDim.x) {
    f += loss_t[3 * int64_t(t)];
    d += loss_t[3 * int64_t(t) + 1];
    if (logQ[t] != -INFINITY) {
      c += loss_t[3 * int64_t(t) + 2];
      n += 1.0;
    }
  }
  f = BlockSumD(f, sh);
  d = BlockSumD(d, sh);
  c = BlockSumD(c, sh);
  n = BlockSumD(n, sh);
  if (threadIdx.x == 0) {
    DeviceHeadLosses r;
    r.slots = nslots;
    r.candidate_slots = static_cast<int64_t>(n + 0.5);
    r.fusion = nslots > 0 ? f / nslots : 0.0;
    r.detector = (det && nslots > 0) ? d / nslots : 0.0;
    r.candidate = r.candidate_slots > 0 ? c / static_cast<double>(r.candidate_slots) : 0.0;
    r.total = r.fusion + (det ? double(lam_det) * r.detector : 0.0) +
              (cand_on ? double(lam_cand) * r.candidate : 0.0);
    *out = r;
  }
}

}  // namespace

template <typename T>
CudaHeads<T>::CudaHeads(const ModelConfig& cfg, int max_slots)
    : H_(cfg.hidden),
      K_(cfg.candidate_top_k < 1 ? 1 : cfg.candidate_top_k),
      max_slots_(max_slots < 0 ? 0 : max_slots),
      eps_(cfg.layer_norm_eps),
      detector_(cfg.detector),
      candidate_(cfg.candidate),
      gated_(cfg.fusion == FusionKind::kGated && cfg.candidate),
      lambda_det_(cfg.lambda_detector),
      lambda_cand_(cfg.lambda_candidate) {}

template <typename T>
CudaHeads<T>::~CudaHeads() {
  if (host_losses_ != nullptr) cudaFreeHost(host_losses_);
}

template <typename T>
Status CudaHeads<T>::Bind(const ParamStore& layout, DeviceParams* params, const CudaContext* ctx,
                          GemmRunner* gemm) {
  if (!layout.finalized())
    return FailedPreconditionError("CudaHeads::Bind: call ParamStore::Finalize() first");
  if (params == nullptr || ctx == nullptr || gemm == nullptr)
    return InvalidArgumentError("CudaHeads::Bind: params, ctx and gemm are required");
  if (params->total_numel() != layout.total_numel())
    return InvalidArgumentError("CudaHeads::Bind: DeviceParams holds " +
                                std::to_string(params->total_numel()) + " floats, the layout " +
                                std::to_string(layout.total_numel()));
  if (H_ < 1) return InvalidArgumentError("CudaHeads::Bind: hidden must be >= 1");
  DGCA_RETURN_IF_ERROR(p_.ForEach(H_, detector_, candidate_, gated_, ParamFinder(layout, "CudaHeads::Bind")));
  if (candidate_ && !std::is_same_v<T, float> && params->copy_type() != kDType<T>)
    return FailedPreconditionError(std::string("CudaHeads<") + DTypeName(kDType<T>) +
                                   ">::Bind: DeviceParams has no " + DTypeName(kDType<T>) + " copy");
  layout_ = &layout;
  params_ = params;
  ctx_ = ctx;
  gemm_ = gemm;
  const size_t Tn = static_cast<size_t>(max_slots_);
  const size_t TH = Tn * static_cast<size_t>(H_), TK = Tn * static_cast<size_t>(K_);
  DGCA_RETURN_IF_ERROR(y_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(label_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(e_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(gl_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(logQ_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(zmax_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(zsum_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(loss_t_.Allocate(3 * Tn));
  DGCA_RETURN_IF_ERROR(wA_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(wB_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(dl_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(de_.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(losses_.Allocate(1));
  DGCA_RETURN_IF_ERROR(losses_.Zero());
  // Zero() runs on the legacy stream; the model's stream does not wait for it.
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize (CudaHeads::Bind)"));
  if (candidate_) {
    DGCA_RETURN_IF_ERROR(cand_.Allocate(TK));
    DGCA_RETURN_IF_ERROR(act_.Allocate(TH));
    DGCA_RETURN_IF_ERROR(nrm_.Allocate(TH));
    DGCA_RETURN_IF_ERROR(u_.Allocate(TH));
    DGCA_RETURN_IF_ERROR(rstd_.Allocate(Tn));
    DGCA_RETURN_IF_ERROR(logq_.Allocate(TK));
    DGCA_RETURN_IF_ERROR(ds_.Allocate(TK));
    DGCA_RETURN_IF_ERROR(du_.Allocate(TH));
    DGCA_RETURN_IF_ERROR(da_.Allocate(TH));
    if (!std::is_same_v<T, float>) DGCA_RETURN_IF_ERROR(da_t_.Allocate(TH));
    DGCA_RETURN_IF_ERROR(sort_keys_.Allocate(TK));
    DGCA_RETURN_IF_ERROR(sort_vals_.Allocate(TK));
    DGCA_RETURN_IF_ERROR(sort_keys_out_.Allocate(TK));
    DGCA_RETURN_IF_ERROR(sort_vals_out_.Allocate(TK));
    size_t bytes = 0;
    if (TK > 0) {
      DGCA_RETURN_IF_ERROR(CudaStatus(
          cub::DeviceRadixSort::SortPairs(nullptr, bytes, sort_keys_.get(), sort_keys_out_.get(),
                                          sort_vals_.get(), sort_vals_out_.get(),
                                          static_cast<int>(TK), 0, 32, ctx->stream()),
          "CudaHeads::Bind: radix sort size"));
    }
    DGCA_RETURN_IF_ERROR(sort_temp_.Allocate(bytes));
  }
  if (detector_ || candidate_) {
    const size_t nchunks = (Tn + kChunk - 1) / kChunk;
    DGCA_RETURN_IF_ERROR(col_part_.Allocate(nchunks * kColSums * static_cast<size_t>(H_)));
  }
  if (host_losses_ == nullptr) {
    void* p = nullptr;
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&p, sizeof(DeviceHeadLosses)),
                                    "CudaHeads::Bind: cudaMallocHost"));
    host_losses_ = static_cast<DeviceHeadLosses*>(p);
  }
  bound_ = true;
  return OkStatus();
}

template <typename T>
Status CudaHeads<T>::PoisonScratch() {
  if (!bound_) return FailedPreconditionError("CudaHeads: Bind() was not called");
  DGCA_RETURN_IF_ERROR(cand_.Poison());
  DGCA_RETURN_IF_ERROR(y_.Poison());
  DGCA_RETURN_IF_ERROR(label_.Poison());
  for (DeviceArray<float>* a : {&e_, &gl_, &act_, &nrm_, &u_, &rstd_, &logq_, &logQ_, &zmax_,
                                &zsum_, &loss_t_, &wA_, &wB_, &dl_, &de_, &ds_, &du_, &da_})
    DGCA_RETURN_IF_ERROR(a->Poison());
  DGCA_RETURN_IF_ERROR(da_t_.Poison());
  DGCA_RETURN_IF_ERROR(col_part_.Poison());
  for (DeviceArray<int32_t>* a : {&sort_keys_, &sort_vals_, &sort_keys_out_, &sort_vals_out_})
    DGCA_RETURN_IF_ERROR(a->Poison());
  DGCA_RETURN_IF_ERROR(losses_.Poison());
  return CudaStatus(cudaDeviceSynchronize(), "CudaHeads::PoisonScratch");
}

template <typename T>
Status CudaHeads<T>::CheckHost(const void* cand, const void* x, const void* y, int slots, int V,
                               bool need_y) const {
  if (!bound_) return FailedPreconditionError("CudaHeads: Bind() was not called");
  if (slots < 0 || slots > max_slots_)
    return InvalidArgumentError("CudaHeads: " + std::to_string(slots) +
                                " target slots; valid is 0.." + std::to_string(max_slots_) +
                                " (max_slots)");
  if (V < 1)
    return InvalidArgumentError("CudaHeads: vocabulary size " + std::to_string(V) +
                                " must be >= 1");
  if (candidate_ && cand == nullptr && slots > 0)
    return InvalidArgumentError("CudaHeads: candidate head is on but no candidate ids were given");
  if (need_y && slots > 0 && (x == nullptr || y == nullptr))
    return InvalidArgumentError("CudaHeads::Forward: source and target ids are required");
  return OkStatus();
}

template <typename T>
Status CudaHeads<T>::SlotForward(const T* h, const T* z, const T* E, const int32_t* cand,
                                 const int32_t* x, const int32_t* y, int Tn, int V, int32_t* pred) {
  const bool heads = pred == nullptr || gated_;
  if (heads && candidate_) {
    // W_c straight from the flat parameters: ParamStore aligns each tensor
    // (16 bytes of the bf16/fp16 copy), so cuBLASLt's tensor-core kernels
    // take it.
    GemmArgs g;  // act = h W_c^T (fp32 out; b_c added by the slot kernel)
    g.trans_b = true;
    g.M = Tn;
    g.N = H_;
    g.K = H_;
    g.A = h;
    g.lda = H_;
    g.B = params_->weight<T>(p_.cd_w);
    g.ldb = H_;
    g.C = act_.get();
    g.ldc = H_;
    g.in_type = kDType<T>;
    g.out_type = DType::kF32;
    DGCA_RETURN_IF_ERROR(gemm_->Run(g));
  }
  FwdArgs<T> a{};
  a.h = h;
  a.z = z;
  a.E = E;
  a.x = x;
  a.y = y;
  a.H = H_;
  a.K = K_;
  a.V = V;
  a.eps = eps_;
  a.pred = pred;
  if (heads) {
    a.cand = candidate_ ? cand : nullptr;
    a.det = detector_;
    a.cand_on = candidate_;
    a.gated = gated_;
    if (detector_) {
      a.wd = params_->master(p_.det_w);
      a.bd = params_->master(p_.det_b);
    }
    if (candidate_) {
      a.bc = params_->master(p_.cd_b);
      a.gam = params_->master(p_.ln_w);
      a.bet = params_->master(p_.ln_b);
    }
    if (gated_) {
      a.wg = params_->master(p_.g_w);
      a.ga = detector_ ? params_->master(p_.g_a) : nullptr;
      a.gb = params_->master(p_.g_b);
    }
  }
  a.cand_s = cand_.get();
  a.y_s = y_.get();
  a.label_s = label_.get();
  a.e = e_.get();
  a.gl = gl_.get();
  a.act = act_.get();
  a.nrm = nrm_.get();
  a.u = u_.get();
  a.rstd = rstd_.get();
  a.logq = logq_.get();
  a.logQ = logQ_.get();
  a.zmax = zmax_.get();
  a.zsum = zsum_.get();
  a.loss_t = loss_t_.get();
  a.wA = wA_.get();
  a.wB = wB_.get();
  const size_t shmem = static_cast<size_t>(K_) * (sizeof(double) + sizeof(int));
  if (pred != nullptr) {
    SlotForwardKernel<T, true><<<Tn, kThreads, shmem, ctx_->stream()>>>(a);
    return Launched("CudaHeads: SlotForwardKernel<predict>");
  }
  SlotForwardKernel<T, false><<<Tn, kThreads, shmem, ctx_->stream()>>>(a);
  return Launched("CudaHeads: SlotForwardKernel");
}

template <typename T>
Status CudaHeads<T>::Forward(const T* h, const T* z, const T* E, const int32_t* cand,
                             const int32_t* x, const int32_t* y, int Tn, int V,
                             HeadLosses* out) {
  DGCA_RETURN_IF_ERROR(CheckHost(cand, x, y, Tn, V, /*need_y=*/true));
  if (Tn > 0 && (h == nullptr || z == nullptr || (candidate_ && E == nullptr)))
    return InvalidArgumentError("CudaHeads::Forward: h, z (and E with the candidate head) are required");
  SetForwardInputs(h, z, E, Tn, V);
  cudaStream_t stream = ctx_->stream();
  if (Tn > 0) DGCA_RETURN_IF_ERROR(SlotForward(h, z, E, cand, x, y, Tn, V, /*pred=*/nullptr));
  ReduceLossesKernel<<<1, kThreads, 0, stream>>>(losses_.get(), loss_t_.get(), logQ_.get(), Tn,
                                                 detector_, candidate_, lambda_det_, lambda_cand_);
  DGCA_RETURN_IF_ERROR(Launched("CudaHeads: ReduceLossesKernel"));
  if (out != nullptr) {
    // The one device->host copy of Forward (48 bytes) and its synchronization.
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host_losses_, losses_.get(),
                                                    sizeof(DeviceHeadLosses),
                                                    cudaMemcpyDeviceToHost, stream),
                                    "CudaHeads::Forward: loss copy"));
    DGCA_RETURN_IF_ERROR(ctx_->Synchronize());
    HeadLosses r;
    r.total = host_losses_->total;
    r.fusion = host_losses_->fusion;
    r.detector = host_losses_->detector;
    r.candidate = host_losses_->candidate;
    r.slots = host_losses_->slots;
    r.candidate_slots = host_losses_->candidate_slots;
    *out = r;
  }
  return OkStatus();
}

template <typename T>
Status CudaHeads<T>::Predict(const T* h, const T* z, const T* E, const int32_t* cand,
                             const int32_t* x, int Tn, int V, int32_t* pred) {
  DGCA_RETURN_IF_ERROR(CheckHost(cand, x, nullptr, Tn, V, /*need_y=*/false));
  T_ = 0;  // Backward() is not valid after Predict()
  if (Tn == 0) return OkStatus();
  if (pred == nullptr || z == nullptr || (gated_ && (h == nullptr || E == nullptr)))
    return InvalidArgumentError("CudaHeads::Predict: z, pred (and h, E when gated) are required");
  return SlotForward(h, z, E, cand, x, /*y=*/nullptr, Tn, V, pred);
}

// Backward is instantiated in cuda_heads_backward.cu.
template class CudaHeads<float>;
template class CudaHeads<bf16>;
template class CudaHeads<__half>;

}  // namespace cuda
}  // namespace dgca
