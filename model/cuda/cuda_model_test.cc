// Tests of CudaDgcaModel (cuda_model.h). Host-side checks run everywhere;
// the whole-step GPU-vs-CPU comparison (model_check.h) and the batch
// validation on a real model skip without a visible device, saying why.
// Runs on the CUDA emulator as cuda_model_test_emu and on an H200 (docs/benchmarks.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/core/batch.h"
#include "model/core/config.h"
#include "model/core/memory_model.h"
#include "model/cuda_check/check_test_util.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/gemm.h"
#include "model/cuda_check/model_check.h"
#include "model/nn/model.h"
#include "model/nn/synthetic_batch.h"
#include "model/train/optimizer.h"

namespace dgca {
namespace cuda {
namespace {

TEST(CudaModelTest, CreateRejectsBadArgumentsWithoutTouchingTheDevice) {
  ModelConfig cfg;
  auto no_ctx = CudaDgcaModel::Create(cfg, 2, 16, 1, Precision::kFp32, nullptr);
  ASSERT_FALSE(no_ctx.ok());
  EXPECT_EQ(no_ctx.status().code(), StatusCode::kInvalidArgument);
}

// Tests that need a device (the emulator's or a GPU): skipped, saying why,
// without one; `ctx` is device 0's context.
class CudaModelOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (VisibleDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device visible: " << why;
    auto c = CudaContext::Create(0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ctx = std::move(*c);
  }
  std::unique_ptr<CudaContext> ctx;
};

TEST_F(CudaModelOnDevice, WholeStepMatchesCpu) {
  GemmRunner gemm(ctx.get());
  const uint64_t seed = 12345;
  std::mt19937_64 rng(seed);
  for (const OpCheck& c : ModelChecks()) check_test::ExpectCheckPasses(c, *ctx, &gemm, &rng, seed);
}

// The planner sizes micro-batches with EstimateMemory
// (model/core/memory_model.h): it must predict what the CUDA model
// allocates (device memory in use after Create and one step, less the GEMM
// workspace the context holds) for each precision and attention kernel.
// The emulator counts bytes exactly (5%); a GPU's allocator rounds to pages.
TEST_F(CudaModelOnDevice, MemoryModelPredictsWhatTheModelAllocates) {
#if defined(DGCA_CUDA_EMULATOR)
  const double tolerance = 0.05;
#else
  const double tolerance = 0.25;
#endif
  ModelConfig cfg = ApplyPreset("tiny", ModelConfig()).value();
  const int B = 4, L = 64;
  struct Case {
    Precision prec;
    bool fused;
  };
  for (const Case& c : {Case{Precision::kFp32, false}, Case{Precision::kBf16, true},
                        Case{Precision::kBf16, false}, Case{Precision::kFp16, true}}) {
    size_t free0 = 0, free1 = 0, total = 0;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
    {
      auto m = CudaDgcaModel::Create(cfg, B, L, 3, c.prec, ctx.get());
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      ASSERT_TRUE((*m)->set_fused_attention(c.fused).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
    }
    const double measured = double(free0) - double(free1);
    const double predicted = EstimateMemory(cfg, L, c.prec, c.fused).total(B) - kGemmWorkspaceBytes;
    EXPECT_NEAR(predicted / measured, 1.0, tolerance)
        << PrecisionName(c.prec) << (c.fused ? " fused" : " GEMM") << " attention: predicted " << predicted
        << " bytes, allocated " << measured;
  }
}

// Every GEMM of a training step (forward, backward, AdamW's refresh) gets
// operands at least 16-byte aligned, so cuBLASLt can use its tensor-core
// kernels: the parameter layout (ParamStore aligns each tensor) and every
// activation slice. The tiny preset with all heads on (the detector's
// 1-float bias once left the candidate head's weights 2-byte aligned), both
// 16-bit precisions and both attention versions.
TEST_F(CudaModelOnDevice, EveryGemmOfAStepIsSixteenByteAligned) {
  ModelConfig cfg = ApplyPreset("tiny", ModelConfig()).value();
  cfg.vocab_size = 8192;
  ASSERT_TRUE(cfg.detector && cfg.candidate && cfg.fusion == FusionKind::kGated);
  const int B = 4, L = 48;
  const Batch batch = BenchmarkBatch(cfg, B, L, 5);
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    for (bool fused : {true, false}) {
      SCOPED_TRACE(std::string(PrecisionName(p)) + (fused ? " fused" : " GEMM") + " attention");
      auto m = CudaDgcaModel::Create(cfg, B, L, 3, p, ctx.get());
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      ASSERT_TRUE((*m)->set_fused_attention(fused).ok());
      ASSERT_TRUE((*m)->ZeroGrads().ok());
      auto loss = (*m)->ForwardBackward(batch, 1.0f, nullptr);
      ASSERT_TRUE(loss.ok()) << loss.status().ToString();
      ASSERT_TRUE((*m)->Step(1e-3f, AdamWOptions{}).ok());
      ASSERT_TRUE((*m)->Synchronize().ok());
      std::string notes;
      for (const std::string& n : (*m)->gemm_underaligned_notes()) notes += "\n  " + n;
      EXPECT_EQ((*m)->gemm_underaligned_plans(), 0u) << notes;
      EXPECT_EQ((*m)->gemm_fallback_plans(), 0u);
    }
  }
}

// A hidden size that is not a multiple of 8 (12): the parameter layout has
// alignment gaps between tensors while key and value still follow the query
// (ParamStore), and the fp32 CUDA step matches the CPU model's: losses and
// every gradient, gaps included (zero on both).
TEST_F(CudaModelOnDevice, HiddenNotAMultipleOfEightMatchesTheCpu) {
  ModelConfig cfg = ApplyPreset("tiny", ModelConfig()).value();
  cfg.vocab_size = 300;
  cfg.hidden = 12, cfg.heads = 2, cfg.ffn = 20, cfg.layers = 2;
  const int B = 3, L = 40;
  const Batch batch = SyntheticBatch(cfg, L, {9, 12, 6}, /*mft=*/true, 4);
  auto cpu = DgcaModel::Create(cfg, B, L, 7, 1);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto gpu = CudaDgcaModel::Create(cfg, B, L, 7, Precision::kFp32, ctx.get());
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  const ParamStore& cs = (*cpu)->params();
  ASSERT_GT(cs.total_numel(), cs.parameter_count());  // there are gaps
  (*cpu)->params().ZeroGrads();
  ASSERT_TRUE((*gpu)->ZeroGrads().ok());
  auto want = (*cpu)->ForwardBackward(batch, 1.0f, nullptr);
  auto got = (*gpu)->ForwardBackward(batch, 1.0f, nullptr);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_NEAR(got->total, want->total, 1e-5 * std::abs(want->total));
  ASSERT_TRUE((*gpu)->DownloadGrads().ok());
  const ParamStore& gs = (*gpu)->params();
  ASSERT_EQ(gs.total_numel(), cs.total_numel());
  double scale = 0, worst = 0;
  for (int64_t i = 0; i < cs.total_numel(); ++i) scale = std::max(scale, double(std::abs(cs.grads()[i])));
  for (int64_t i = 0; i < cs.total_numel(); ++i)
    worst = std::max(worst, std::abs(double(gs.grads()[i]) - double(cs.grads()[i])));
  ASSERT_GT(scale, 0);
  EXPECT_LE(worst, 1e-4 * scale) << "worst gradient difference " << worst << " of " << scale;
}

TEST_F(CudaModelOnDevice, BadBatchIsRejectedNamingTheField) {
  ModelConfig cfg;
  cfg.vocab_size = 40;
  cfg.hidden = 16;
  cfg.layers = 1;
  cfg.heads = 2;
  cfg.ffn = 32;
  cfg.max_position = 16;
  cfg.prompt_length = 1;
  cfg.candidate_top_k = 2;
  auto m = CudaDgcaModel::Create(cfg, 2, 16, 3, Precision::kFp32, ctx.get());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Batch b;
  b.batch_size = 1;
  b.seq_len = 8;
  b.input_ids.assign(8, 5);
  b.attention_mask.assign(8, 1);
  b.input_ids[3] = 40;  // == vocab_size: out of range
  auto r = (*m)->Forward(b);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("input_ids[3]"), std::string::npos) << r.status().ToString();
  b.input_ids[3] = 5;
  b.batch_size = 3;  // > max_batch
  EXPECT_FALSE((*m)->Forward(b).ok());
}

}  // namespace
}  // namespace cuda
}  // namespace dgca
