// Tests of CudaBert<T> (cuda_bert.h). The GPU-vs-CPU comparison
// (bert_check.h: forward, backward, every parameter gradient) runs when a
// device is visible and skips with the reason otherwise; the layout and
// call-order validation runs everywhere (no CUDA call is reached).
// The GPU test runs in ctest on the CUDA emulator (cuda_bert_test_emu)
// and on an H200 (docs/benchmarks.md).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/cuda_check/bert_check.h"
#include "model/cuda_check/check_test_util.h"
#include "model/cuda/cuda_bert.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/gemm.h"
#include "model/nn/bert.h"
#include "model/nn/params.h"

namespace dgca {
namespace cuda {
namespace {

ModelConfig SmallConfig() {
  ModelConfig cfg;
  cfg.vocab_size = 50;
  cfg.hidden = 16;
  cfg.layers = 2;
  cfg.heads = 2;
  cfg.ffn = 32;
  cfg.max_position = 32;
  return cfg;
}

TEST(CudaBertTest, BindNamesTheMissingTensor) {
  const ModelConfig cfg = SmallConfig();
  ParamStore store;
  Bert bert(cfg, 2, 8, 4);
  ASSERT_TRUE(bert.DeclareWordEmbeddings(&store).ok());
  ASSERT_TRUE(bert.DeclareBody(&store).ok());  // no MLM head declared
  store.Finalize();
  CudaBert<float> g(cfg, 2, 8, 4);
  Status s = g.Bind(store, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("cls.predictions.transform.dense.weight"), std::string::npos) << s.ToString();
}

TEST(CudaBertTest, BindRejectsAShapeThatDoesNotMatchTheConfig) {
  const ModelConfig cfg = SmallConfig();
  ParamStore store;
  Bert bert(cfg, 2, 8, 4);
  ASSERT_TRUE(bert.DeclareWordEmbeddings(&store).ok());
  ASSERT_TRUE(bert.DeclareBody(&store).ok());
  ASSERT_TRUE(bert.DeclareMlmHead(&store).ok());
  store.Finalize();
  ModelConfig other = cfg;
  other.ffn = 48;
  CudaBert<__nv_bfloat16> g(other, 2, 8, 4);
  Status s = g.Bind(store, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("bert.encoder.layer.0.intermediate.dense.weight"), std::string::npos) << s.ToString();
  // A matching layout gets past the names and fails on the null device objects.
  CudaBert<float> ok_layout(cfg, 2, 8, 4);
  s = ok_layout.Bind(store, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("null DeviceParams"), std::string::npos) << s.ToString();
}

TEST(CudaBertTest, CallsBeforeBindFailCleanly) {
  CudaBert<float> g(SmallConfig(), 2, 8, 4);
  EXPECT_EQ(g.EmbedForward(nullptr, nullptr, nullptr, nullptr, 1, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.EncoderForward(nullptr, 1, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.MlmHeadForward(nullptr, 0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.MlmHeadBackward(nullptr, nullptr, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.EmbedBackward(nullptr).code(), StatusCode::kFailedPrecondition);
}

TEST(CudaBertTest, MatchesTheCpuBertOnTheGpu) {
  std::string why;
  if (VisibleDeviceCount(&why) <= 0) GTEST_SKIP() << "no CUDA device visible (" << why << ")";
  auto ctx = CudaContext::Create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  GemmRunner gemm(ctx->get());
  const uint64_t seed = check_test::CheckSeed();
  std::mt19937_64 rng(seed);
  for (const OpCheck& check : BertChecks()) check_test::ExpectCheckPasses(check, **ctx, &gemm, &rng, seed);
}

}  // namespace
}  // namespace cuda
}  // namespace dgca
