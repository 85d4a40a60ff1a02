// Tests of CudaHeads and CudaPromptEncoder. The GPU-vs-CPU comparisons
// (heads_check.h) run when a device is visible and skip with the reason
// otherwise; the host-side argument checks run everywhere (they return
// before any CUDA call). Runs on the CUDA emulator as cuda_heads_test_emu and on an H200 (docs/benchmarks.md).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>
#include <string>

#include "model/core/config.h"
#include "model/cuda_check/check_test_util.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/cuda_heads.h"
#include "model/cuda/cuda_prompt_encoder.h"
#include "model/cuda/device_params.h"
#include "model/cuda/gemm.h"
#include "model/cuda_check/heads_check.h"
#include "model/nn/heads.h"
#include "model/nn/params.h"

namespace dgca {
namespace cuda {
namespace {

using check_test::HaveDevice;

ModelConfig SmallConfig() {
  ModelConfig cfg;
  cfg.hidden = 16;
  cfg.vocab_size = 50;
  cfg.candidate_top_k = 3;
  cfg.prompt_length = 2;
  return cfg;
}

TEST(CudaHeadsTest, HostArgumentChecksNeedNoDevice) {
  const ModelConfig cfg = SmallConfig();
  CudaHeads<float> heads(cfg, 8);
  HeadLosses out;
  Status s = heads.Forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 50, &out);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("Bind"), std::string::npos) << s.ToString();

  ParamStore unfinalized;
  s = heads.Bind(unfinalized, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();

  ParamStore store;
  DgcaHeads cpu(cfg, 8);
  ASSERT_TRUE(cpu.Declare(&store).ok());
  store.Finalize();
  s = heads.Bind(store, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // Backward before a successful Forward does nothing (as the CPU version).
  EXPECT_TRUE(heads.Backward(1.0f, nullptr, nullptr, nullptr).ok());
}

TEST(CudaPromptEncoderTest, HostArgumentChecksNeedNoDevice) {
  ModelConfig cfg = SmallConfig();
  CudaPromptEncoder enc(cfg);
  const float* out = reinterpret_cast<const float*>(&cfg);  // must be reset
  Status s = enc.Forward(&out);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(out, nullptr);

  cfg.prompt_encoder = PromptEncoderKind::kNone;
  CudaPromptEncoder none(cfg);
  ParamStore empty;
  empty.Finalize();
  ASSERT_TRUE(none.Bind(empty, nullptr, nullptr, nullptr).ok());
  out = reinterpret_cast<const float*>(&cfg);
  ASSERT_TRUE(none.Forward(&out).ok());
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(none.Backward(nullptr).ok());
}

TEST(HeadsCheckTest, ChecksHaveUniqueNames) {
  std::set<std::string> names;
  for (const OpCheck& c : HeadsChecks()) {
    EXPECT_FALSE(c.name.empty());
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate check " << c.name;
    EXPECT_TRUE(c.run != nullptr) << c.name;
  }
  EXPECT_GE(names.size(), 7u);
}

TEST(CudaHeadsTest, BindRejectsMissingAndMisshapenTensors) {
  std::string why;
  if (!HaveDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto ctx = CudaContext::Create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  GemmRunner gemm(ctx->get());
  const ModelConfig cfg = SmallConfig();
  // A layout without the heads: NOT_FOUND naming the first tensor.
  ParamStore other;
  other.Declare("something.else", {4}, true);
  other.Finalize();
  auto dp = DeviceParams::Create(&other, DType::kF32);
  ASSERT_TRUE(dp.ok()) << dp.status().ToString();
  CudaHeads<float> heads(cfg, 4);
  Status s = heads.Bind(other, dp->get(), ctx->get(), &gemm);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("detector.weight"), std::string::npos) << s.ToString();
  // The heads declared for hidden 16, bound by heads built for hidden 8.
  ParamStore store;
  DgcaHeads cpu(cfg, 4);
  ASSERT_TRUE(cpu.Declare(&store).ok());
  store.Finalize();
  auto dp2 = DeviceParams::Create(&store, DType::kF32);
  ASSERT_TRUE(dp2.ok()) << dp2.status().ToString();
  ModelConfig narrow = cfg;
  narrow.hidden = 8;
  CudaHeads<float> wrong(narrow, 4);
  s = wrong.Bind(store, dp2->get(), ctx->get(), &gemm);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // bf16 heads need the bf16 copy.
  CudaHeads<__nv_bfloat16> half(cfg, 4);
  s = half.Bind(store, dp2->get(), ctx->get(), &gemm);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
}

TEST(CudaHeadsTest, MatchesCpuReference) {
  std::string why;
  if (!HaveDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto ctx = CudaContext::Create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  GemmRunner gemm(ctx->get());
  const uint64_t seed = check_test::CheckSeed();
  std::mt19937_64 rng(seed);
  for (const OpCheck& c : HeadsChecks()) check_test::ExpectCheckPasses(c, **ctx, &gemm, &rng, seed);
}

}  // namespace
}  // namespace cuda
}  // namespace dgca
