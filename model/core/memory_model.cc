#include "model/core/memory_model.h"

#include <algorithm>
#include <cmath>

#include "model/core/data.h"

namespace dgca {

// Activation model, per sample: what the trainer allocates for one sample
// of seq_len (the CUDA model's buffers, model/cuda/cuda_bert.h and
// cuda_model.h; the CPU model's are the same or smaller), elements of e
// bytes (e = 4 fp32, 2 bf16/fp16; LayerNorm statistics, ids and per-slot
// head values 4). L = seq_len, H = hidden, A = heads, F = ffn, V = vocab,
// K = candidates, T = MaxCharsForSeqLen(L, P) target slots, R = 2T head
// rows (target slots plus at most T MFT-masked source positions).
//
// Inputs: ids, mask, token types, prompt slots (4L), head row ids and
//   targets (2R), slot source ids (T), candidates (TK): int32.
// Embeddings: sum of word+position+type and LayerNorm output (2LH e), LN
//   stats (2L fp32), the four index arrays and the mask the backward keeps
//   (5L int32).
// Each encoder layer saves for its backward:
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
//   LayerNorm 2 output = next input    L*H
//   LayerNorm 1 and 2 mean/rstd        4*L   (fp32)
//   => (8*L*H + A*L*L + 2*L*F) * e + 16*L bytes (fused: A*L*L*e becomes
//      A*L*4).
// Backward scratch, one set for all layers: dhidden, its temporary and
//   dcontext (3LH), dQKV (3LH), dGELU (LF), in e; the attention's: fused,
//   the row sums (A*L fp32); GEMM, split heads and dprobs
//   (max(4LH, 7LH + A*L*L) e), plus A*L*L e for the masked probabilities
//   when attention dropout is on.
// MLM head on R rows: gathered rows, dense, GELU and LN outputs, their two
//   gradients and the heads' dhidden (7RH e), LN stats and row losses (3R
//   fp32), vocabulary logits with their gradient written in place (RV e).
// Candidate head on T slots: pre-activation, normalised, LN output and two
//   gradients (5TH fp32) and the gradient in e (TH); scores, log q and
//   their gradient, sort keys (6TK), per-slot values (16T), fp32/int32.
// The prompt encoder works on 2P vectors per batch, not per sample: it is
// in the workspace.
//
// Workspace: kGemmWorkspaceBytes (allocated with the CUDA context) plus the
// prompt encoder (a few 2P x 8H buffers).
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
  double act = (4.0 * L + 2.0 * R + T + T * K) * 4.0;                       // inputs
  act += 2.0 * L * H * e + 2.0 * L * 4.0 + 5.0 * L * 4.0;                  // embeddings
  act += cfg.layers * ((8.0 * L * H + 2.0 * L * F) * e + 4.0 * L * 4.0 +  // layers
                       (fused ? A * L * 4.0 : A * L * L * e));
  act += (6.0 * L * H + L * F) * e;                                        // backward scratch
  act += fused ? A * L * 4.0 : std::max(4.0 * L * H, 7.0 * L * H + A * L * L) * e;
  // GEMM attention with attention dropout: the masked probabilities too
  // (the fused kernels regenerate the mask; hidden dropout needs nothing).
  if (!fused && cfg.attention_dropout > 0.0f) act += A * L * L * e;
  act += 7.0 * R * H * e + 3.0 * R * 4.0 + R * V * e;                      // MLM head
  if (cfg.candidate && K > 0) act += 5.0 * T * H * 4.0 + T * H * e + 6.0 * T * K * 4.0;
  act += 16.0 * T * 4.0;                                                   // per-slot heads
  m.activations_per_sample = act;

  const double P2 = 2.0 * cfg.prompt_length;
  m.workspace = kGemmWorkspaceBytes + 4.0 * P2 * 8.0 * H * 4.0;
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
