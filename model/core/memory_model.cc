#include "model/core/memory_model.h"

#include <algorithm>
#include <cmath>

#include "model/core/data.h"

namespace dgca {

// Activation model, per sample, elements of e bytes (e = 4 fp32, 2 half;
// LayerNorm statistics and vocabulary logits are always fp32). L = seq_len,
// H = hidden, A = heads, F = ffn, V = vocab, K = candidates,
// T = MaxCharsForSeqLen(L, P) target slots.
//
// Embeddings: sum of word+position+type (L*H) and LayerNorm output (L*H) in
//   e bytes, LN mean/rstd 2*L in fp32; the attention mask, L int32; with the
//   fused attention its backward's row sums, A*L fp32 (one set for all
//   layers).
// Each encoder layer saves for its backward:
//   layer input x                      L*H   (QKV weight gradients)
//   Q, K, V                            3*L*H
//   attention probabilities            A*L*L (softmax backward, P·V backward);
//     with the fused attention kernels (FusedAttentionShape, 16-bit) only
//     the row log-sum-exp, A*L in fp32
//   context (probs·V, heads merged)    L*H   (output projection backward)
//   attention output + residual        L*H   (LayerNorm 1 input)
//   LayerNorm 1 output                 L*H   (FFN input)
//   FFN intermediate before GELU       L*F
//   GELU output                        L*F   (second FFN GEMM backward)
//   FFN output + residual              L*H   (LayerNorm 2 input)
//   LayerNorm 1 and 2 mean/rstd        4*L   (fp32)
//   => (8*L*H + A*L*L + 2*L*F) * e + 16*L bytes (fused: A*L*L*e becomes
//      A*L*4); LayerNorm 2's output is the next layer's input x, counted there.
// Heads, on R = 2*T rows (T target slots plus at most T MFT-masked source
// positions):
//   MLM transform: dense out, GELU out, LN out  3*R*H * e, LN stats 2*R fp32
//   vocabulary logits and their gradient         2*R*V * 4
// Detector, candidate head and fusion on T slots:
//   candidate dense out, GELU out, LN out        3*T*H * e
//   candidate scores, softmax, gates, detector   (2*T*K + 4*T) * 4
// The prompt encoder works on 2P vectors per batch, not per sample: it is
// in the workspace.
//
// Workspace: 32 MiB of GEMM workspace (cuBLASLt's recommended size on
// Hopper) plus the largest per-step temporary that is not saved: one layer's
// attention scores before softmax for one sample (A*L*L*4; none with the
// fused kernels), and the prompt encoder (a few 2P x 8H buffers).
MemoryEstimate EstimateMemory(const ModelConfig& cfg, int seq_len, Precision precision,
                              bool fused_attention) {
  MemoryEstimate m;
  const double N = static_cast<double>(CountParameters(cfg));
  m.params = 4.0 * N + (precision == Precision::kFp32 ? 0.0 : 2.0 * N);
  m.grads = 4.0 * N;
  m.optimizer = 8.0 * N;

  const double e = ActivationBytes(precision);
  const double L = seq_len, H = cfg.hidden, A = cfg.heads, F = cfg.ffn, V = cfg.vocab_size;
  const double K = cfg.candidate ? cfg.candidate_top_k : 0;
  const double T = MaxCharsForSeqLen(seq_len, cfg.prompt_length);
  const double R = 2.0 * T;

  const bool fused = fused_attention && precision != Precision::kFp32 &&
                     FusedAttentionShape(seq_len, cfg.hidden, cfg.heads);
  const double attention = fused ? A * L * 4.0 : A * L * L * e;
  // Embeddings (sum and LayerNorm output, LN stats), the attention mask the
  // backward keeps (int32), and with the fused kernels their backward's
  // row sums (A*L fp32, shared by the layers).
  double act = 2.0 * L * H * e + 2.0 * L * 4.0 + 4.0 * L + (fused ? A * L * 4.0 : 0.0);
  act += cfg.layers * ((8.0 * L * H + 2.0 * L * F) * e + attention + 4.0 * L * 4.0);
  act += 3.0 * R * H * e + 2.0 * R * 4.0 + 2.0 * R * V * 4.0;
  if (cfg.candidate && K > 0) act += 3.0 * T * H * e;
  act += (2.0 * T * K + 4.0 * T) * 4.0;
  m.activations_per_sample = act;

  const double P2 = 2.0 * cfg.prompt_length;
  m.workspace = 32.0 * 1024 * 1024 + (fused ? 0.0 : A * L * L * 4.0) + 4.0 * P2 * 8.0 * H * 4.0;
  return m;
}

int ActivationBytes(Precision precision) { return precision == Precision::kFp32 ? 4 : 2; }

int MaxMicroBatch(const MemoryEstimate& estimate, double budget_bytes) {
  const double fixed = estimate.total(0);
  if (budget_bytes <= fixed || estimate.activations_per_sample <= 0) return 0;
  const double n = std::floor((budget_bytes - fixed) / estimate.activations_per_sample);
  return static_cast<int>(std::min(n, 1e9));
}

}  // namespace dgca
