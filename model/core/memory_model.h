// Memory model of one training rank: bytes for weights, gradients, optimizer
// state and activations, from the model shape alone. The planner picks the
// largest micro-batch whose total fits the device memory with headroom.
//
// Not included: the CUDA context and allocator fragmentation (the planner
// adds its own margin), communication buckets (they depend on the plan).
// 16-bit runs are modelled with the fused attention wherever
// FusedAttentionShape allows (the trainer's default); one run with
// --gemm-attention keeps A*L*L probabilities per layer and sample and
// needs more.
//
// Thread-safety: pure functions.
#ifndef DGCA_MODEL_CORE_MEMORY_MODEL_H_
#define DGCA_MODEL_CORE_MEMORY_MODEL_H_

#include <cstdint>

#include "model/core/config.h"

namespace dgca {

// cuBLASLt's workspace (its recommended size on Hopper), allocated with the
// CUDA context (model/cuda/cuda_context.h), not by the model.
constexpr double kGemmWorkspaceBytes = 32.0 * 1024 * 1024;

struct MemoryEstimate {
  double params = 0;                  // fp32 master weights (+ half copy for fp16/bf16)
  double grads = 0;                   // fp32 gradients
  double optimizer = 0;               // AdamW m and v, fp32
  double activations_per_sample = 0;  // saved for backward, one sample of seq_len
  double workspace = 0;               // GEMM workspace and per-step temporaries
  // Bytes for a micro-batch of `micro_batch` samples.
  double total(int micro_batch) const {
    return params + grads + optimizer + workspace + activations_per_sample * micro_batch;
  }
};

// Bytes of activation element for `precision` (4 for fp32, 2 for fp16/bf16).
int ActivationBytes(Precision precision);

// fused_attention: whether a 16-bit run takes the fused attention kernels
// where FusedAttentionShape allows (TrainConfig::fused_attention).
MemoryEstimate EstimateMemory(const ModelConfig& cfg, int seq_len, Precision precision,
                              bool fused_attention = true);

// The largest micro-batch whose total fits `budget_bytes` (0 when even one
// sample does not fit).
int MaxMicroBatch(const MemoryEstimate& estimate, double budget_bytes);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_MEMORY_MODEL_H_
