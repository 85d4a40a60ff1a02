// CudaPromptEncoder: see cuda_prompt_encoder.h. Checked on the CUDA emulator and on an H200 (docs/benchmarks.md).
// Mirrors model/nn/prompt_encoder.cc step by step (same loop structure, so
// the two can be read side by side).
#include "model/cuda/cuda_prompt_encoder.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/cuda/kernels.h"

namespace dgca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

__device__ __forceinline__ float Sigm(float v) { return 1.0f / (1.0f + expf(-v)); }

// g[t, j] += bih[j] + bhh[j] (the CPU adds the two biases' sum).
__global__ void Bias2AddKernel(float* g, const float* bih, const float* bhh, int rows, int cols) {
  const int64_t n = int64_t(rows) * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % cols);
    g[i] += bih[j] + bhh[j];
  }
}

// v = max(0, v + b[j]).
__global__ void BiasReluKernel(float* v, const float* b, int rows, int cols) {
  const int64_t n = int64_t(rows) * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    v[i] = fmaxf(0.0f, v[i] + b[i % cols]);
}

// d = 0 where the ReLU output was <= 0.
__global__ void ReluMaskKernel(float* d, const float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (out[i] <= 0.0f) d[i] = 0.0f;
}

// One LSTM step, pointwise: g [4H] pre-activations in, activations out
// (i, f, g, o); c = f·c_prev + i·g (c_prev null = 0); h = o·tanh(c).
__global__ void LstmStepForwardKernel(float* g, const float* cp, float* c, float* tc, float* h,
                                      int H) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= H) return;
  const float gi = Sigm(g[j]);
  const float gf = Sigm(g[H + j]);
  const float gg = tanhf(g[2 * H + j]);
  const float go = Sigm(g[3 * H + j]);
  g[j] = gi;
  g[H + j] = gf;
  g[2 * H + j] = gg;
  g[3 * H + j] = go;
  const float cv = (cp != nullptr ? gf * cp[j] : 0.0f) + gi * gg;
  c[j] = cv;
  const float t = tanhf(cv);
  tc[j] = t;
  h[j] = go * t;
}

// One LSTM step backward, pointwise (prompt_encoder.cc LstmDirBackward):
// dh = dht + dh_next; dc = dc_next + dh·o·(1 − tanh²c); gate grads into dg;
// dc_next = dc·f (in place).
__global__ void LstmStepBackwardKernel(const float* g, const float* tc, const float* cp,
                                       const float* dht, const float* dh_next, float* dc_next,
                                       float* dg, int H) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= H) return;
  const float gi = g[j], gf = g[H + j], gg = g[2 * H + j], go = g[3 * H + j];
  const float dh = dht[j] + dh_next[j];
  const float dc = dc_next[j] + dh * go * (1.0f - tc[j] * tc[j]);
  dg[j] = dc * gg * gi * (1.0f - gi);
  dg[H + j] = cp != nullptr ? dc * cp[j] * gf * (1.0f - gf) : 0.0f;
  dg[2 * H + j] = dc * gi * (1.0f - gg * gg);
  dg[3 * H + j] = dh * tc[j] * go * (1.0f - go);
  dc_next[j] = dc * gf;
}


}  // namespace

CudaPromptEncoder::CudaPromptEncoder(const ModelConfig& cfg)
    : kind_(cfg.prompt_encoder), rows_(2 * cfg.prompt_length), hidden_(cfg.hidden) {}

Status CudaPromptEncoder::Gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda,
                               const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return OkStatus();
  GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = A;
  g.lda = lda;
  g.B = B;
  g.ldb = ldb;
  g.C = C;
  g.ldc = ldc;
  g.beta = beta;
  g.in_type = DType::kF32;
  g.out_type = DType::kF32;
  return gemm_->Run(g);
}

Status CudaPromptEncoder::Bind(const ParamStore& layout, DeviceParams* params,
                               const CudaContext* ctx, GemmRunner* gemm) {
  layout_ = &layout;
  params_ = params;
  ctx_ = ctx;
  gemm_ = gemm;
  if (kind_ == PromptEncoderKind::kNone) {
    bound_ = true;
    return OkStatus();
  }
  if (!layout.finalized())
    return FailedPreconditionError("CudaPromptEncoder::Bind: call ParamStore::Finalize() first");
  if (params == nullptr || ctx == nullptr || gemm == nullptr)
    return InvalidArgumentError("CudaPromptEncoder::Bind: params, ctx and gemm are required");
  if (params->total_numel() != layout.total_numel())
    return InvalidArgumentError("CudaPromptEncoder::Bind: DeviceParams holds " +
                                std::to_string(params->total_numel()) + " floats, the layout " +
                                std::to_string(layout.total_numel()));
  if (rows_ <= 0 || hidden_ <= 0)
    return InvalidArgumentError("CudaPromptEncoder: prompt_length " + std::to_string(rows_ / 2) +
                                " and hidden " + std::to_string(hidden_) +
                                " must both be >= 1 (or use prompt encoder none)");
  const int64_t H = hidden_, S = rows_;
  DGCA_RETURN_IF_ERROR(p_.ForEach(kind_, S, H, ParamFinder(layout, "CudaPromptEncoder::Bind")));
  if (kind_ == PromptEncoderKind::kLstm) {
    for (int d = 0; d < 4; ++d) {
      const int64_t in = d < 2 ? H : 2 * H;
      Dir& D = dirs_[d];
      D.p = &p_.lstm[d];
      D.in = static_cast<int>(in);
      D.reverse = (d % 2) == 1;
      DGCA_RETURN_IF_ERROR(D.gates.Allocate(static_cast<size_t>(S * 4 * H)));
      DGCA_RETURN_IF_ERROR(D.c.Allocate(static_cast<size_t>(S * H)));
      DGCA_RETURN_IF_ERROR(D.tanh_c.Allocate(static_cast<size_t>(S * H)));
    }
    DGCA_RETURN_IF_ERROR(out0_.Allocate(static_cast<size_t>(S * 2 * H)));
    DGCA_RETURN_IF_ERROR(out1_.Allocate(static_cast<size_t>(S * 2 * H)));
    DGCA_RETURN_IF_ERROR(d_out0_.Allocate(static_cast<size_t>(S * 2 * H)));
    DGCA_RETURN_IF_ERROR(d_out1_.Allocate(static_cast<size_t>(S * 2 * H)));
    DGCA_RETURN_IF_ERROR(dgates_.Allocate(static_cast<size_t>(S * 4 * H)));
    DGCA_RETURN_IF_ERROR(dh_.Allocate(static_cast<size_t>(H)));
    DGCA_RETURN_IF_ERROR(dc_.Allocate(static_cast<size_t>(H)));
  }
  DGCA_RETURN_IF_ERROR(hid_.Allocate(static_cast<size_t>(S * H)));
  DGCA_RETURN_IF_ERROR(out_.Allocate(static_cast<size_t>(S * H)));
  DGCA_RETURN_IF_ERROR(d_hid_.Allocate(static_cast<size_t>(S * H)));
  DGCA_RETURN_IF_ERROR(out16_.Allocate(static_cast<size_t>(S * H)));
  // Bias-gradient column sums over S rows (none unless S > kColumnChunkRows).
  const int64_t col = std::max(ColumnSumScratchElems(S, 4 * H), ColumnSumScratchElems(S, H));
  DGCA_RETURN_IF_ERROR(col_scratch_.Allocate(static_cast<size_t>(std::max<int64_t>(col, 1))));
  bound_ = true;
  return OkStatus();
}

Status CudaPromptEncoder::PoisonScratch() {
  if (!bound_) return FailedPreconditionError("CudaPromptEncoder: Bind() was not called");
  for (Dir& D : dirs_) {
    DGCA_RETURN_IF_ERROR(D.gates.Poison());
    DGCA_RETURN_IF_ERROR(D.c.Poison());
    DGCA_RETURN_IF_ERROR(D.tanh_c.Poison());
  }
  for (DeviceArray<float>* a : {&out0_, &out1_, &hid_, &out_, &d_out1_, &d_out0_, &d_hid_,
                                &dgates_, &dh_, &dc_})
    DGCA_RETURN_IF_ERROR(a->Poison());
  DGCA_RETURN_IF_ERROR(out16_.Poison());
  return CudaStatus(cudaDeviceSynchronize(), "CudaPromptEncoder::PoisonScratch");
}

Status CudaPromptEncoder::DirForward(Dir* d, const float* x, float* out) {
  const int S = rows_, H = hidden_, G = 4 * hidden_;
  const int col = d->reverse ? H : 0;
  cudaStream_t stream = ctx_->stream();
  const float* Wih = params_->master(d->p->w_ih);
  const float* Whh = params_->master(d->p->w_hh);
  // Input projection for all steps: gates = x W_ih^T + b_ih + b_hh.
  DGCA_RETURN_IF_ERROR(Gemm(false, true, S, G, d->in, x, d->in, Wih, d->in, 0.0f, d->gates.get(), G));
  Bias2AddKernel<<<Blocks(int64_t(S) * G), kThreads, 0, stream>>>(
      d->gates.get(), params_->master(d->p->b_ih), params_->master(d->p->b_hh), S, G);
  DGCA_RETURN_IF_ERROR(Launched("CudaPromptEncoder: Bias2Add"));
  // Recurrence; h_{-1} = c_{-1} = 0; the reverse direction walks t = S-1..0.
  for (int step = 0; step < S; ++step) {
    const int t = d->reverse ? S - 1 - step : step;
    const int tp = d->reverse ? t + 1 : t - 1;
    float* g = d->gates.get() + int64_t(t) * G;
    if (step > 0) {
      const float* hp = out + int64_t(tp) * 2 * H + col;
      DGCA_RETURN_IF_ERROR(Gemm(false, true, 1, G, H, hp, 2 * H, Whh, H, 1.0f, g, G));
    }
    const float* cp = step > 0 ? d->c.get() + int64_t(tp) * H : nullptr;
    LstmStepForwardKernel<<<Blocks(H), kThreads, 0, stream>>>(
        g, cp, d->c.get() + int64_t(t) * H, d->tanh_c.get() + int64_t(t) * H,
        out + int64_t(t) * 2 * H + col, H);
    DGCA_RETURN_IF_ERROR(Launched("CudaPromptEncoder: LstmStepForward"));
  }
  return OkStatus();
}

Status CudaPromptEncoder::DirBackward(Dir* d, const float* x, const float* out, const float* dout,
                                      float* dx) {
  const int S = rows_, H = hidden_, G = 4 * hidden_;
  const int col = d->reverse ? H : 0;
  cudaStream_t stream = ctx_->stream();
  const float* Wih = params_->master(d->p->w_ih);
  const float* Whh = params_->master(d->p->w_hh);
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(dh_.get(), 0, sizeof(float) * H, stream), "memset dh"));
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(dc_.get(), 0, sizeof(float) * H, stream), "memset dc"));
  for (int step = S - 1; step >= 0; --step) {
    const int t = d->reverse ? S - 1 - step : step;
    const int tp = d->reverse ? t + 1 : t - 1;
    float* dg = dgates_.get() + int64_t(t) * G;
    const float* cp = step > 0 ? d->c.get() + int64_t(tp) * H : nullptr;
    LstmStepBackwardKernel<<<Blocks(H), kThreads, 0, stream>>>(
        d->gates.get() + int64_t(t) * G, d->tanh_c.get() + int64_t(t) * H, cp,
        dout + int64_t(t) * 2 * H + col, dh_.get(), dc_.get(), dg, H);
    DGCA_RETURN_IF_ERROR(Launched("CudaPromptEncoder: LstmStepBackward"));
    // dh_{t-1} = dgates_t W_hh (overwrites dh_, already consumed above).
    if (step > 0) DGCA_RETURN_IF_ERROR(Gemm(false, false, 1, H, G, dg, G, Whh, H, 0.0f, dh_.get(), H));
  }
  // dW_hh += Σ_{steps > 0} dgates_t^T h_{t-1}: one GEMM over the S-1 steps.
  // Forward direction: gate rows 1..S-1 against hidden rows 0..S-2; reverse:
  // gate rows 0..S-2 against hidden rows 1..S-1.
  if (S > 1) {
    const int r0 = d->reverse ? 0 : 1, h0 = d->reverse ? 1 : 0;
    DGCA_RETURN_IF_ERROR(Gemm(true, false, G, H, S - 1, dgates_.get() + int64_t(r0) * G, G,
                              out + int64_t(h0) * 2 * H + col, 2 * H, 1.0f,
                              params_->grad(d->p->w_hh), H));
  }
  // Input projection: dW_ih += dgates^T x; biases; dx += dgates W_ih.
  DGCA_RETURN_IF_ERROR(Gemm(true, false, G, d->in, S, dgates_.get(), G, x, d->in, 1.0f,
                            params_->grad(d->p->w_ih), d->in));
  DGCA_RETURN_IF_ERROR(ColumnSumAdd<float>(stream, params_->grad(d->p->b_ih), dgates_.get(), S, G, col_scratch_.get()));
  DGCA_RETURN_IF_ERROR(ColumnSumAdd<float>(stream, params_->grad(d->p->b_hh), dgates_.get(), S, G, col_scratch_.get()));
  return Gemm(false, false, S, d->in, G, dgates_.get(), G, Wih, d->in, 1.0f, dx, d->in);
}

Status CudaPromptEncoder::Forward(const float** out) {
  *out = nullptr;
  if (!bound_) return FailedPreconditionError("CudaPromptEncoder: Bind() was not called");
  if (kind_ == PromptEncoderKind::kNone) return OkStatus();
  const int S = rows_, H = hidden_;
  cudaStream_t stream = ctx_->stream();
  const float* emb = params_->master(p_.emb);
  const float* in0 = emb;
  int in_w = H;
  if (kind_ == PromptEncoderKind::kLstm) {
    DGCA_RETURN_IF_ERROR(DirForward(&dirs_[0], emb, out0_.get()));
    DGCA_RETURN_IF_ERROR(DirForward(&dirs_[1], emb, out0_.get()));
    DGCA_RETURN_IF_ERROR(DirForward(&dirs_[2], out0_.get(), out1_.get()));
    DGCA_RETURN_IF_ERROR(DirForward(&dirs_[3], out0_.get(), out1_.get()));
    in0 = out1_.get();
    in_w = 2 * H;
  }
  // hid = ReLU(in0 W0^T + b0); out = hid W2^T + b2.
  DGCA_RETURN_IF_ERROR(Gemm(false, true, S, H, in_w, in0, in_w, params_->master(p_.mlp0_w), in_w,
                            0.0f, hid_.get(), H));
  BiasReluKernel<<<Blocks(int64_t(S) * H), kThreads, 0, stream>>>(hid_.get(),
                                                                   params_->master(p_.mlp0_b), S, H);
  DGCA_RETURN_IF_ERROR(Launched("CudaPromptEncoder: BiasRelu"));
  DGCA_RETURN_IF_ERROR(Gemm(false, true, S, H, H, hid_.get(), H, params_->master(p_.mlp2_w), H, 0.0f,
                            out_.get(), H));
  DGCA_RETURN_IF_ERROR(BiasAdd<float>(stream, out_.get(), params_->master(p_.mlp2_b), S, H));
  *out = out_.get();
  return OkStatus();
}

template <typename T>
Status CudaPromptEncoder::ForwardAs(const T** out) {
  static_assert(sizeof(T) == sizeof(uint16_t), "ForwardAs converts to bf16 or fp16");
  *out = nullptr;
  const float* f = nullptr;
  DGCA_RETURN_IF_ERROR(Forward(&f));
  if (f == nullptr) return OkStatus();
  T* rows = reinterpret_cast<T*>(out16_.get());
  DGCA_RETURN_IF_ERROR(CastFromFloat<T>(ctx_->stream(), rows, f, int64_t(rows_) * hidden_));
  *out = rows;
  return OkStatus();
}
template Status CudaPromptEncoder::ForwardAs<bf16>(const bf16**);
template Status CudaPromptEncoder::ForwardAs<__half>(const __half**);

Status CudaPromptEncoder::Backward(const float* dout) {
  if (!bound_) return FailedPreconditionError("CudaPromptEncoder: Bind() was not called");
  if (kind_ == PromptEncoderKind::kNone) return OkStatus();
  const int S = rows_, H = hidden_;
  cudaStream_t stream = ctx_->stream();
  const bool lstm = kind_ == PromptEncoderKind::kLstm;
  const float* in0 = lstm ? out1_.get() : params_->master(p_.emb);
  const int in_w = lstm ? 2 * H : H;
  // Linear 2: dW2 += dout^T hid; db2 += Σ dout; dhid = dout W2, masked by ReLU.
  DGCA_RETURN_IF_ERROR(Gemm(true, false, H, H, S, dout, H, hid_.get(), H, 1.0f,
                            params_->grad(p_.mlp2_w), H));
  DGCA_RETURN_IF_ERROR(ColumnSumAdd<float>(stream, params_->grad(p_.mlp2_b), dout, S, H, col_scratch_.get()));
  DGCA_RETURN_IF_ERROR(Gemm(false, false, S, H, H, dout, H, params_->master(p_.mlp2_w), H, 0.0f,
                            d_hid_.get(), H));
  ReluMaskKernel<<<Blocks(int64_t(S) * H), kThreads, 0, stream>>>(d_hid_.get(), hid_.get(),
                                                                   int64_t(S) * H);
  DGCA_RETURN_IF_ERROR(Launched("CudaPromptEncoder: ReluMask"));
  // Linear 0.
  DGCA_RETURN_IF_ERROR(Gemm(true, false, H, in_w, S, d_hid_.get(), H, in0, in_w, 1.0f,
                            params_->grad(p_.mlp0_w), in_w));
  DGCA_RETURN_IF_ERROR(ColumnSumAdd<float>(stream, params_->grad(p_.mlp0_b), d_hid_.get(), S, H, col_scratch_.get()));
  float* demb = params_->grad(p_.emb);
  if (!lstm)  // the embedding feeds Linear 0 directly
    return Gemm(false, false, S, H, H, d_hid_.get(), H, params_->master(p_.mlp0_w), H, 1.0f, demb, H);
  DGCA_RETURN_IF_ERROR(Gemm(false, false, S, in_w, H, d_hid_.get(), H, params_->master(p_.mlp0_w),
                            in_w, 0.0f, d_out1_.get(), in_w));
  DGCA_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(d_out0_.get(), 0, sizeof(float) * size_t(S) * 2 * H, stream), "memset d_out0"));
  DGCA_RETURN_IF_ERROR(DirBackward(&dirs_[2], out0_.get(), out1_.get(), d_out1_.get(), d_out0_.get()));
  DGCA_RETURN_IF_ERROR(DirBackward(&dirs_[3], out0_.get(), out1_.get(), d_out1_.get(), d_out0_.get()));
  const float* emb = params_->master(p_.emb);
  DGCA_RETURN_IF_ERROR(DirBackward(&dirs_[0], emb, out0_.get(), d_out0_.get(), demb));
  return DirBackward(&dirs_[1], emb, out0_.get(), d_out0_.get(), demb);
}

}  // namespace cuda
}  // namespace dgca
