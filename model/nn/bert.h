// Bert: the BERT part of DGCA-ReLM on the CPU — embeddings (word with the
// ReLM prompt scatter, position, token type, LayerNorm), post-LN encoder
// layers with exact erf GELU, and the MLM prediction head (dense + GELU + LN,
// decoder tied to the word embeddings, decoder bias) evaluated only on a
// gathered subset of rows. Forward and backward are written out layer by
// layer (llm.c style); activations are allocated once in Bind().
//
// Parameter names are those of Hugging Face BertForMaskedLM, so HF
// checkpoints load by name; shapes as in PyTorch (nn.Linear weight [out,in]):
//   bert.embeddings.word_embeddings.weight          [V, H]
//   bert.embeddings.position_embeddings.weight      [max_position, H]
//   bert.embeddings.token_type_embeddings.weight    [type_vocab, H]
//   bert.embeddings.LayerNorm.{weight,bias}         [H]
//   bert.encoder.layer.N.attention.self.{query,key,value}.weight [H, H]
//   bert.encoder.layer.N.attention.self.{query,key,value}.bias   [H]
//   bert.encoder.layer.N.attention.output.dense.{weight [H,H], bias [H]}
//   bert.encoder.layer.N.attention.output.LayerNorm.{weight,bias} [H]
//   bert.encoder.layer.N.intermediate.dense.{weight [F,H], bias [F]}
//   bert.encoder.layer.N.output.dense.{weight [H,F], bias [H]}
//   bert.encoder.layer.N.output.LayerNorm.{weight,bias} [H]
//   cls.predictions.transform.dense.{weight [H,H], bias [H]}
//   cls.predictions.transform.LayerNorm.{weight,bias} [H]
//   cls.predictions.bias                              [V]
// The decoder weight is the word embedding matrix (tied; no tensor of its
// own, like HF's cls.predictions.decoder.weight).
//
// Declaration order (see DgcaModel): DeclareWordEmbeddings() first — the
// tied matrix's gradient is complete only at the very end of backward — then
// whatever the caller declares (the prompt encoder), then DeclareBody()
// (position, token type, embedding LN, layer 0..N-1 each as q.w k.w v.w q.b
// k.b v.b — so W_qkv is one contiguous [3H,H] block and one GEMM — then
// attention.output.dense, attention.output.LayerNorm, intermediate.dense,
// output.dense, output.LayerNorm), then DeclareMlmHead().
//
// Dropout (set_dropout, for the next forward and its backward): HF's
// places — after the embedding LayerNorm, on the attention probabilities,
// after the attention output and FFN output projections before their
// residual adds; none in the MLM head. Masks from model/core/dropout.h,
// regenerated in the backward, never stored.
//
// Thread-safety: not thread-safe; owned by one model.
#ifndef DGCA_MODEL_NN_BERT_H_
#define DGCA_MODEL_NN_BERT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/core/dropout.h"
#include "model/core/param_list.h"
#include "model/core/status.h"
#include "model/cpu/ops.h"
#include "model/nn/params.h"

namespace dgca {

// Deterministic, platform-independent N(0, std) init (splitmix64 + Box-Muller
// in double).
void InitNormal(float* x, int64_t n, float std, uint64_t seed);

class Bert {
 public:
  // max_head_rows: the most rows the MLM head is evaluated on per call.
  Bert(const ModelConfig& cfg, int max_batch, int seq_len, int max_head_rows);
  Bert(const Bert&) = delete;
  Bert& operator=(const Bert&) = delete;

  Status DeclareWordEmbeddings(ParamStore* store);
  Status DeclareBody(ParamStore* store);
  Status DeclareMlmHead(ParamStore* store);
  // After store->Finalize(): resolves pointers and allocates activations.
  Status Bind(ParamStore* store);
  // BERT init: N(0, 0.02) weights and embeddings, zero biases, LN gain 1.
  void InitParams(uint64_t seed);

  // Index of the first parameter of each stage (for GradReadyFn).
  int word_embeddings_index() const { return p_.wte; }
  int body_first_index() const { return p_.pos; }
  int layer_first_index(int l) const { return layers_[l].first; }
  int head_first_index() const { return head_first_; }

  // The dropout of the following forward and backward (keys [B] in host
  // memory, alive until the backward ends); a default DropoutSpec turns it
  // off (evaluation).
  void set_dropout(const DropoutSpec& d) { drop_ = d; }

  // Embeddings: row i of [B*L] gets prompt_rows[prompt_slot[i]] when
  // prompt_rows != nullptr and prompt_slot[i] >= 0, else the word embedding of
  // ids[i]; then + position (i mod L) + token type; then LayerNorm. Ids must
  // have been range-checked by the caller.
  void EmbedForward(const cpu::Context& ctx, const int32_t* ids, const int32_t* token_types,
                    const int32_t* prompt_slot, const float* prompt_rows, int B, int L);
  // All layers; mask [B*L] (1 real, 0 padding).
  void EncoderForward(const cpu::Context& ctx, const int32_t* mask, int B, int L);
  // Final hidden states [B*L, H] of the last forward.
  const float* hidden() const;

  // MLM head on rows[0..R) of hidden(): returns logits [R, V] (a buffer the
  // caller may overwrite with dlogits for MlmHeadBackward). gathered() is
  // the [R, H] hidden rows it used.
  float* MlmHeadForward(const cpu::Context& ctx, const int32_t* rows, int R);
  const float* gathered() const { return sel_.data(); }

  // dlogits [R, V] (usually the logits buffer) -> head parameter grads,
  // the word embedding grad (tied decoder), and dhidden [B*L, H]: zero
  // except the gathered rows, which get the head's input gradient plus
  // extra_dh (may be null) for rows 0..extra_rows-1.
  void MlmHeadBackward(const cpu::Context& ctx, const float* dlogits, const float* extra_dh,
                       int extra_rows);
  // Backward through the layers, last to first, starting from the dhidden
  // that MlmHeadBackward left; after each layer l calls on_layer(l) (may be
  // empty) when its parameter gradients are complete.
  template <typename Fn>
  void EncoderBackward(const cpu::Context& ctx, const Fn& on_layer);
  // Embedding backward: LN, position, token type, word embeddings (rows that
  // took a prompt row give their gradient to dprompt [2P, H] instead, ADDED;
  // dprompt may be null when there is no prompt encoder).
  void EmbedBackward(const cpu::Context& ctx, float* dprompt);

 private:
  struct Layer : BertLayerParams {
    int first = -1;
    // Activations ([N = B*L rows]).
    std::vector<float> qkv;    // [N, 3H]
    std::vector<float> probs;  // [B, nh, L, L]
    std::vector<float> ctx;    // [N, H] attention output before the projection
    std::vector<float> r1;     // [N, H] projection + residual (LN1 input)
    std::vector<float> mean1, rstd1;
    std::vector<float> h1;     // [N, H] LN1 output
    std::vector<float> f1;     // [N, F] intermediate pre-activation
    std::vector<float> g;      // [N, F] GELU(f1)
    std::vector<float> r2;     // [N, H] output dense + residual (LN2 input)
    std::vector<float> mean2, rstd2;
    std::vector<float> out;    // [N, H] layer output
  };
  void LayerForward(const cpu::Context& ctx, int l, const float* x, const int32_t* mask);
  // dcur: dL/d(out_l) on entry, dL/d(x_l) on return.
  void LayerBackward(const cpu::Context& ctx, int l, const float* x, float* dcur);

  float* P(int i) { return store_->value(i); }
  float* G(int i) { return store_->grad(i); }

  ModelConfig cfg_;
  int max_batch_, seq_len_, max_rows_;
  int H_, F_, V_, nh_;
  ParamStore* store_ = nullptr;

  BertParams p_;
  int head_first_ = -1;
  std::vector<Layer> layers_;

  AttentionDropout AttentionDrop(int l) const {
    return drop_.attention_on() ? AttentionDropout{drop_.keys, l, drop_.attention} : AttentionDropout{};
  }
  // out = in * hidden dropout mask / (1-p) at `site` of layer l (+ residual
  // when non-null), rows [B_*L_, H]; only called when drop_.hidden_on()
  // (as CudaBert::DropHidden).
  void DropHidden(const cpu::Context& ctx, float* out, const float* in, const float* residual, int l,
                  int site) const;

  // State of the last forward.
  DropoutSpec drop_;
  int B_ = 0, L_ = 0, R_ = 0;
  const int32_t* ids_ = nullptr;
  const int32_t* types_ = nullptr;
  const int32_t* prompt_slot_ = nullptr;
  bool used_prompt_ = false;
  std::vector<int32_t> rows_;  // gathered row indices [R]

  // Embedding activations.
  std::vector<float> emb_in_, emb_mean_, emb_rstd_, emb_out_;
  std::vector<int32_t> pos_ids_, word_ids_, prompt_ids_;
  // MLM head activations [R, *].
  std::vector<float> sel_, t1_, t2_, t3_, tmean_, trstd_, logits_;
  // Backward scratch.
  std::vector<float> dcur_, dtmp_, dctx_, dqkv_, dg_, dsel_, dt_;
};

template <typename Fn>
void Bert::EncoderBackward(const cpu::Context& ctx, const Fn& on_layer) {
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    const float* x = l == 0 ? emb_out_.data() : layers_[l - 1].out.data();
    LayerBackward(ctx, l, x, dcur_.data());
    on_layer(l);
  }
}

}  // namespace dgca

#endif  // DGCA_MODEL_NN_BERT_H_
