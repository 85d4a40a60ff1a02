// CudaBert<T>: the GPU mirror of dgca::Bert (model/nn/bert.h) — embeddings
// with the ReLM prompt scatter, post-LN encoder layers with exact erf GELU,
// the MLM head (dense + GELU + LN, decoder tied to the word embeddings,
// decoder bias) on a gathered subset of rows — with the same math, the same
// order of operations and the same semantics, written out layer by layer
// (llm.c style) on device pointers.
//
// Parameters live in a DeviceParams (model/cuda/device_params.h) laid out
// like the CPU model's ParamStore. CudaBert declares nothing: Bind() looks
// the tensors up BY NAME in that layout (the names dgca::Bert declares: HF
// BertForMaskedLM's), checks their shapes and that q/k/v are contiguous
// (one [3H,H] GEMM), and reads weights through DeviceParams::weight<T>():
// the fp32 master for T = float, the 16-bit copy for T = bf16 or fp16. Gradients are
// ADDED (fp32) into DeviceParams::grad(i); the caller zeroes them.
//
// Precision (T = float, __nv_bfloat16 or __half):
//   - activations and the residual stream in T; LayerNorm mean/rstd fp32;
//   - every matmul through GemmRunner (fp32 accumulation; for T = float the
//     GEMMs are true fp32, CUBLAS_COMPUTE_32F, no TF32, so the fp32 model
//     matches the CPU reference within 1e-4 relative);
//   - weight gradients written by the GEMM directly as fp32 with beta = 1;
//     bias/LayerNorm/embedding gradients fp32 (kernels.h).
//
// Streams and memory: everything is enqueued on ctx->stream(); forward and
// backward never synchronize with the host and never allocate (all
// activations and scratch are allocated once in Bind(); set_fused_attention
// reallocates the attention buffers, between steps). Methods return the
// launch status; asynchronous kernel faults surface at the next
// CudaContext::Synchronize().
//
// Index inputs (ids, token types, prompt slots, mask, head rows) are device
// int32 arrays that the caller has range-checked (as for dgca::Bert). Token
// types, the gathered rows and (for the fused attention's backward) the mask
// are copied into CudaBert's own buffers, so the
// caller's arrays may be reused once the forward has been enqueued and the
// stream has consumed them.
//
// NVTX: one range per embedding, per encoder layer (forward and backward)
// and per MLM head call, when nvtx3 headers are available.
//
// Status: run by ctest on the CUDA emulator (model/cuda_emu) and on an H200 (docs/benchmarks.md). Checked against dgca::Bert by
// model/cuda_check/bert_check.{h,cc} (dgca-model-check) on the next GPU session.
//
// Thread-safety: not thread-safe; one CudaBert per model, used on one
// context's stream by one thread.
#ifndef DGCA_MODEL_CUDA_CUDA_BERT_H_
#define DGCA_MODEL_CUDA_CUDA_BERT_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "model/core/config.h"
#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/device_params.h"
#include "model/cuda/gemm.h"
#include "model/nn/bert.h"
#include "model/nn/params.h"

namespace dgca {
namespace cuda {

template <typename T>
class CudaBert {
 public:
  // max_head_rows: the most rows the MLM head is evaluated on per call.
  // Same arguments as dgca::Bert's constructor.
  CudaBert(const ModelConfig& cfg, int max_batch, int seq_len, int max_head_rows);
  CudaBert(const CudaBert&) = delete;
  CudaBert& operator=(const CudaBert&) = delete;

  // Resolves the parameter indices by name in `layout` (a finalized
  // ParamStore declared by dgca::Bert's Declare*; only its layout is read),
  // checks shapes against the config, and allocates every activation
  // buffer. params (its layout must have layout's total size; a 16-bit T
  // needs params->copy_type() == kDType<T>), ctx and gemm are not owned and must outlive
  // this object. NOT_FOUND for a missing tensor, INVALID_ARGUMENT for a
  // shape mismatch or a bad config, FAILED_PRECONDITION for a missing bf16
  // copy, INTERNAL for CUDA allocation failures.
  Status Bind(const ParamStore& layout, DeviceParams* params, const CudaContext* ctx,
              GemmRunner* gemm);

  // As dgca::Bert (for GradReadyFn): index of the first parameter of each
  // stage. Valid after Bind().
  int word_embeddings_index() const { return p_.wte; }
  int body_first_index() const { return p_.pos; }
  int layer_first_index(int l) const { return layers_[l].first; }
  int head_first_index() const { return head_first_; }

  // Embedding backward reductions: deterministic (default) = each column
  // sums the rows in order, bitwise the CPU's order; false = atomicAdd
  // (faster for many rows, order-dependent rounding).
  void set_deterministic(bool d) { deterministic_ = d; }

  // Attention kernels. For T = bf16/fp16 the fused ones
  // (flash_attention.h: no [B,nh,L,L] tensor; each layer keeps a
  // [B,nh,L] fp32 log-sum-exp instead of its probabilities) are the default
  // wherever FusedAttentionSupported(T, seq_len, H, heads); off, or for fp32,
  // the GEMM version (attention.h). Before Bind it only records the wish;
  // after Bind it reallocates the per-layer buffers the choice needs, so
  // call it between steps (a backward uses the kernel its forward used).
  // An allocation's error (RESOURCE_EXHAUSTED when out of memory); forwards
  // then fail with FAILED_PRECONDITION until a later call succeeds.
  Status set_fused_attention(bool on);
  // Whether the fused kernels run (after a successful Bind).
  bool fused_attention() const { return fused_ && attention_ready_; }

  // Dropout of the following forward and its backward (dgca::Bert's
  // places and masks; d.keys [B] in DEVICE memory, read when the kernels
  // run, so a CUDA graph captured with these settings replays with whatever
  // keys the pointer holds then). A default DropoutSpec (evaluation) turns
  // it off. Attention dropout with the GEMM attention needs the scratch
  // Bind sized for cfg.attention_dropout > 0.
  void set_dropout(const DropoutSpec& d) { drop_ = d; }

  // Row i of [B*L] gets prompt_rows[prompt_slot[i]] when prompt_rows is
  // non-null and prompt_slot[i] >= 0, else the word embedding of ids[i];
  // then + token type, + position (i mod L) (HF's order of the sums); then
  // LayerNorm. prompt_rows [2P, H] in T (the prompt encoder's output);
  // prompt_slot may be null when prompt_rows is. INVALID_ARGUMENT when B or
  // L exceed the constructor's max_batch / seq_len (or L > 512).
  Status EmbedForward(const int32_t* ids, const int32_t* token_types, const int32_t* prompt_slot,
                      const T* prompt_rows, int B, int L);
  // All layers; mask [B*L] (1 real, 0 padding).
  Status EncoderForward(const int32_t* mask, int B, int L);
  // Final hidden states [B*L, H] of the last forward.
  const T* hidden() const;

  // MLM head on rows[0..R) of hidden() (device int32, distinct rows):
  // returns the logits buffer [R, V] (which the caller may overwrite with
  // dlogits for MlmHeadBackward). INVALID_ARGUMENT when R is outside
  // 0..max_head_rows.
  StatusOr<T*> MlmHeadForward(const int32_t* rows, int R);
  T* logits() const { return logits_.get(); }
  // The [R, H] hidden rows the head used.
  const T* gathered() const { return sel_.get(); }

  // dlogits [R, V] (usually the logits buffer) -> head parameter grads, the
  // word embedding grad (tied decoder: dE += dlogits^T t3, dbias += column
  // sums) and dhidden [B*L, H]: zero except the gathered rows, which get
  // the head's input gradient plus extra_dh [extra_rows, H] (T; may be null)
  // for rows 0..extra_rows-1. (extra_rows <= R.)
  Status MlmHeadBackward(const T* dlogits, const T* extra_dh, int extra_rows);
  // dL/d hidden after MlmHeadBackward (a caller with more gradient for the
  // hidden states may add to it before EncoderBackward); [B*L, H].
  T* dhidden() const { return dcur_.get(); }

  // Backward through the layers, last to first, from dhidden(); after each
  // layer l calls on_layer(l) (may return void or Status; a non-OK Status
  // stops the backward and is returned) once the layer's gradient GEMMs and
  // kernels are ENQUEUED (not finished: record an event on ctx->stream() to
  // wait for them).
  template <typename Fn>
  Status EncoderBackward(const Fn& on_layer);
  // Embedding backward: LN, position, token type, word embeddings (rows
  // that took a prompt row give their gradient to dprompt [2P, H] instead,
  // ADDED, fp32; dprompt may be null when there is no prompt encoder).
  Status EmbedBackward(float* dprompt);

  // The host-side state the embedding and encoder forward leave for the
  // backward (batch, length, prompt use), set without enqueuing anything:
  // EmbedForward and EncoderForward set it through this, and a caller that
  // replays their work from a CUDA graph (model/cuda/graph_cache.h) calls it
  // instead of them.
  void SetEncoderShape(int B, int L, bool used_prompt) {
    B_ = B;
    L_ = L;
    used_prompt_ = used_prompt;
    forward_fused_ = fused_;
  }

  // Test hook: fills every activation and scratch buffer with NaN
  // (DeviceArray::Poison) so a kernel that skips an element, or reads a
  // buffer before it is written, shows up. Synchronous.
  Status PoisonActivations();
  // Bytes of activations and scratch allocated by Bind() /
  // set_fused_attention().
  size_t activation_bytes() const;

 private:
  struct Layer : BertLayerParams {
    int first = -1;
    std::string fwd_name, bwd_name;  // NVTX range names
    // Activations (N = B*L rows), as dgca::Bert::Layer.
    DeviceArray<T> qkv;    // [N, 3H]
    DeviceArray<T> probs;    // [B, nh, L, L] (GEMM attention)
    DeviceArray<float> lse;  // [B, nh, L] (fused attention)
    DeviceArray<T> ctx;    // [N, H]
    DeviceArray<T> r1;     // [N, H] projection + bias + residual (LN1 input)
    DeviceArray<float> mean1, rstd1;
    DeviceArray<T> h1;     // [N, H]
    DeviceArray<T> f1;     // [N, F] intermediate pre-activation
    DeviceArray<T> g;      // [N, F] GELU(f1)
    DeviceArray<T> r2;     // [N, H] output dense + bias + residual (LN2 input)
    DeviceArray<float> mean2, rstd2;
    DeviceArray<T> out;    // [N, H]
  };

  // Frees the attention buffers and allocates what `fused` (the kernels to
  // run from now on) needs; attention_ready_ says whether that succeeded.
  Status AllocAttention(bool fused);
  // Whether the fused kernels run when `want`ed: they take this T and shape.
  bool FusedFor(bool want) const;
  Status LayerForward(int l, const T* x, const int32_t* mask);
  // dcur: dL/d(out_l) on entry, dL/d(x_l) on return.
  Status LayerBackward(int l, const T* x, T* dcur);
  // out[n,oc] = inp[n,ic] W[oc,ic]^T + b (+ residual[n,oc] when not null:
  // the GEMM's beta term, no copy).
  Status Linear(T* out, const T* inp, int w, int b, int n, int ic, int oc, const T* residual = nullptr);
  // dinp (= or += when accumulate_dinp) = dout W; dW += dout^T inp (fp32);
  // db += column sums of dout. dinp may be null.
  Status LinearBack(T* dinp, bool accumulate_dinp, int w, int b, const T* dout, const T* inp,
                    int n, int ic, int oc);
  cudaStream_t stream() const { return ctx_->stream(); }
  AttentionDropout AttentionDrop(int l) const {
    return drop_.attention_on() ? AttentionDropout{drop_.keys, l, drop_.attention} : AttentionDropout{};
  }
  // out = in * hidden dropout mask of (layer l, site) / (1-p) (+ residual);
  // only called when drop_.hidden_on().
  Status DropHidden(T* out, const T* in, const T* residual, int l, int site);

  const T* W(int i) const { return params_->weight<T>(i); }
  float* G(int i) const { return params_->grad(i); }

  ModelConfig cfg_;
  int max_batch_, seq_len_, max_rows_;
  int H_, F_, V_, nh_;
  DeviceParams* params_ = nullptr;
  const CudaContext* ctx_ = nullptr;
  GemmRunner* gemm_ = nullptr;
  bool deterministic_ = true;
  bool want_fused_ = true;  // set_fused_attention's wish
  bool fused_ = false;      // what runs: the wish where supported
  bool attention_ready_ = false;  // its buffers are allocated
  bool forward_fused_ = false;    // the kernels the last forward ran
  bool bound_ = false;            // Bind succeeded

  BertParams p_;
  int head_first_ = -1;
  std::vector<Layer> layers_;

  // State of the last forward (host side).
  DropoutSpec drop_;
  int B_ = 0, L_ = 0, R_ = 0;
  bool used_prompt_ = false;

  // Embedding activations and index arrays ([N]; -1 = "not from this table").
  DeviceArray<T> emb_in_, emb_out_;
  DeviceArray<float> emb_mean_, emb_rstd_;
  DeviceArray<int32_t> pos_ids_, type_ids_, word_ids_, prompt_ids_;
  // MLM head [R, *].
  DeviceArray<int32_t> rows_;
  DeviceArray<T> sel_, t1_, t2_, t3_, logits_;
  DeviceArray<float> tmean_, trstd_;
  // Backward scratch.
  DeviceArray<T> dcur_, dtmp_, dctx_, dqkv_, dg_, dsel_, dt_;
  // Attention scratch (forward and backward share it): the GEMM version's,
  // or the fused backward's row sums (attn_rowdot_).
  DeviceArray<T> attn_scratch_;
  DeviceArray<float> attn_rowdot_;
  // The forward's mask [N], kept for the fused backward (the caller's array
  // may be reused once the forward is enqueued).
  DeviceArray<int32_t> mask_;
  // Column reductions' chunk sums (kernels.h ColumnSumScratchElems).
  DeviceArray<float> col_scratch_;
};

// NVTX push/pop (no-ops without nvtx3); defined in cuda_bert.cc.
void NvtxPush(const char* name);
void NvtxPop();

template <typename T>
template <typename Fn>
Status CudaBert<T>::EncoderBackward(const Fn& on_layer) {
  if (!attention_ready_ || forward_fused_ != fused_) {
    return FailedPreconditionError(
        "CudaBert::EncoderBackward: the attention kernels changed since the forward (set_fused_attention "
        "between a forward and its backward) or their buffers are missing");
  }
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    const T* x = l == 0 ? emb_out_.get() : layers_[l - 1].out.get();
    DGCA_RETURN_IF_ERROR(LayerBackward(l, x, dcur_.get()));
    if constexpr (std::is_same_v<decltype(on_layer(l)), Status>) {
      DGCA_RETURN_IF_ERROR(on_layer(l));
    } else {
      on_layer(l);
    }
  }
  return OkStatus();
}

extern template class CudaBert<float>;
extern template class CudaBert<__nv_bfloat16>;
extern template class CudaBert<__half>;

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CUDA_BERT_H_
