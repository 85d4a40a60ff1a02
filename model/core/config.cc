#include "model/core/config.h"

#include <algorithm>
#include <cassert>

#include "model/core/param_list.h"

namespace dgca {

// Parameter list (H = hidden, F = ffn, V = vocab_size, M = max_position,
// T = type_vocab, P = prompt_length, K = candidate_top_k), in forward order:
//
// BERT (Hugging Face BertForMaskedLM names; no pooler):
//   bert.embeddings.word_embeddings.weight        [V, H]
//   bert.embeddings.position_embeddings.weight    [M, H]
//   bert.embeddings.token_type_embeddings.weight  [T, H]
//   bert.embeddings.LayerNorm.{weight,bias}       [H], [H]
//   for l in 0..layers-1, prefix bert.encoder.layer.l.:
//     attention.self.{query,key,value}.weight     [H, H] each
//     attention.self.{query,key,value}.bias       [H] each
//     attention.output.dense.weight               [H, H]
//     attention.output.dense.bias                 [H]
//     attention.output.LayerNorm.{weight,bias}    [H], [H]
//     intermediate.dense.weight                   [F, H]
//     intermediate.dense.bias                     [F]
//     output.dense.weight                         [H, F]
//     output.dense.bias                           [H]
//     output.LayerNorm.{weight,bias}              [H], [H]
//   cls.predictions.transform.dense.weight        [H, H]
//   cls.predictions.transform.dense.bias          [H]
//   cls.predictions.transform.LayerNorm.{weight,bias} [H], [H]
//   cls.predictions.bias                          [V]
//   (cls.predictions.decoder.weight is tied to word_embeddings and its bias
//    is cls.predictions.bias: neither is counted again.)
//
// Prompt encoder (only when P > 0 and the encoder is not none):
//   prompt.embedding.weight                       [2P, H]    (lstm, mlp)
//   lstm (PyTorch nn.LSTM(H, H, num_layers=2, bidirectional=True), gates
//   i,f,g,o stacked, so 4H rows), for d in {"", "_reverse"}:
//     prompt.lstm.weight_ih_l0{d}                 [4H, H]
//     prompt.lstm.weight_hh_l0{d}                 [4H, H]
//     prompt.lstm.bias_ih_l0{d}                   [4H]
//     prompt.lstm.bias_hh_l0{d}                   [4H]
//     prompt.lstm.weight_ih_l1{d}                 [4H, 2H]   (input: both directions)
//     prompt.lstm.weight_hh_l1{d}                 [4H, H]
//     prompt.lstm.bias_ih_l1{d}                   [4H]
//     prompt.lstm.bias_hh_l1{d}                   [4H]
//   then prompt.mlp.0.{weight [H, 2H], bias [H]}, ReLU,
//        prompt.mlp.2.{weight [H, H],  bias [H]}
//   mlp: prompt.mlp.0.{weight [H, H], bias [H]}, ReLU,
//        prompt.mlp.2.{weight [H, H], bias [H]}
//   none: nothing (the prompt slots keep the word embeddings of [CLS] and
//   [SEP], model/nn/prompt_encoder.h).
//
// Detector (cfg.detector):      detector.weight [H], detector.bias [1]
// Candidate head (cfg.candidate):
//   candidate.dense.weight [H, H], candidate.dense.bias [H],
//   candidate.LayerNorm.weight [H], candidate.LayerNorm.bias [H]
// Gated fusion (fusion == kGated, candidate head on):
//   fusion.gate.weight [H] (w_g), fusion.gate.det_scale [1] (a; detector
//   on only), fusion.gate.bias [1] (b_g)
//
// Totals for bert-base, V=21128, M=512, T=2, P=3, lstm, all heads, K=8:
//   BERT      102,290,312  (= HF BertForMaskedLM for bert-base-chinese:
//             embeddings 16,622,592 + 12 x 7,087,872 + MLM head 613,256)
//   prompt     25,393,152  (embedding 4,608; LSTM layer 0 9,449,472,
//             layer 1 14,168,064; mlp.0 1,180,416; mlp.2 590,592)
//   detector 769, candidate 592,128, gate 770
//   total     128,277,131  (checked in config_test.cc)

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* ValidPresetNames() { return "tiny, small, bert-base"; }

StatusOr<ModelConfig> ApplyPreset(const std::string& preset, ModelConfig base) {
  if (preset == "tiny") {
    base.layers = 2;
    base.hidden = 128;
    base.heads = 2;
    base.ffn = 512;
  } else if (preset == "small") {
    base.layers = 4;
    base.hidden = 256;
    base.heads = 4;
    base.ffn = 1024;
  } else if (preset == "bert-base") {
    base.layers = 12;
    base.hidden = 768;
    base.heads = 12;
    base.ffn = 3072;
  } else {
    return InvalidArgumentError("unknown model preset '" + preset + "' (valid: " +
                                ValidPresetNames() + ")");
  }
  return base;
}

std::vector<ParamSpec> ListParameters(const ModelConfig& cfg) {
  // The lists of model/core/param_list.h, which the modules declare from:
  // BERT's, then the prompt encoder's, then the heads'.
  std::vector<ParamSpec> p;
  auto add = [&p](const std::string& name, std::vector<int64_t> shape, bool /*decay*/, int* /*index*/,
                  bool /*follows_previous*/ = false) {
    p.push_back(ParamSpec{name, std::move(shape)});
    return OkStatus();
  };
  BertParams bert;
  std::vector<BertLayerParams> layers(static_cast<size_t>(std::max(0, cfg.layers)));
  Status s = bert.ForEachWordEmbedding(cfg, add);
  if (s.ok()) s = bert.ForEachBody(cfg, &layers, add);
  if (s.ok()) s = bert.ForEachMlmHead(cfg, add);
  PromptParams prompt;
  if (s.ok() && cfg.prompt_length > 0)
    s = prompt.ForEach(cfg.prompt_encoder, 2 * int64_t(cfg.prompt_length), cfg.hidden, add);
  HeadParams heads;
  if (s.ok())
    s = heads.ForEach(cfg.hidden, cfg.detector, cfg.candidate, cfg.fusion == FusionKind::kGated && cfg.candidate, add);
  assert(s.ok() && "add never fails");
  return p;
}

bool FusedAttentionShape(int seq_len, int hidden, int heads) {
  if (heads <= 0 || hidden % heads != 0 || seq_len < 1 || seq_len > 512) return false;
  const int d = hidden / heads;
  return d == 16 || d == 32 || d == 64;
}

int64_t CountParameters(const ModelConfig& cfg) {
  int64_t n = 0;
  for (const ParamSpec& p : ListParameters(cfg)) n += p.numel();
  return n;
}

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kFp16: return "fp16";
    case Precision::kBf16: return "bf16";
  }
  return "?";
}

StatusOr<Precision> ParsePrecision(const std::string& s, const std::string& what) {
  if (s == "fp32" || s == "float32" || s == "float") return Precision::kFp32;
  if (s == "fp16" || s == "float16" || s == "half") return Precision::kFp16;
  if (s == "bf16" || s == "bfloat16") return Precision::kBf16;
  return InvalidArgumentError(what + ": '" + s + "' is not one of fp32, bf16, fp16");
}

const char* AttentionKernelsName(AttentionKernels a) {
  switch (a) {
    case AttentionKernels::kAuto: return "auto";
    case AttentionKernels::kFused: return "fused";
    case AttentionKernels::kGemm: return "gemm";
  }
  return "?";
}

StatusOr<AttentionKernels> ParseAttentionKernels(const std::string& s, const std::string& what) {
  for (AttentionKernels a : {AttentionKernels::kAuto, AttentionKernels::kFused, AttentionKernels::kGemm})
    if (s == AttentionKernelsName(a)) return a;
  return InvalidArgumentError(what + ": '" + s + "' is not one of auto, fused, gemm");
}

}  // namespace dgca
