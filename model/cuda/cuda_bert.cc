// CudaBert<T> (cuda_bert.h): dgca::Bert (model/nn/bert.cc) line by line on
// the GPU. Each forward/backward step names the CPU step it mirrors.
//
// Checked on the CUDA emulator and on an H200 (docs/benchmarks.md). model/cuda_check/bert_check.cc compares it
// with dgca::Bert (fp32 within 1e-4 relative; bf16 looser, see there).
#include "model/cuda/cuda_bert.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "model/cuda/attention.h"
#include "model/cuda/bert_kernels.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/kernels.h"

#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define DGCA_HAVE_NVTX 1
#endif
#endif

namespace dgca {
namespace cuda {

void NvtxPush(const char* name) {
#ifdef DGCA_HAVE_NVTX
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

void NvtxPop() {
#ifdef DGCA_HAVE_NVTX
  nvtxRangePop();
#endif
}

namespace {

// Pops the range on every return path.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { NvtxPush(name); }
  ~NvtxRange() { NvtxPop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// cuBLASLt's bias epilogue wants an aligned bias vector (16 bytes is what
// other users found necessary on A100); a less aligned bias is added by
// BiasAdd after the GEMM instead. Every bias in the flat layout is at a
// multiple of H floats, so this is the rare path.
bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename U>
Status Alloc(DeviceArray<U>* a, size_t n, const char* what) {
  return a->Allocate(n).WithPrefix(std::string("CudaBert::Bind ") + what);
}

}  // namespace

template <typename T>
CudaBert<T>::CudaBert(const ModelConfig& cfg, int max_batch, int seq_len, int max_head_rows)
    : cfg_(cfg),
      max_batch_(max_batch),
      seq_len_(seq_len),
      max_rows_(max_head_rows),
      H_(cfg.hidden),
      F_(cfg.ffn),
      V_(cfg.vocab_size),
      nh_(cfg.heads) {}

template <typename T>
Status CudaBert<T>::Bind(const ParamStore& layout, DeviceParams* params, const CudaContext* ctx,
                         GemmRunner* gemm) {
  bound_ = false;
  // The layout and config are validated first (no CUDA involved), then the
  // device objects.
  if (!layout.finalized()) return FailedPreconditionError("CudaBert::Bind: the ParamStore is not finalized");
  if (nh_ <= 0 || H_ % nh_ != 0)
    return InvalidArgumentError("CudaBert: hidden " + std::to_string(H_) + " is not a multiple of heads " +
                                std::to_string(nh_));
  if (max_batch_ <= 0 || seq_len_ <= 0 || max_rows_ < 0)
    return InvalidArgumentError("CudaBert: max_batch and seq_len must be positive, max_head_rows >= 0");
  if (seq_len_ > cfg_.max_position)
    return InvalidArgumentError("CudaBert: seq_len " + std::to_string(seq_len_) + " exceeds max_position " +
                                std::to_string(cfg_.max_position));
  if (seq_len_ > 512)
    return InvalidArgumentError("CudaBert: seq_len " + std::to_string(seq_len_) +
                                " exceeds the attention kernels' 512");

  const ParamFinder find_fn(layout, "CudaBert::Bind");
  const int64_t H = H_, F = F_, V = V_;
  DGCA_RETURN_IF_ERROR(p_.ForEachWordEmbedding(cfg_, find_fn));
  layers_.clear();
  layers_.resize(cfg_.layers);
  DGCA_RETURN_IF_ERROR(p_.ForEachBody(cfg_, &layers_, find_fn));
  for (int l = 0; l < cfg_.layers; ++l) {
    Layer& ly = layers_[l];
    // The fused QKV GEMM ([3H,H] weight, [3H] bias) needs q, k, v adjacent
    // in the flat buffer, in that order (dgca::Bert declares them so).
    const int64_t q_w = layout.info(ly.qkv_w).offset, q_b = layout.info(ly.qkv_b).offset;
    if (layout.info(ly.k_w).offset != q_w + H * H || layout.info(ly.v_w).offset != q_w + 2 * H * H ||
        layout.info(ly.k_b).offset != q_b + H || layout.info(ly.v_b).offset != q_b + 2 * H) {
      return InvalidArgumentError("CudaBert::Bind: layer " + std::to_string(l) +
                                  ": q/k/v weights and biases are not contiguous (declare them as dgca::Bert does)");
    }
    ly.first = ly.qkv_w;
    ly.fwd_name = "bert.layer" + std::to_string(l) + ".fwd";
    ly.bwd_name = "bert.layer" + std::to_string(l) + ".bwd";
  }
  DGCA_RETURN_IF_ERROR(p_.ForEachMlmHead(cfg_, find_fn));
  head_first_ = p_.hd_w;
  if (params == nullptr || ctx == nullptr || gemm == nullptr)
    return InvalidArgumentError("CudaBert::Bind: null DeviceParams, CudaContext or GemmRunner");
  if (params->total_numel() != layout.total_numel()) {
    return InvalidArgumentError("CudaBert::Bind: DeviceParams holds " + std::to_string(params->total_numel()) +
                                " floats, the ParamStore " + std::to_string(layout.total_numel()));
  }
  if constexpr (!std::is_same_v<T, float>) {
    if (params->copy_type() != kDType<T>)
      return FailedPreconditionError(std::string("CudaBert<") + DTypeName(kDType<T>) + ">::Bind: DeviceParams has no " +
                                     DTypeName(kDType<T>) + " copy");
  }
  params_ = params;
  ctx_ = ctx;
  gemm_ = gemm;

  // Activations, allocated once (as dgca::Bert::Bind).
  const size_t N = static_cast<size_t>(max_batch_) * seq_len_;
  for (Layer& ly : layers_) {
    DGCA_RETURN_IF_ERROR(Alloc(&ly.qkv, N * 3 * H, "qkv"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.ctx, N * H, "ctx"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.r1, N * H, "r1"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.mean1, N, "mean1"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.rstd1, N, "rstd1"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.h1, N * H, "h1"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.f1, N * F, "f1"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.g, N * F, "g"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.r2, N * H, "r2"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.mean2, N, "mean2"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.rstd2, N, "rstd2"));
    DGCA_RETURN_IF_ERROR(Alloc(&ly.out, N * H, "out"));
  }
  DGCA_RETURN_IF_ERROR(Alloc(&emb_in_, N * H, "emb_in"));
  DGCA_RETURN_IF_ERROR(Alloc(&emb_out_, N * H, "emb_out"));
  DGCA_RETURN_IF_ERROR(Alloc(&emb_mean_, N, "emb_mean"));
  DGCA_RETURN_IF_ERROR(Alloc(&emb_rstd_, N, "emb_rstd"));
  DGCA_RETURN_IF_ERROR(Alloc(&pos_ids_, N, "pos_ids"));
  DGCA_RETURN_IF_ERROR(Alloc(&type_ids_, N, "type_ids"));
  DGCA_RETURN_IF_ERROR(Alloc(&word_ids_, N, "word_ids"));
  DGCA_RETURN_IF_ERROR(Alloc(&prompt_ids_, N, "prompt_ids"));
  const size_t R = static_cast<size_t>(std::max(1, max_rows_));
  DGCA_RETURN_IF_ERROR(Alloc(&rows_, R, "rows"));
  DGCA_RETURN_IF_ERROR(Alloc(&sel_, R * H, "sel"));
  DGCA_RETURN_IF_ERROR(Alloc(&t1_, R * H, "t1"));
  DGCA_RETURN_IF_ERROR(Alloc(&t2_, R * H, "t2"));
  DGCA_RETURN_IF_ERROR(Alloc(&t3_, R * H, "t3"));
  DGCA_RETURN_IF_ERROR(Alloc(&tmean_, R, "tmean"));
  DGCA_RETURN_IF_ERROR(Alloc(&trstd_, R, "trstd"));
  DGCA_RETURN_IF_ERROR(Alloc(&logits_, R * V, "logits"));
  DGCA_RETURN_IF_ERROR(Alloc(&dcur_, N * H, "dcur"));
  DGCA_RETURN_IF_ERROR(Alloc(&dtmp_, N * H, "dtmp"));
  DGCA_RETURN_IF_ERROR(Alloc(&dctx_, N * H, "dctx"));
  DGCA_RETURN_IF_ERROR(Alloc(&dqkv_, N * 3 * H, "dqkv"));
  DGCA_RETURN_IF_ERROR(Alloc(&dg_, N * F, "dg"));
  DGCA_RETURN_IF_ERROR(Alloc(&dsel_, R * H, "dsel"));
  DGCA_RETURN_IF_ERROR(Alloc(&dt_, R * H, "dt"));
  DGCA_RETURN_IF_ERROR(Alloc(&mask_, N, "mask"));
  DGCA_RETURN_IF_ERROR(AllocAttention(FusedFor(want_fused_)));
  // Column-reduction scratch: the largest of every LayerNorm (two sums) and
  // bias gradient this module computes.
  const int Ni = static_cast<int>(N), Ri = static_cast<int>(R);
  int64_t col = 0;
  for (int64_t e : {2 * ColumnSumScratchElems(Ni, H_), 2 * ColumnSumScratchElems(Ri, H_),
                    ColumnSumScratchElems(Ni, 3 * H_), ColumnSumScratchElems(Ni, F_),
                    ColumnSumScratchElems(Ri, V_)})
    col = std::max(col, e);
  DGCA_RETURN_IF_ERROR(Alloc(&col_scratch_, static_cast<size_t>(std::max<int64_t>(col, 1)), "column scratch"));
  bound_ = true;
  return OkStatus();
}

template <typename T>
Status CudaBert<T>::AllocAttention(bool fused) {
  attention_ready_ = false;  // until every buffer of the new choice exists
  fused_ = fused;
  const size_t probs = static_cast<size_t>(max_batch_) * nh_ * seq_len_ * seq_len_;
  const size_t rows = static_cast<size_t>(max_batch_) * nh_ * seq_len_;
  // Free first: switching kernels should not need both sets at once.
  for (Layer& ly : layers_) {
    ly.probs = DeviceArray<T>();
    ly.lse = DeviceArray<float>();
  }
  attn_scratch_ = DeviceArray<T>();
  attn_rowdot_ = DeviceArray<float>();
  if (fused) {
    for (Layer& ly : layers_) DGCA_RETURN_IF_ERROR(Alloc(&ly.lse, rows, "lse"));
    DGCA_RETURN_IF_ERROR(Alloc(
        &attn_rowdot_, static_cast<size_t>(FusedAttentionBackwardScratchFloats(max_batch_, seq_len_, nh_)),
        "attention row sums"));
  } else {
    for (Layer& ly : layers_) DGCA_RETURN_IF_ERROR(Alloc(&ly.probs, probs, "probs"));
    const int64_t scratch =
        AttentionSharedScratchElems(max_batch_, seq_len_, H_, nh_, cfg_.attention_dropout > 0.0f);
    DGCA_RETURN_IF_ERROR(Alloc(&attn_scratch_, static_cast<size_t>(scratch), "attention scratch"));
  }
  attention_ready_ = true;
  return OkStatus();
}

template <typename T>
bool CudaBert<T>::FusedFor(bool want) const {
  return want && FusedAttentionSupported(kDType<T>, seq_len_, H_, nh_);
}

template <typename T>
Status CudaBert<T>::set_fused_attention(bool on) {
  want_fused_ = on;
  if (!bound_) return OkStatus();  // Bind decides
  const bool fused = FusedFor(on);
  if (fused == fused_ && attention_ready_) return OkStatus();
  return AllocAttention(fused);
}

template <typename T>
size_t CudaBert<T>::activation_bytes() const {
  size_t b = 0;
  auto add = [&b](const auto& a) { b += a.size() * sizeof(*a.get()); };
  for (const Layer& ly : layers_) {
    add(ly.qkv); add(ly.probs); add(ly.lse); add(ly.ctx); add(ly.r1); add(ly.mean1); add(ly.rstd1); add(ly.h1);
    add(ly.f1); add(ly.g); add(ly.r2); add(ly.mean2); add(ly.rstd2); add(ly.out);
  }
  add(emb_in_); add(emb_out_); add(emb_mean_); add(emb_rstd_);
  add(pos_ids_); add(type_ids_); add(word_ids_); add(prompt_ids_);
  add(rows_); add(sel_); add(t1_); add(t2_); add(t3_); add(tmean_); add(trstd_); add(logits_);
  add(dcur_); add(dtmp_); add(dctx_); add(dqkv_); add(dg_); add(dsel_); add(dt_); add(attn_scratch_);
  add(attn_rowdot_); add(mask_); add(col_scratch_);
  return b;
}

template <typename T>
Status CudaBert<T>::PoisonActivations() {
  auto p = [](auto& a) { return a.Poison(); };
  for (Layer& ly : layers_) {
    for (Status s : {p(ly.qkv), p(ly.probs), p(ly.lse), p(ly.ctx), p(ly.r1), p(ly.mean1), p(ly.rstd1), p(ly.h1),
                     p(ly.f1), p(ly.g), p(ly.r2), p(ly.mean2), p(ly.rstd2), p(ly.out)})
      DGCA_RETURN_IF_ERROR(s);
  }
  for (Status s : {p(emb_in_), p(emb_out_), p(emb_mean_), p(emb_rstd_), p(pos_ids_), p(type_ids_),
                   p(word_ids_), p(prompt_ids_), p(rows_), p(sel_), p(t1_), p(t2_), p(t3_), p(tmean_),
                   p(trstd_), p(logits_), p(dcur_), p(dtmp_), p(dctx_), p(dqkv_), p(dg_), p(dsel_), p(dt_),
                   p(attn_scratch_), p(attn_rowdot_), p(mask_), p(col_scratch_)})
    DGCA_RETURN_IF_ERROR(s);
  // cudaMemset may still be running; the model's stream does not wait for
  // the legacy stream.
  return CudaStatus(cudaDeviceSynchronize(), "CudaBert::PoisonActivations");
}

// ------------------------------------------------------------- Linear

template <typename T>
Status CudaBert<T>::Linear(T* out, const T* inp, int w, int b, int n, int ic, int oc, const T* residual) {
  // cpu::LinearForward: out = inp W^T + b (W [oc, ic]); a residual is the
  // GEMM's C operand with beta = 1 (C and D distinct: nothing is copied).
  const T* bias = b >= 0 ? W(b) : nullptr;
  const bool epilogue = bias != nullptr && Aligned16(bias);
  GemmArgs g;
  g.trans_a = false;
  g.trans_b = true;
  g.M = n; g.N = oc; g.K = ic;
  g.alpha = 1.0f;
  g.beta = residual != nullptr ? 1.0f : 0.0f;
  g.C_in = residual;
  g.A = inp; g.lda = ic;
  g.B = W(w); g.ldb = ic;
  g.C = out; g.ldc = oc;
  g.in_type = g.out_type = kDType<T>;
  g.bias = epilogue ? bias : nullptr;
  DGCA_RETURN_IF_ERROR(gemm_->Run(g));
  if (bias != nullptr && !epilogue) return BiasAdd<T>(stream(), out, bias, n, oc);
  return OkStatus();
}

template <typename T>
Status CudaBert<T>::LinearBack(T* dinp, bool accumulate_dinp, int w, int b, const T* dout, const T* inp,
                               int n, int ic, int oc) {
  // cpu::LinearBackward.
  if (dinp != nullptr) {  // dinp [n, ic] (= or +=) dout [n, oc] W [oc, ic]
    GemmArgs g;
    g.M = n; g.N = ic; g.K = oc;
    g.beta = accumulate_dinp ? 1.0f : 0.0f;
    g.A = dout; g.lda = oc;
    g.B = W(w); g.ldb = ic;
    g.C = dinp; g.ldc = ic;
    g.in_type = g.out_type = kDType<T>;
    DGCA_RETURN_IF_ERROR(gemm_->Run(g));
  }
  {  // dW [oc, ic] += dout^T [oc, n] inp [n, ic], written fp32 into the grad.
    GemmArgs g;
    g.trans_a = true;
    g.M = oc; g.N = ic; g.K = n;
    g.beta = 1.0f;
    g.A = dout; g.lda = oc;
    g.B = inp; g.ldb = ic;
    g.C = G(w); g.ldc = ic;
    g.in_type = kDType<T>;
    g.out_type = DType::kF32;
    DGCA_RETURN_IF_ERROR(gemm_->Run(g));
  }
  if (b >= 0) DGCA_RETURN_IF_ERROR(ColumnSumAdd<T>(stream(), G(b), dout, n, oc, col_scratch_.get()));
  return OkStatus();
}

// ------------------------------------------------------------- forward

template <typename T>
Status CudaBert<T>::EmbedForward(const int32_t* ids, const int32_t* token_types, const int32_t* prompt_slot,
                                 const T* prompt_rows, int B, int L) {
  if (params_ == nullptr) return FailedPreconditionError("CudaBert::EmbedForward before Bind");
  if (B <= 0 || B > max_batch_ || L <= 0 || L > seq_len_) {
    return InvalidArgumentError("CudaBert::EmbedForward: B=" + std::to_string(B) + " L=" + std::to_string(L) +
                                " outside 1.." + std::to_string(max_batch_) + " x 1.." + std::to_string(seq_len_));
  }
  if (prompt_rows != nullptr && prompt_slot == nullptr)
    return InvalidArgumentError("CudaBert::EmbedForward: prompt_rows given without prompt_slot");
  NvtxRange range("bert.embed.fwd");
  SetEncoderShape(B, L, prompt_rows != nullptr);
  const int N = B * L;
  // The index arrays for backward's scatter-adds and the (w + t) + p sum in
  // one kernel: a row takes its word embedding or its prompt row (the
  // vectorized ReLM scatter).
  DGCA_RETURN_IF_ERROR(BertEmbedSum<T>(stream(), emb_in_.get(), pos_ids_.get(), type_ids_.get(), word_ids_.get(),
                                       prompt_ids_.get(), ids, token_types, prompt_slot, prompt_rows, W(p_.wte),
                                       W(p_.pos), W(p_.type), B, L, H_));
  DGCA_RETURN_IF_ERROR(LayerNormForward<T>(stream(), emb_out_.get(), emb_mean_.get(), emb_rstd_.get(), emb_in_.get(),
                                           W(p_.eln_w), W(p_.eln_b), N, H_, cfg_.layer_norm_eps));
  if (drop_.hidden_on()) return DropHidden(emb_out_.get(), emb_out_.get(), nullptr, -1, kDropHidden);
  return OkStatus();
}

template <typename T>
Status CudaBert<T>::DropHidden(T* out, const T* in, const T* residual, int l, int site) {
  return DropoutRows<T>(stream(), out, in, residual, drop_.keys, l, site, drop_.hidden, B_, L_, H_);
}

template <typename T>
Status CudaBert<T>::EncoderForward(const int32_t* mask, int B, int L) {
  if (params_ == nullptr) return FailedPreconditionError("CudaBert::EncoderForward before Bind");
  if (B <= 0 || B > max_batch_ || L <= 0 || L > seq_len_) {
    return InvalidArgumentError("CudaBert::EncoderForward: B=" + std::to_string(B) + " L=" + std::to_string(L) +
                                " outside 1.." + std::to_string(max_batch_) + " x 1.." + std::to_string(seq_len_));
  }
  if (!attention_ready_)
    return FailedPreconditionError("CudaBert::EncoderForward: the attention buffers are missing (an allocation in "
                                   "Bind or set_fused_attention failed)");
  SetEncoderShape(B, L, used_prompt_);
  if (fused_) {  // the fused backward needs the mask; the caller may reuse its array
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(mask_.get(), mask, sizeof(int32_t) * B * L,
                                                    cudaMemcpyDeviceToDevice, stream()),
                                    "CudaBert: mask copy"));
    mask = mask_.get();
  }
  for (int l = 0; l < cfg_.layers; ++l)
    DGCA_RETURN_IF_ERROR(LayerForward(l, l == 0 ? emb_out_.get() : layers_[l - 1].out.get(), mask));
  return OkStatus();
}

template <typename T>
const T* CudaBert<T>::hidden() const {
  return cfg_.layers == 0 ? emb_out_.get() : layers_.back().out.get();
}

template <typename T>
Status CudaBert<T>::LayerForward(int l, const T* x, const int32_t* mask) {
  Layer& ly = layers_[l];
  NvtxRange range(ly.fwd_name.c_str());
  const int N = B_ * L_, H = H_, F = F_;
  const float eps = cfg_.layer_norm_eps;
  cudaStream_t s = stream();
  // Self-attention: one GEMM for q, k, v.
  DGCA_RETURN_IF_ERROR(Linear(ly.qkv.get(), x, ly.qkv_w, ly.qkv_b, N, H, 3 * H));
  if constexpr (!std::is_same_v<T, float>) {
    if (fused_) {
      DGCA_RETURN_IF_ERROR(
          FusedAttentionForward<T>(s, ly.ctx.get(), ly.lse.get(), ly.qkv.get(), mask, B_, L_, H, nh_, AttentionDrop(l)));
    }
  }
  if (!fused_) {
    DGCA_RETURN_IF_ERROR(AttentionForward<T>(*ctx_, gemm_, ly.ctx.get(), ly.probs.get(), ly.qkv.get(), mask, B_,
                                             L_, H, nh_, attn_scratch_.get(), AttentionDrop(l)));
  }
  // Output projection + bias + residual in one GEMM (with dropout: the
  // projection, then mask + residual in one kernel), LayerNorm (post-LN).
  if (drop_.hidden_on()) {
    DGCA_RETURN_IF_ERROR(Linear(ly.r1.get(), ly.ctx.get(), ly.ao_w, ly.ao_b, N, H, H));
    DGCA_RETURN_IF_ERROR(DropHidden(ly.r1.get(), ly.r1.get(), x, l, kDropAttnOut));
  } else {
    DGCA_RETURN_IF_ERROR(Linear(ly.r1.get(), ly.ctx.get(), ly.ao_w, ly.ao_b, N, H, H, x));
  }
  DGCA_RETURN_IF_ERROR(LayerNormForward<T>(s, ly.h1.get(), ly.mean1.get(), ly.rstd1.get(), ly.r1.get(),
                                           W(ly.ln1_w), W(ly.ln1_b), N, H, eps));
  // Feed-forward.
  DGCA_RETURN_IF_ERROR(Linear(ly.f1.get(), ly.h1.get(), ly.fc1_w, ly.fc1_b, N, H, F));
  DGCA_RETURN_IF_ERROR(GeluForward<T>(s, ly.g.get(), ly.f1.get(), int64_t(N) * F));
  if (drop_.hidden_on()) {
    DGCA_RETURN_IF_ERROR(Linear(ly.r2.get(), ly.g.get(), ly.fc2_w, ly.fc2_b, N, F, H));
    DGCA_RETURN_IF_ERROR(DropHidden(ly.r2.get(), ly.r2.get(), ly.h1.get(), l, kDropFfnOut));
  } else {
    DGCA_RETURN_IF_ERROR(Linear(ly.r2.get(), ly.g.get(), ly.fc2_w, ly.fc2_b, N, F, H, ly.h1.get()));
  }
  return LayerNormForward<T>(s, ly.out.get(), ly.mean2.get(), ly.rstd2.get(), ly.r2.get(), W(ly.ln2_w),
                             W(ly.ln2_b), N, H, eps);
}

template <typename T>
StatusOr<T*> CudaBert<T>::MlmHeadForward(const int32_t* rows, int R) {
  if (params_ == nullptr) return FailedPreconditionError("CudaBert::MlmHeadForward before Bind");
  if (R < 0 || R > max_rows_) {
    return InvalidArgumentError("CudaBert::MlmHeadForward: R=" + std::to_string(R) + " outside 0.." +
                                std::to_string(max_rows_));
  }
  R_ = R;
  if (R == 0) return logits_.get();
  NvtxRange range("bert.mlm_head.fwd");
  const int H = H_;
  cudaStream_t s = stream();
  // Keep our own copy of the rows (backward scatters into them), then gather.
  DGCA_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(rows_.get(), rows, sizeof(int32_t) * R, cudaMemcpyDeviceToDevice, s), "head rows copy"));
  DGCA_RETURN_IF_ERROR(EmbeddingForward<T>(s, sel_.get(), rows_.get(), hidden(), R, H));
  DGCA_RETURN_IF_ERROR(Linear(t1_.get(), sel_.get(), p_.hd_w, p_.hd_b, R, H, H));
  DGCA_RETURN_IF_ERROR(GeluForward<T>(s, t2_.get(), t1_.get(), int64_t(R) * H));
  DGCA_RETURN_IF_ERROR(LayerNormForward<T>(s, t3_.get(), tmean_.get(), trstd_.get(), t2_.get(), W(p_.hln_w),
                                           W(p_.hln_b), R, H, cfg_.layer_norm_eps));
  // Decoder tied to the word embeddings: logits = t3 E^T + bias.
  DGCA_RETURN_IF_ERROR(Linear(logits_.get(), t3_.get(), p_.wte, p_.hbias, R, H, V_));
  return logits_.get();
}

// ------------------------------------------------------------- backward

template <typename T>
Status CudaBert<T>::MlmHeadBackward(const T* dlogits, const T* extra_dh, int extra_rows) {
  if (params_ == nullptr) return FailedPreconditionError("CudaBert::MlmHeadBackward before Bind");
  if (extra_dh != nullptr && (extra_rows < 0 || extra_rows > R_)) {
    return InvalidArgumentError("CudaBert::MlmHeadBackward: extra_rows " + std::to_string(extra_rows) +
                                " outside 0.." + std::to_string(R_));
  }
  NvtxRange range("bert.mlm_head.bwd");
  const int R = R_, H = H_;
  const size_t N = static_cast<size_t>(B_) * L_;
  cudaStream_t s = stream();
  if (R > 0) {
    // Decoder: dE += dlogits^T t3, dbias += colsum, dt3 = dlogits E.
    DGCA_RETURN_IF_ERROR(LinearBack(dt_.get(), false, p_.wte, p_.hbias, dlogits, t3_.get(), R, H, V_));
    // LN, GELU (in place), dense.
    DGCA_RETURN_IF_ERROR(LayerNormBackward<T>(s, dsel_.get(), false, G(p_.hln_w), G(p_.hln_b), dt_.get(), t2_.get(),
                                              W(p_.hln_w), tmean_.get(), trstd_.get(), R, H, col_scratch_.get()));
    DGCA_RETURN_IF_ERROR(GeluBackward<T>(s, dsel_.get(), t1_.get(), dsel_.get(), int64_t(R) * H));
    DGCA_RETURN_IF_ERROR(LinearBack(dt_.get(), false, p_.hd_w, p_.hd_b, dsel_.get(), sel_.get(), R, H, H));
  }
  // dhidden: zero, then the gathered rows' gradient (+ extra_dh) scattered
  // in (rows are distinct).
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(dcur_.get(), 0, sizeof(T) * N * H, s), "dhidden memset"));
  if (R > 0)
    DGCA_RETURN_IF_ERROR(ScatterRowsAdd<T>(s, dcur_.get(), rows_.get(), dt_.get(), extra_dh, extra_rows, R, H));
  return OkStatus();
}

template <typename T>
Status CudaBert<T>::LayerBackward(int l, const T* x, T* dcur) {
  Layer& ly = layers_[l];
  NvtxRange range(ly.bwd_name.c_str());
  const int N = B_ * L_, H = H_, F = F_;
  cudaStream_t s = stream();
  T* dtmp = dtmp_.get();
  // out = LN2(r2): dcur -> dtmp = d r2 (= d f2 = the residual part of d h1).
  DGCA_RETURN_IF_ERROR(LayerNormBackward<T>(s, dtmp, false, G(ly.ln2_w), G(ly.ln2_b), dcur, ly.r2.get(),
                                            W(ly.ln2_w), ly.mean2.get(), ly.rstd2.get(), N, H, col_scratch_.get()));
  // r2 = drop(g W2^T + b2) + h1: the projection gets d r2 through the mask
  // (in dctx_, free until the attention), the residual d r2 itself.
  const T* dr2 = dtmp;
  if (drop_.hidden_on()) {
    DGCA_RETURN_IF_ERROR(DropHidden(dctx_.get(), dtmp, nullptr, l, kDropFfnOut));
    dr2 = dctx_.get();
  }
  DGCA_RETURN_IF_ERROR(LinearBack(dg_.get(), false, ly.fc2_w, ly.fc2_b, dr2, ly.g.get(), N, F, H));
  DGCA_RETURN_IF_ERROR(GeluBackward<T>(s, dg_.get(), ly.f1.get(), dg_.get(), int64_t(N) * F));
  // f1 = h1 W1^T + b1: d h1 = d r2 + d f1 W1 (accumulated into dtmp).
  DGCA_RETURN_IF_ERROR(LinearBack(dtmp, true, ly.fc1_w, ly.fc1_b, dg_.get(), ly.h1.get(), N, H, F));
  // h1 = LN1(r1): dtmp -> dcur = d r1 (= d attention output = residual part of d x).
  DGCA_RETURN_IF_ERROR(LayerNormBackward<T>(s, dcur, false, G(ly.ln1_w), G(ly.ln1_b), dtmp, ly.r1.get(),
                                            W(ly.ln1_w), ly.mean1.get(), ly.rstd1.get(), N, H, col_scratch_.get()));
  // r1 = drop(ctx Wo^T + bo) + x (the masked d r1 in dtmp, free again).
  const T* dr1 = dcur;
  if (drop_.hidden_on()) {
    DGCA_RETURN_IF_ERROR(DropHidden(dtmp, dcur, nullptr, l, kDropAttnOut));
    dr1 = dtmp;
  }
  DGCA_RETURN_IF_ERROR(LinearBack(dctx_.get(), false, ly.ao_w, ly.ao_b, dr1, ly.ctx.get(), N, H, H));
  if constexpr (!std::is_same_v<T, float>) {
    if (fused_) {
      DGCA_RETURN_IF_ERROR(FusedAttentionBackward<T>(s, dqkv_.get(), dctx_.get(), ly.qkv.get(), ly.ctx.get(),
                                                     ly.lse.get(), mask_.get(), B_, L_, H, nh_,
                                                     attn_rowdot_.get(), AttentionDrop(l)));
    }
  }
  if (!fused_) {
    DGCA_RETURN_IF_ERROR(AttentionBackward<T>(*ctx_, gemm_, dqkv_.get(), dctx_.get(), ly.qkv.get(),
                                              ly.probs.get(), B_, L_, H, nh_, attn_scratch_.get(),
                                              AttentionDrop(l)));
  }
  // qkv = x Wqkv^T + bqkv: d x += dqkv Wqkv.
  return LinearBack(dcur, true, ly.qkv_w, ly.qkv_b, dqkv_.get(), x, N, H, 3 * H);
}

template <typename T>
Status CudaBert<T>::EmbedBackward(float* dprompt) {
  if (params_ == nullptr) return FailedPreconditionError("CudaBert::EmbedBackward before Bind");
  NvtxRange range("bert.embed.bwd");
  const int N = B_ * L_, H = H_;
  cudaStream_t s = stream();
  T* demb = dtmp_.get();
  if (drop_.hidden_on())  // d(LN output) = d emb_out * mask
    DGCA_RETURN_IF_ERROR(DropHidden(dcur_.get(), dcur_.get(), nullptr, -1, kDropHidden));
  DGCA_RETURN_IF_ERROR(LayerNormBackward<T>(s, demb, false, G(p_.eln_w), G(p_.eln_b), dcur_.get(), emb_in_.get(),
                                            W(p_.eln_w), emb_mean_.get(), emb_rstd_.get(), N, H, col_scratch_.get()));
  DGCA_RETURN_IF_ERROR(EmbeddingBackward<T>(s, G(p_.pos), pos_ids_.get(), demb, N, H, deterministic_));
  DGCA_RETURN_IF_ERROR(EmbeddingBackward<T>(s, G(p_.type), type_ids_.get(), demb, N, H, deterministic_));
  DGCA_RETURN_IF_ERROR(EmbeddingBackward<T>(s, G(p_.wte), word_ids_.get(), demb, N, H, deterministic_));
  if (used_prompt_ && dprompt != nullptr)
    DGCA_RETURN_IF_ERROR(EmbeddingBackward<T>(s, dprompt, prompt_ids_.get(), demb, N, H, deterministic_));
  return OkStatus();
}

template class CudaBert<float>;
template class CudaBert<__nv_bfloat16>;
template class CudaBert<__half>;

}  // namespace cuda
}  // namespace dgca
