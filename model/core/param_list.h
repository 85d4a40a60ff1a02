// The DGCA-ReLM model's parameters: one list of names, shapes and weight
// decay, walked by everything that needs them — the CPU modules declaring
// and binding them (model/nn: Bert, PromptEncoder, DgcaHeads), the CUDA
// modules finding them (model/cuda), and ListParameters / CountParameters
// (model/core/config.h), which the planner and the memory model count.
//
// Each struct holds the ParamStore indices of its module's parameters
// (-1: not declared / that part is off). Each ForEach calls
// fn(name, shape, weight_decay, &index) for every parameter in declaration
// order, with a fifth argument true (follows_previous: start where the
// previous tensor ends) for the key and value tensors that must follow the
// query's, and returns the first error fn returns; model/nn/params.h has the
// callbacks that declare (ParamDeclarer) and find (ParamFinder) them.
//
// Thread-safety: plain structs.
#ifndef DGCA_MODEL_CORE_PARAM_LIST_H_
#define DGCA_MODEL_CORE_PARAM_LIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/core/status.h"

namespace dgca {

// ParamStore indices of one encoder layer's parameters. q, k, v weights
// and then their biases are declared adjacent, so the fused QKV GEMM reads
// one [3H, H] weight (at qkv_w) and one [3H] bias (at qkv_b).
struct BertLayerParams {
  int qkv_w = -1, k_w = -1, v_w = -1, qkv_b = -1, k_b = -1, v_b = -1;
  int ao_w = -1, ao_b = -1, ln1_w = -1, ln1_b = -1;
  int fc1_w = -1, fc1_b = -1, fc2_w = -1, fc2_b = -1, ln2_w = -1, ln2_b = -1;
};

// Where BERT's parameters sit, and the list of them (HF BertForMaskedLM
// names and shapes; weight decay on the matrices and embeddings) in the
// three parts the model declares around the prompt encoder's: the word
// embeddings, the body (the other embeddings and the layers), the MLM head.
struct BertParams {
  int wte = -1, pos = -1, type = -1, eln_w = -1, eln_b = -1;
  int hd_w = -1, hd_b = -1, hln_w = -1, hln_b = -1, hbias = -1;

  template <typename Fn>
  Status ForEachWordEmbedding(const ModelConfig& c, Fn fn) {
    return fn("bert.embeddings.word_embeddings.weight", Shape{c.vocab_size, c.hidden}, true, &wte);
  }
  // layers: c.layers entries (BertLayerParams or derived from it).
  template <typename Layer, typename Fn>
  Status ForEachBody(const ModelConfig& c, std::vector<Layer>* layers, Fn fn) {
    const int64_t H = c.hidden, F = c.ffn;
    DGCA_RETURN_IF_ERROR(fn("bert.embeddings.position_embeddings.weight", Shape{c.max_position, H}, true, &pos));
    DGCA_RETURN_IF_ERROR(fn("bert.embeddings.token_type_embeddings.weight", Shape{c.type_vocab, H}, true, &type));
    DGCA_RETURN_IF_ERROR(fn("bert.embeddings.LayerNorm.weight", Shape{H}, false, &eln_w));
    DGCA_RETURN_IF_ERROR(fn("bert.embeddings.LayerNorm.bias", Shape{H}, false, &eln_b));
    for (int l = 0; l < c.layers; ++l) {
      BertLayerParams& ly = (*layers)[l];
      const std::string p = "bert.encoder.layer." + std::to_string(l) + ".";
      DGCA_RETURN_IF_ERROR(fn(p + "attention.self.query.weight", Shape{H, H}, true, &ly.qkv_w));
      DGCA_RETURN_IF_ERROR(fn(p + "attention.self.key.weight", Shape{H, H}, true, &ly.k_w, kFollows));
      DGCA_RETURN_IF_ERROR(fn(p + "attention.self.value.weight", Shape{H, H}, true, &ly.v_w, kFollows));
      DGCA_RETURN_IF_ERROR(fn(p + "attention.self.query.bias", Shape{H}, false, &ly.qkv_b));
      DGCA_RETURN_IF_ERROR(fn(p + "attention.self.key.bias", Shape{H}, false, &ly.k_b, kFollows));
      DGCA_RETURN_IF_ERROR(fn(p + "attention.self.value.bias", Shape{H}, false, &ly.v_b, kFollows));
      DGCA_RETURN_IF_ERROR(fn(p + "attention.output.dense.weight", Shape{H, H}, true, &ly.ao_w));
      DGCA_RETURN_IF_ERROR(fn(p + "attention.output.dense.bias", Shape{H}, false, &ly.ao_b));
      DGCA_RETURN_IF_ERROR(fn(p + "attention.output.LayerNorm.weight", Shape{H}, false, &ly.ln1_w));
      DGCA_RETURN_IF_ERROR(fn(p + "attention.output.LayerNorm.bias", Shape{H}, false, &ly.ln1_b));
      DGCA_RETURN_IF_ERROR(fn(p + "intermediate.dense.weight", Shape{F, H}, true, &ly.fc1_w));
      DGCA_RETURN_IF_ERROR(fn(p + "intermediate.dense.bias", Shape{F}, false, &ly.fc1_b));
      DGCA_RETURN_IF_ERROR(fn(p + "output.dense.weight", Shape{H, F}, true, &ly.fc2_w));
      DGCA_RETURN_IF_ERROR(fn(p + "output.dense.bias", Shape{H}, false, &ly.fc2_b));
      DGCA_RETURN_IF_ERROR(fn(p + "output.LayerNorm.weight", Shape{H}, false, &ly.ln2_w));
      DGCA_RETURN_IF_ERROR(fn(p + "output.LayerNorm.bias", Shape{H}, false, &ly.ln2_b));
    }
    return OkStatus();
  }
  template <typename Fn>
  Status ForEachMlmHead(const ModelConfig& c, Fn fn) {
    const int64_t H = c.hidden;
    DGCA_RETURN_IF_ERROR(fn("cls.predictions.transform.dense.weight", Shape{H, H}, true, &hd_w));
    DGCA_RETURN_IF_ERROR(fn("cls.predictions.transform.dense.bias", Shape{H}, false, &hd_b));
    DGCA_RETURN_IF_ERROR(fn("cls.predictions.transform.LayerNorm.weight", Shape{H}, false, &hln_w));
    DGCA_RETURN_IF_ERROR(fn("cls.predictions.transform.LayerNorm.bias", Shape{H}, false, &hln_b));
    return fn("cls.predictions.bias", Shape{c.vocab_size}, false, &hbias);
  }

 private:
  using Shape = std::vector<int64_t>;
  static constexpr bool kFollows = true;  // fn's follows_previous
};

// ParamStore indices of one LSTM direction's parameters.
struct LstmParams {
  int w_ih = -1, w_hh = -1, b_ih = -1, b_hh = -1;
};

// Where the prompt encoder's parameters sit (-1: absent), and the list of
// them (model/nn/prompt_encoder.h's table).
struct PromptParams {
  static constexpr const char* kDirSuffix[4] = {"_l0", "_l0_reverse", "_l1", "_l1_reverse"};
  int emb = -1;
  LstmParams lstm[4];  // l0, l0_reverse, l1, l1_reverse
  int mlp0_w = -1, mlp0_b = -1, mlp2_w = -1, mlp2_b = -1;

  // fn(name, shape, weight_decay, &index) for each parameter of a `kind`
  // encoder with S rows of width H, in declaration order (none: nothing);
  // returns the first error fn returns.
  template <typename Fn>
  Status ForEach(PromptEncoderKind kind, int64_t S, int64_t H, Fn fn) {
    if (kind == PromptEncoderKind::kNone) return OkStatus();
    DGCA_RETURN_IF_ERROR(fn("prompt.embedding.weight", std::vector<int64_t>{S, H}, true, &emb));
    int64_t in0 = H;
    if (kind == PromptEncoderKind::kLstm) {
      for (int d = 0; d < 4; ++d) {
        const int64_t in = d < 2 ? H : 2 * H;
        const std::string s = kDirSuffix[d];
        LstmParams& L = lstm[d];
        DGCA_RETURN_IF_ERROR(fn("prompt.lstm.weight_ih" + s, std::vector<int64_t>{4 * H, in}, true, &L.w_ih));
        DGCA_RETURN_IF_ERROR(fn("prompt.lstm.weight_hh" + s, std::vector<int64_t>{4 * H, H}, true, &L.w_hh));
        DGCA_RETURN_IF_ERROR(fn("prompt.lstm.bias_ih" + s, std::vector<int64_t>{4 * H}, false, &L.b_ih));
        DGCA_RETURN_IF_ERROR(fn("prompt.lstm.bias_hh" + s, std::vector<int64_t>{4 * H}, false, &L.b_hh));
      }
      in0 = 2 * H;
    }
    DGCA_RETURN_IF_ERROR(fn("prompt.mlp.0.weight", std::vector<int64_t>{H, in0}, true, &mlp0_w));
    DGCA_RETURN_IF_ERROR(fn("prompt.mlp.0.bias", std::vector<int64_t>{H}, false, &mlp0_b));
    DGCA_RETURN_IF_ERROR(fn("prompt.mlp.2.weight", std::vector<int64_t>{H, H}, true, &mlp2_w));
    DGCA_RETURN_IF_ERROR(fn("prompt.mlp.2.bias", std::vector<int64_t>{H}, false, &mlp2_b));
    return OkStatus();
  }
};

// Where the DGCA heads' parameters sit (-1: that part is off), and the list
// of them (model/nn/heads.h's table).
struct HeadParams {
  int det_w = -1, det_b = -1;
  int cd_w = -1, cd_b = -1, ln_w = -1, ln_b = -1;
  int g_w = -1, g_a = -1, g_b = -1;

  // fn(name, shape, weight_decay, &index) for each parameter of the enabled
  // parts, in declaration order; returns the first error fn returns.
  template <typename Fn>
  Status ForEach(int64_t H, bool detector, bool candidate, bool gated, Fn fn) {
    if (detector) {
      DGCA_RETURN_IF_ERROR(fn("detector.weight", std::vector<int64_t>{H}, true, &det_w));
      DGCA_RETURN_IF_ERROR(fn("detector.bias", std::vector<int64_t>{1}, false, &det_b));
    }
    if (candidate) {
      DGCA_RETURN_IF_ERROR(fn("candidate.dense.weight", std::vector<int64_t>{H, H}, true, &cd_w));
      DGCA_RETURN_IF_ERROR(fn("candidate.dense.bias", std::vector<int64_t>{H}, false, &cd_b));
      DGCA_RETURN_IF_ERROR(fn("candidate.LayerNorm.weight", std::vector<int64_t>{H}, false, &ln_w));
      DGCA_RETURN_IF_ERROR(fn("candidate.LayerNorm.bias", std::vector<int64_t>{H}, false, &ln_b));
    }
    if (gated) {
      DGCA_RETURN_IF_ERROR(fn("fusion.gate.weight", std::vector<int64_t>{H}, true, &g_w));
      if (detector) DGCA_RETURN_IF_ERROR(fn("fusion.gate.det_scale", std::vector<int64_t>{1}, true, &g_a));
      DGCA_RETURN_IF_ERROR(fn("fusion.gate.bias", std::vector<int64_t>{1}, false, &g_b));
    }
    return OkStatus();
  }
};

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_PARAM_LIST_H_
