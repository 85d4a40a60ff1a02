#include "model/core/memory_model.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace dgca {
namespace {

TEST(MemoryModelTest, StateBytesFromParameterCount) {
  ModelConfig cfg;  // bert-base
  const double N = static_cast<double>(CountParameters(cfg));
  MemoryEstimate fp32 = EstimateMemory(cfg, 128, Precision::kFp32);
  EXPECT_DOUBLE_EQ(fp32.params, 4 * N);
  EXPECT_DOUBLE_EQ(fp32.grads, 4 * N);
  EXPECT_DOUBLE_EQ(fp32.optimizer, 8 * N);
  MemoryEstimate bf16 = EstimateMemory(cfg, 128, Precision::kBf16);
  EXPECT_DOUBLE_EQ(bf16.params, 6 * N);
  EXPECT_DOUBLE_EQ(bf16.optimizer, 8 * N);
}

TEST(MemoryModelTest, ActivationsMatchHandFormula) {
  ModelConfig cfg = ApplyPreset("tiny", ModelConfig()).value();
  cfg.vocab_size = 1000;
  cfg.prompt_length = 3;
  cfg.candidate_top_k = 8;
  const double L = 64, H = 128, A = 2, F = 512, V = 1000, K = 8, e = 4;
  const double T = (64 - 2 - 6) / 2;  // 28
  const double R = 2 * T;
  const double expect = (4 * L + 2 * R + T + T * K) * 4 +                       // inputs
                        2 * L * H * e + 2 * L * 4 + 5 * L * 4 +                  // embeddings
                        2 * ((8 * L * H + 2 * L * F) * e + 4 * L * 4 + A * L * L * e) +  // layers
                        (6 * L * H + L * F) * e +                                // backward scratch
                        std::max(4 * L * H, 7 * L * H + A * L * L) * e +         // GEMM attention's
                        7 * R * H * e + 3 * R * 4 + R * V * e +                  // MLM head
                        5 * T * H * 4 + T * H * e + 6 * T * K * 4 + 16 * T * 4;  // heads
  MemoryEstimate m = EstimateMemory(cfg, 64, Precision::kFp32);
  EXPECT_DOUBLE_EQ(m.activations_per_sample, expect);
  EXPECT_DOUBLE_EQ(m.total(3) - m.total(1), 2 * expect);
}

TEST(MemoryModelTest, MonotoneAndHalfPrecisionSmaller) {
  ModelConfig cfg;
  MemoryEstimate a = EstimateMemory(cfg, 128, Precision::kFp32);
  MemoryEstimate b = EstimateMemory(cfg, 256, Precision::kFp32);
  MemoryEstimate h = EstimateMemory(cfg, 128, Precision::kFp16);
  EXPECT_GT(b.activations_per_sample, 2 * a.activations_per_sample * 0.99);
  EXPECT_LT(h.activations_per_sample, a.activations_per_sample);
  // Half the bytes per element, and fp16 runs the fused attention (no
  // A*L*L probabilities), so a little under half.
  EXPECT_GT(h.activations_per_sample, 0.35 * a.activations_per_sample);
  // bert-base at L=128 in fp32: order of 100 MB per sample, 2 GB of state.
  EXPECT_GT(a.activations_per_sample, 50e6);
  EXPECT_LT(a.activations_per_sample, 300e6);
  EXPECT_GT(a.total(0), 2.0e9);
  EXPECT_LT(a.total(0), 2.2e9);
}

// bf16/fp16 at a fused-attention shape keep A*L fp32 per layer instead of
// A*L*L 16-bit probabilities, and the fused backward's A*L fp32 row sums
// instead of the GEMM version's split heads and dprobs.
TEST(MemoryModelTest, FusedAttentionDropsTheProbabilities) {
  ModelConfig cfg;  // bert-base: d = 64
  const double L = 128, H = 768, A = 12, layers = 12, e = 2;
  MemoryEstimate bf16 = EstimateMemory(cfg, 128, Precision::kBf16);
  MemoryEstimate asked_gemm = EstimateMemory(cfg, 128, Precision::kBf16, /*fused_attention=*/false);
  EXPECT_DOUBLE_EQ(asked_gemm.activations_per_sample - bf16.activations_per_sample,
                   layers * (A * L * L * e - A * L * 4) + (7 * L * H + A * L * L) * e - A * L * 4);
  EXPECT_DOUBLE_EQ(asked_gemm.workspace, bf16.workspace);
  // d = 128 (6 heads): the fused kernels do not apply, whatever is asked.
  ModelConfig d128 = cfg;
  d128.heads = 6;
  EXPECT_DOUBLE_EQ(EstimateMemory(d128, 128, Precision::kBf16).activations_per_sample,
                   EstimateMemory(d128, 128, Precision::kBf16, false).activations_per_sample);
  EXPECT_TRUE(FusedAttentionShape(128, 768, 12));
  EXPECT_FALSE(FusedAttentionShape(128, 768, 6));
  EXPECT_FALSE(FusedAttentionShape(513, 768, 12));
}

// Dropout masks are regenerated, never stored: only the GEMM attention's
// masked probabilities (one A*L*L buffer) cost memory.
TEST(MemoryModelTest, DropoutCostsOnlyTheGemmAttentionsMaskedProbabilities) {
  ModelConfig cfg;  // bert-base
  ModelConfig drop = cfg;
  drop.hidden_dropout = drop.attention_dropout = 0.1f;
  const double L = 128, A = 12;
  EXPECT_DOUBLE_EQ(EstimateMemory(drop, 128, Precision::kBf16).activations_per_sample,
                   EstimateMemory(cfg, 128, Precision::kBf16).activations_per_sample);
  EXPECT_DOUBLE_EQ(EstimateMemory(drop, 128, Precision::kFp32).activations_per_sample -
                       EstimateMemory(cfg, 128, Precision::kFp32).activations_per_sample,
                   A * L * L * 4);
  ModelConfig hidden_only = cfg;
  hidden_only.hidden_dropout = 0.1f;
  EXPECT_DOUBLE_EQ(EstimateMemory(hidden_only, 128, Precision::kFp32).activations_per_sample,
                   EstimateMemory(cfg, 128, Precision::kFp32).activations_per_sample);
}

TEST(MemoryModelTest, MaxMicroBatch) {
  MemoryEstimate m;
  m.params = 100;
  m.activations_per_sample = 10;
  EXPECT_EQ(MaxMicroBatch(m, 100), 0);
  EXPECT_EQ(MaxMicroBatch(m, 109), 0);
  EXPECT_EQ(MaxMicroBatch(m, 110), 1);
  EXPECT_EQ(MaxMicroBatch(m, 195), 9);
}

}  // namespace
}  // namespace dgca
