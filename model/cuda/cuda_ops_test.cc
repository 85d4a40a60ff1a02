// Tests of the CUDA backend. The GPU checks (every op against its CPU
// reference, op_check.h) run when a device is visible and skip with the
// reason otherwise; the no-device paths (clean FAILED_PRECONDITION from
// CudaContext::Create, failing launches, GEMM argument validation, the error
// measure) run everywhere, so CI without a GPU still checks something real.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>

#include "model/cuda/attention.h"
#include "model/cuda/attention_tune.h"
#include "model/cuda_check/check_test_util.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/gemm.h"
#include "model/cuda/kernels.h"
#include "model/cuda_check/op_check.h"

namespace dgca {
namespace cuda {
namespace {

using check_test::HaveDevice;

TEST(CudaContextTest, CreateFailsCleanlyWithoutDevice) {
  std::string why;
  if (HaveDevice(&why)) GTEST_SKIP() << "a CUDA device is visible: the no-device path cannot be reached here";
  auto ctx = CudaContext::Create(0);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), StatusCode::kFailedPrecondition) << ctx.status().ToString();
  EXPECT_NE(ctx.status().message().find("no CUDA device visible (cudaGetDeviceCount: "), std::string::npos)
      << ctx.status().ToString();
  EXPECT_NE(ctx.status().message().find(why), std::string::npos) << ctx.status().ToString();
}

TEST(CudaContextTest, DeviceOutOfRangeIsFailedPrecondition) {
  auto ctx = CudaContext::Create(1 << 20);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), StatusCode::kFailedPrecondition) << ctx.status().ToString();
}

TEST(CudaKernelsTest, LaunchWithoutDeviceReturnsAnErrorInsteadOfCrashing) {
  std::string why;
  if (HaveDevice(&why)) GTEST_SKIP() << "a CUDA device is visible: launches succeed here";
  EXPECT_FALSE(GeluForward<float>(nullptr, nullptr, nullptr, 16).ok());
  EXPECT_FALSE(LayerNormForward<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 8, 1e-5f).ok());
  DeviceArray<float> a;
  Status s = a.Allocate(16);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("cudaMalloc"), std::string::npos) << s.ToString();
}

// Argument validation happens before the context is touched.
TEST(GemmRunnerTest, RejectsBadArgumentsWithClearMessages) {
  GemmRunner gemm(nullptr);
  GemmArgs g;
  g.M = 0; g.N = 4; g.K = 4; g.lda = 4; g.ldb = 4; g.ldc = 4;
  Status s = gemm.Run(g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("M=0"), std::string::npos) << s.ToString();
  g.M = 4; g.lda = 3;  // op(A) is [4,4]: lda must be >= 4
  s = gemm.Run(g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lda=3"), std::string::npos) << s.ToString();
  g.lda = 4; g.in_type = DType::kF32; g.out_type = DType::kBF16;
  s = gemm.Run(g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fp32->bf16"), std::string::npos) << s.ToString();
  g.trans_a = true; g.M = 8; g.K = 4; g.lda = 4; g.out_type = DType::kF32;  // A stored [K,M] = [4,8]
  s = gemm.Run(g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  // A bias cuBLASLt's epilogue kernels might read misaligned (its alignment
  // preferences do not cover the bias): refused before any plan is made.
  g.trans_a = false; g.M = 4; g.K = 4; g.lda = 4;
  alignas(16) static float bias[8];
  g.bias = bias + 1;
  s = gemm.Run(g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bias must be 16-byte aligned"), std::string::npos) << s.ToString();
  EXPECT_EQ(gemm.cached_plans(), 0u);
}

// Which shapes the fused attention takes, and the errors for the others
// (before any launch: no device needed).
TEST(FusedAttentionTest, SupportedShapesAndClearErrors) {
  EXPECT_TRUE(FusedAttentionSupported(DType::kBF16, 128, 768, 12));  // bert-base, d = 64
  EXPECT_TRUE(FusedAttentionSupported(DType::kF16, 512, 128, 4));    // d = 32, the longest L
  EXPECT_TRUE(FusedAttentionSupported(DType::kBF16, 1, 64, 4));      // d = 16
  EXPECT_FALSE(FusedAttentionSupported(DType::kF32, 128, 768, 12));  // fp32: the GEMM version
  EXPECT_FALSE(FusedAttentionSupported(DType::kBF16, 513, 768, 12));
  EXPECT_FALSE(FusedAttentionSupported(DType::kBF16, 128, 1024, 8));  // d = 128
  EXPECT_FALSE(FusedAttentionSupported(DType::kBF16, 128, 96, 4));    // d = 24
  EXPECT_FALSE(FusedAttentionSupported(DType::kBF16, 128, 100, 3));   // H % heads != 0
  alignas(16) static bf16 buf[64];
  static float lse[8];
  static int32_t mask[8];
  Status s = FusedAttentionForward<bf16>(nullptr, buf, lse, buf, mask, 1, 8, 96, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("head size 16, 32 or 64"), std::string::npos) << s.ToString();
  s = FusedAttentionForward<bf16>(nullptr, buf + 1, lse, buf, mask, 1, 8, 64, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("16-byte aligned"), std::string::npos) << s.ToString();
  s = FusedAttentionBackward<bf16>(nullptr, buf, buf, buf, buf, lse, mask, 1, 8, 64, 4, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("null lse, mask or scratch"), std::string::npos) << s.ToString();
}

// The fused kernels stop at each batch row's last real key (flash_attention.cu
// LastRealKey): keys after it, whatever they hold, change nothing. Row 1 of
// two has 40 real keys of 128; its keys 64..127 hold NaN in one run and
// finite values in the other: out, lse and dqkv must be bitwise the same,
// and finite (a kernel that still streamed those keys would multiply 0 by
// NaN). The kernels' agreement with the CPU reference at such shapes is
// dgca-model-check's "attention (fused)" rows.
TEST(FusedAttentionTest, KeysAfterTheLastRealKeyAreNeverRead) {
  std::string why;
  if (!HaveDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto ctx = CudaContext::Create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  const int B = 2, L = 128, H = 64, nh = 4, real = 40;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<bf16> qkv(size_t(B) * L * 3 * H), dout(size_t(B) * L * H);
  for (bf16& x : qkv) x = FromF<bf16>(u(rng));
  for (bf16& x : dout) x = FromF<bf16>(u(rng));
  std::vector<int32_t> mask(size_t(B) * L, 1);
  for (int j = real; j < L; ++j) mask[L + j] = 0;
  struct Result {
    std::vector<bf16> out, dqkv;
    std::vector<float> lse;
  };
  auto run = [&](const std::vector<bf16>& in) -> Result {
    DeviceArray<bf16> d_qkv, d_out, d_dout, d_dqkv;
    DeviceArray<float> d_lse, d_scratch;
    DeviceArray<int32_t> d_mask;
    Result r;
    for (Status s : {d_qkv.Upload(in), d_dout.Upload(dout), d_mask.Upload(mask), d_out.Allocate(dout.size()),
                     d_dqkv.Allocate(in.size()), d_lse.Allocate(size_t(B) * nh * L),
                     d_scratch.Allocate(size_t(FusedAttentionBackwardScratchFloats(B, L, nh))), d_out.Poison(),
                     d_dqkv.Poison(), d_lse.Poison()}) {
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    EXPECT_TRUE(CudaStatus(cudaDeviceSynchronize(), "sync").ok());
    Status s = FusedAttentionForward<bf16>(ctx->get()->stream(), d_out.get(), d_lse.get(), d_qkv.get(),
                                           d_mask.get(), B, L, H, nh);
    EXPECT_TRUE(s.ok()) << s.ToString();
    s = FusedAttentionBackward<bf16>(ctx->get()->stream(), d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(),
                                     d_lse.get(), d_mask.get(), B, L, H, nh, d_scratch.get());
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE((*ctx)->Synchronize().ok());
    EXPECT_TRUE(d_out.Download(&r.out).ok() && d_dqkv.Download(&r.dqkv).ok() && d_lse.Download(&r.lse).ok());
    return r;
  };
  std::vector<bf16> poisoned = qkv;
  for (int j = 64; j < L; ++j)  // row 1's keys and values after the tile of its last real key
    for (int c = H; c < 3 * H; ++c) poisoned[(size_t(L) + j) * 3 * H + c] = FromF<bf16>(NAN);
  const Result a = run(qkv), b = run(poisoned);
  ASSERT_EQ(a.out.size(), b.out.size());
  auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  EXPECT_TRUE(same(a.out, b.out));
  EXPECT_TRUE(same(a.lse, b.lse));
  EXPECT_TRUE(same(a.dqkv, b.dqkv));
  for (bf16 x : b.out) ASSERT_TRUE(std::isfinite(ToF(x)));
  for (bf16 x : b.dqkv) ASSERT_TRUE(std::isfinite(ToF(x)));
  // The padding keys' gradients are zero.
  for (int j = real; j < L; ++j)
    for (int c = H; c < 3 * H; ++c) ASSERT_EQ(ToF(b.dqkv[(size_t(L) + j) * 3 * H + c]), 0.0f) << j << "," << c;
}

// An allocation that does not fit is RESOURCE_EXHAUSTED (what a caller can
// act on: train.attention auto then keeps the fused kernels), and it leaves
// no error behind for the next launch check to report as its own.
TEST(DeviceArrayTest, OutOfMemoryIsResourceExhaustedAndLeavesNoStaleError) {
  std::string why;
  if (!HaveDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto ctx = CudaContext::Create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  DeviceArray<float> huge;
  Status s = huge.Allocate(size_t(1) << 40);  // 4 TiB
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  DeviceArray<float> x, y;
  ASSERT_TRUE(x.Upload(std::vector<float>(64, 0.5f)).ok());
  ASSERT_TRUE(y.Allocate(64).ok());
  EXPECT_TRUE(GeluForward<float>((*ctx)->stream(), y.get(), x.get(), 64).ok());
  EXPECT_TRUE((*ctx)->Synchronize().ok());
}

TEST(AttentionTuneTest, PreferFusedKeepsTheFusedUnlessGemmIsClearlyFaster) {
  AttentionTiming t;
  t.fused_fwd_ms = 1.0, t.fused_bwd_ms = 2.0;  // fused 3.0 ms
  t.gemm_fwd_ms = 1.0, t.gemm_bwd_ms = 1.9;    // GEMM 2.9 ms: 3% faster, within the margin
  EXPECT_TRUE(PreferFused(t));
  t.gemm_bwd_ms = 1.8;  // 2.8 ms: 6.7% faster
  EXPECT_FALSE(PreferFused(t));
  EXPECT_TRUE(PreferFused(t, /*margin=*/0.1));
  t.gemm_bwd_ms = 2.5;  // slower
  EXPECT_TRUE(PreferFused(t));
  EXPECT_EQ(DescribeTiming(t), "fused 3.000 ms vs GEMM 3.500 ms, one layer's forward + backward");
}

TEST(AttentionTuneTest, TimesBothVersionsOrSaysWhyNot) {
  std::string why;
  if (!HaveDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto ctx = CudaContext::Create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  auto t = TimeAttention(**ctx, DType::kBF16, 2, 40, 64, 4, /*warmup=*/0, /*reps=*/1);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_GT(t->fused_fwd_ms, 0);
  EXPECT_GT(t->fused_bwd_ms, 0);
  EXPECT_GT(t->gemm_fwd_ms, 0);
  EXPECT_GT(t->gemm_bwd_ms, 0);
  // The GEMM version keeps [B, heads, L, L] probabilities, the fused [B, heads, L].
  EXPECT_GE(t->gemm_bytes, size_t(2) * 4 * 40 * 40 * sizeof(bf16));
  EXPECT_LT(t->fused_bytes, t->gemm_bytes);
  // With attention dropout (what a dropout run's auto choice times): the
  // GEMM version's scratch also holds the masked probabilities.
  auto d = TimeAttention(**ctx, DType::kBF16, 2, 40, 64, 4, 0, 1, /*attention_dropout=*/0.1f);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_GT(d->fused_ms(), 0);
  EXPECT_GT(d->gemm_ms(), 0);
  EXPECT_EQ(d->gemm_bytes, t->gemm_bytes + size_t(2) * 4 * 40 * 40 * sizeof(bf16));
  for (auto bad : {TimeAttention(**ctx, DType::kF32, 2, 40, 64, 4, 0, 1),   // fp32: no fused kernels
                   TimeAttention(**ctx, DType::kBF16, 2, 40, 96, 4, 0, 1),  // head size 24
                   TimeAttention(**ctx, DType::kBF16, 2, 40, 64, 4, 0, 0),  // no repetition
                   TimeAttention(**ctx, DType::kBF16, 2, 40, 64, 4, 0, 1, 1.0f)}) {  // dropout 1
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
  }
}

TEST(OpCheckTest, MaxRelErrIsNormalizedAndCatchesPoison) {
  EXPECT_DOUBLE_EQ(MaxRelErr({1.0f, 2.0f}, {1.0f, 2.0f}), 0.0);
  EXPECT_NEAR(MaxRelErr({1.0f, 4.1f}, {1.0f, 4.0f}), 0.1 / 4.0, 1e-6);
  EXPECT_TRUE(std::isinf(MaxRelErr({1.0f, NAN}, {1.0f, 2.0f})));     // a skipped (poisoned) element
  EXPECT_TRUE(std::isinf(MaxRelErr({1.0f}, {1.0f, 2.0f})));          // size mismatch
  CheckRow nan_row{"x", "fp32", MaxRelErr({NAN}, {1.0f}), kF32Tol};
  EXPECT_FALSE(nan_row.pass());
  EXPECT_LT(kF32Tol, kBf16Tol);
}

TEST(OpCheckTest, EveryOpHasACheckInBothPrecisions) {
  std::set<std::string> names;
  for (const OpCheck& c : AllOpChecks()) names.insert(c.name);
  for (const char* op : {"layernorm", "gelu", "softmax", "attention", "embedding", "bias", "cross_entropy"}) {
    EXPECT_TRUE(names.count(std::string(op) + " fp32")) << op;
    EXPECT_TRUE(names.count(std::string(op) + " bf16")) << op;
    EXPECT_TRUE(names.count(std::string(op) + " fp16")) << op;
  }
  for (const char* name : {"gemm_nn_bias fp32->fp32", "gemm_nn_bias bf16->bf16", "gemm_nn_bias fp16->fp32",
                           "gemm_nt_batched fp32->fp32", "adamw fp32 master + bf16 copy",
                           "adamw fp32 master + fp16 copy", "loss_scale fp32"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
}

// The accuracy rule (docs/benchmarks.md): low-precision tolerance = 2x PyTorch's own error on the op.
TEST(OpCheckTest, PeerErrorsSetTolerancesByLongestOpPrefix) {
  auto peer = ParsePeerErrors(
      R"({"impl": "pytorch", "errors": {"bf16": {"gemm_nn_bias 128x96x64": 0.004, "layernorm_fwd.out": 0.003,
          "layernorm_fwd": 0.5, "gelu_fwd": null}, "fp16": {"layernorm_fwd.out": 0.0004}}})",
      "op_errors.json");
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  CheckRow ln{"layernorm_fwd.out (300 rows)", "bf16", 0.001, 0.01};
  EXPECT_TRUE(ApplyPeerTolerance(*peer, 2.0, &ln));
  EXPECT_DOUBLE_EQ(ln.tolerance, 0.006);  // the longer prefix wins over "layernorm_fwd"
  EXPECT_TRUE(ln.peer_tolerance);
  CheckRow ln16{"layernorm_fwd.out", "fp16", 0.001, 0.005};
  EXPECT_TRUE(ApplyPeerTolerance(*peer, 2.0, &ln16));
  EXPECT_FALSE(ln16.pass());  // 0.001 > 2 x 0.0004
  CheckRow gemm{"gemm_nn_bias 128x96x64 ->bf16", "bf16", 0.001, 0.01};
  EXPECT_TRUE(ApplyPeerTolerance(*peer, 2.0, &gemm));
  EXPECT_DOUBLE_EQ(gemm.tolerance, 0.008);
  CheckRow gelu{"gelu_fwd", "bf16", 0.001, 0.01};  // null: no PyTorch kernel, keep ours
  EXPECT_FALSE(ApplyPeerTolerance(*peer, 2.0, &gelu));
  EXPECT_DOUBLE_EQ(gelu.tolerance, 0.01);
  CheckRow fp32{"layernorm_fwd.out", "fp32", 0.0, 1e-4};
  EXPECT_FALSE(ApplyPeerTolerance(*peer, 2.0, &fp32));

  auto bad = ParsePeerErrors(R"({"errors": {"bf16": {"x": "big"}}})", "op_errors.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("op_errors.json:1:"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("errors.bf16.x"), std::string::npos) << bad.status().ToString();
  EXPECT_FALSE(ParsePeerErrors("{}", "op_errors.json").ok());
}

#if defined(DGCA_CUDA_EMULATOR)
// Real cuBLASLt says "no algorithm for this shape" as NOT_SUPPORTED, from its
// heuristic or from cublasLtMatmul itself; the emulator answers so when told
// (DGCA_EMU_CUBLASLT_REFUSE). Every GEMM check still matches the CPU
// reference, through FallbackGemm, and every plan is counted as fallen back.
TEST(GemmRunnerTest, NotSupportedFromCublasLtFallsBackToTheTiledKernel) {
  for (const char* where : {"heuristic", "matmul"}) {
    SCOPED_TRACE(where);
    auto ctx = CudaContext::Create(0);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    GemmRunner gemm(ctx->get());
    ASSERT_EQ(setenv("DGCA_EMU_CUBLASLT_REFUSE", where, 1), 0);
    struct Unset {  // also when an assertion returns early: later tests use cuBLASLt again
      ~Unset() { unsetenv("DGCA_EMU_CUBLASLT_REFUSE"); }
    } unset;
    int checks = 0;
    for (const OpCheck& check : AllOpChecks()) {
      if (check.name.rfind("gemm", 0) != 0) continue;
      const uint64_t seed = check_test::CheckSeed();
      std::mt19937_64 rng(seed);
      check_test::ExpectCheckPasses(check, **ctx, &gemm, &rng, seed);
      ++checks;
    }
    EXPECT_GE(checks, 10);
    EXPECT_GT(gemm.cached_plans(), 0u);
    EXPECT_EQ(gemm.fallback_plans(), gemm.cached_plans());
  }
}
#endif

class CudaOpTest : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaOpTest, MatchesCpuReference) {
  std::string why;
  if (!HaveDevice(&why)) GTEST_SKIP() << "no CUDA device visible (" << why << "): GPU op checks need a GPU";
  auto ctx = CudaContext::Create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  GemmRunner gemm(ctx->get());
  const OpCheck& check = AllOpChecks()[GetParam()];
  const uint64_t seed = check_test::CheckSeed();
  std::mt19937_64 rng(seed);
  check_test::ExpectCheckPasses(check, **ctx, &gemm, &rng, seed);
}

INSTANTIATE_TEST_SUITE_P(AllOps, CudaOpTest, ::testing::Range<size_t>(0, AllOpChecks().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           std::string n = AllOpChecks()[info.param].name;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace cuda
}  // namespace dgca
