// Times the two attention implementations of model/cuda at one shape on the
// GPU: the fused flash-style kernels (flash_attention.h) and the GEMM +
// softmax version (attention.h). A run with `train.attention: auto` keeps
// the faster at its own shape (the idea of cudnn.benchmark: which is faster
// depends on the card, the head size and the length, and is cheaper to
// measure than to predict); dgca-bench --attention-only prints the same
// numbers.
//
// Thread-safety: TimeAttention uses ctx's stream; one call at a time per
// context, not concurrently with other work on it (the timings would mix).
#ifndef DGCA_MODEL_CUDA_ATTENTION_TUNE_H_
#define DGCA_MODEL_CUDA_ATTENTION_TUNE_H_

#include <cstddef>
#include <string>

#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/dtype.h"

namespace dgca {
namespace cuda {

struct AttentionTiming {
  // Medians over the timed repetitions, cudaEvents on ctx's stream.
  double fused_fwd_ms = 0, fused_bwd_ms = 0, gemm_fwd_ms = 0, gemm_bwd_ms = 0;
  // What each keeps from the forward for the backward, plus its scratch,
  // at this shape (one layer).
  size_t fused_bytes = 0, gemm_bytes = 0;
  double fused_ms() const { return fused_fwd_ms + fused_bwd_ms; }
  double gemm_ms() const { return gemm_fwd_ms + gemm_bwd_ms; }
};

// Both versions' forward and backward at batch B, length L, hidden H, nh
// heads: random q/k/v in [-1, 1], the last eighth of every row padding;
// `warmup` untimed runs, then the median of `reps`. With attention_dropout
// > 0 both run with that dropout on the probabilities (random keys), as a
// training step would. Its buffers are its own
// and freed on return. INVALID_ARGUMENT when t is not bf16/fp16 or the
// fused kernels do not take the shape (FusedAttentionSupported) or reps < 1;
// RESOURCE_EXHAUSTED when the buffers do not fit; any other CUDA error as
// INTERNAL (the context may be unusable).
StatusOr<AttentionTiming> TimeAttention(const CudaContext& ctx, DType t, int B, int L, int H, int nh,
                                        int warmup, int reps, float attention_dropout = 0.0f);

// Keep the fused kernels unless the GEMM version is faster by more than
// `margin` (a fraction of the fused time): the fused kernels keep
// [heads, L] per sample instead of [heads, L, L], so a tie goes to them,
// and a margin keeps timing noise from flipping the choice between runs.
bool PreferFused(const AttentionTiming& t, double margin = 0.05);

// "fused 1.234 ms vs GEMM 1.456 ms, one layer's forward + backward".
std::string DescribeTiming(const AttentionTiming& t);

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_ATTENTION_TUNE_H_
