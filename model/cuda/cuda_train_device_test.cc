// Tests of the GPU TrainDevice's attention choice (cuda_train_device.h,
// train.attention). The timer is injected, so each branch is taken on
// purpose whatever the device's real timings; the real timer's own test is
// cuda_ops_test's AttentionTuneTest. Skips without a visible device (runs on
// the CUDA emulator as cuda_train_device_test_emu).
#include "model/cuda/cuda_train_device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include "model/comm/communicator.h"
#include "model/core/config.h"
#include "model/cuda_check/check_test_util.h"
#include "model/cuda/cuda_context.h"

namespace dgca {
namespace cuda {
namespace {

// Rank 1 of two: Broadcast writes rank 0's value (the test's) into the
// device buffer, as NCCL would.
class RankOneOfTwo : public Communicator {
 public:
  explicit RankOneOfTwo(float rank0_value) : value_(rank0_value) {}
  int rank() const override { return 1; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "nccl"; }
  StatusOr<std::unique_ptr<CollectiveHandle>> StartAllReduce(float*, size_t, ReduceOp) override {
    return InternalError("not used by this test");
  }
  Status Broadcast(float* data, size_t count, int root) override {
    ++broadcasts;
    EXPECT_EQ(count, 1u);
    EXPECT_EQ(root, 0);
    return CudaStatus(cudaMemcpy(data, &value_, sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  Status Barrier() override { return OkStatus(); }
  double Now() const override { return 0; }
  int broadcasts = 0;

 private:
  float value_;
};

class AttentionChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!check_test::HaveDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
    auto ctx = CudaContext::Create(0);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    ctx_ = std::move(*ctx);
    spec_.model = ApplyPreset("tiny", ModelConfig()).value();  // hidden 128, 2 heads: head size 64
    spec_.model.vocab_size = 200;
    spec_.micro_batch = 2;
    spec_.seq_len = 32;
    spec_.precision = dgca::Precision::kBf16;
    spec_.attention = AttentionKernels::kAuto;
  }

  // A timer returning `result`, counting its calls and checking the shape it
  // is asked for is the spec's.
  AttentionTimer Timer(StatusOr<AttentionTiming> result) {
    return [this, result](const CudaContext&, DType t, int B, int L, int H, int nh) -> StatusOr<AttentionTiming> {
      ++calls_;
      EXPECT_EQ(t, DType::kBF16);
      EXPECT_EQ(B, spec_.micro_batch);
      EXPECT_EQ(L, spec_.seq_len);
      EXPECT_EQ(H, spec_.model.hidden);
      EXPECT_EQ(nh, spec_.model.heads);
      return result;
    };
  }

  static AttentionTiming Timing(double fused_ms, double gemm_ms) {
    AttentionTiming t;
    t.fused_fwd_ms = fused_ms / 2, t.fused_bwd_ms = fused_ms / 2;
    t.gemm_fwd_ms = gemm_ms / 2, t.gemm_bwd_ms = gemm_ms / 2;
    return t;
  }

  // The device line of a device built with `timer`, or the build's error.
  StatusOr<std::string> Build(const AttentionTimer& timer) {
    auto device = CudaTrainDeviceFactory(ctx_, timer)(spec_);
    if (!device.ok()) return device.status();
    return (*device)->Describe();
  }
  StatusOr<std::unique_ptr<TrainDevice>> Make(const AttentionTimer& timer) {
    return CudaTrainDeviceFactory(ctx_, timer)(spec_);
  }

  std::shared_ptr<const CudaContext> ctx_;
  TrainDeviceSpec spec_;
  int calls_ = 0;
};

TEST_F(AttentionChoiceTest, AutoKeepsTheFasterAndSaysWhy) {
  auto gemm = Build(Timer(Timing(3.0, 2.0)));  // GEMM a third faster
  ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
  EXPECT_NE(gemm->find("; attention auto: GEMM chosen (fused 3.000 ms vs GEMM 2.000 ms"), std::string::npos) << *gemm;
  EXPECT_EQ(gemm->find(", fused attention"), std::string::npos) << *gemm;  // the model really switched
  auto fused = Build(Timer(Timing(2.0, 3.0)));
  ASSERT_TRUE(fused.ok()) << fused.status().ToString();
  EXPECT_NE(fused->find("bf16, fused attention; attention auto: fused kept (fused 2.000 ms vs GEMM 3.000 ms"),
            std::string::npos)
      << *fused;
  auto tie = Build(Timer(Timing(3.0, 2.9)));  // within the 5% margin: fused
  ASSERT_TRUE(tie.ok()) << tie.status().ToString();
  EXPECT_NE(tie->find(", fused attention; attention auto: fused kept"), std::string::npos) << *tie;
  EXPECT_EQ(calls_, 3);
}

// A resumed auto run keeps the kernels its checkpoint's run ran, untimed,
// whatever a timing would say (the resumed steps are then the uninterrupted
// run's arithmetic).
TEST_F(AttentionChoiceTest, AResumedRunKeepsTheCheckpointsKernels) {
  spec_.resumed_attention = "gemm";
  auto gemm = Make(Timer(Timing(1.0, 9.0)));  // the fused far faster
  ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
  EXPECT_EQ((*gemm)->attention_kernels(), "gemm");
  EXPECT_NE((*gemm)->Describe().find("; attention auto: GEMM, as the resumed checkpoint's run (not timed)"),
            std::string::npos)
      << (*gemm)->Describe();
  spec_.resumed_attention = "fused";
  auto fused = Make(Timer(Timing(9.0, 1.0)));  // GEMM far faster
  ASSERT_TRUE(fused.ok()) << fused.status().ToString();
  EXPECT_EQ((*fused)->attention_kernels(), "fused");
  EXPECT_NE((*fused)->Describe().find(", fused attention; attention auto: fused, as the resumed checkpoint's run"),
            std::string::npos)
      << (*fused)->Describe();
  // Data parallel: a resumed rank still takes part in the one broadcast
  // (a rank that did not find the checkpoint timed and reaches it too) and
  // takes rank 0's kernels.
  RankOneOfTwo fused_at_rank0(1.0f);
  bool changed = false;
  ASSERT_TRUE((*gemm)->AdoptRankZeroChoices(&fused_at_rank0, &changed).ok());
  EXPECT_EQ(fused_at_rank0.broadcasts, 1);
  EXPECT_TRUE(changed);
  EXPECT_EQ((*gemm)->attention_kernels(), "fused");
  EXPECT_EQ(calls_, 0);
  // Deterministic wins over the checkpoint: the fused kernels, untimed.
  spec_.resumed_attention = "gemm";
  spec_.deterministic = true;
  auto det = Make(Timer(Timing(1.0, 9.0)));
  ASSERT_TRUE(det.ok()) << det.status().ToString();
  EXPECT_EQ((*det)->attention_kernels(), "fused");
  EXPECT_NE((*det)->Describe().find("attention auto: fused, not timed (deterministic run)"), std::string::npos)
      << (*det)->Describe();
  EXPECT_EQ(calls_, 0);
}

// A resumed run whose checkpoint ran the GEMM version, where that version's
// [B, nh, L, L] probabilities no longer fit: the fused kernels, and the
// device line says why. Emulator only: it takes a device memory size
// (DGCA_EMU_DEVICE_MEMORY), here exactly what the fused device holds.
TEST_F(AttentionChoiceTest, AResumedGemmThatDoesNotFitKeepsTheFused) {
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  if (std::string(prop.name).find("dgca CUDA emulator") == std::string::npos)
    GTEST_SKIP() << "needs the CUDA emulator's DGCA_EMU_DEVICE_MEMORY (a real device's memory cannot be shrunk)";
  size_t free_bytes = 0, total = 0;
  spec_.attention = AttentionKernels::kFused;
  {
    auto fused = Make(Timer(Timing(1.0, 9.0)));
    ASSERT_TRUE(fused.ok()) << fused.status().ToString();
    ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  }
  const size_t used = total - free_bytes;  // the context, the model with the fused kernels, AdamW
  ASSERT_EQ(setenv("DGCA_EMU_DEVICE_MEMORY", std::to_string(used).c_str(), 1), 0);
  spec_.attention = AttentionKernels::kAuto;
  spec_.resumed_attention = "gemm";
  auto device = Make(Timer(Timing(9.0, 1.0)));
  unsetenv("DGCA_EMU_DEVICE_MEMORY");
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  EXPECT_EQ((*device)->attention_kernels(), "fused");
  const std::string line = (*device)->Describe();
  EXPECT_NE(line.find("; attention auto: fused; the resumed checkpoint's run had the GEMM version, whose buffers "
                      "did not fit (RESOURCE_EXHAUSTED"),
            std::string::npos)
      << line;
  EXPECT_EQ(calls_, 0);
}

TEST_F(AttentionChoiceTest, FusedOrGemmAskedForOrDeterministicIsNotTimed) {
  spec_.attention = AttentionKernels::kGemm;
  auto gemm = Build(Timer(Timing(1.0, 9.0)));
  ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
  EXPECT_EQ(gemm->find("fused attention"), std::string::npos) << *gemm;
  EXPECT_EQ(gemm->find("attention auto"), std::string::npos) << *gemm;
  spec_.attention = AttentionKernels::kFused;
  auto fused = Build(Timer(Timing(9.0, 1.0)));
  ASSERT_TRUE(fused.ok()) << fused.status().ToString();
  EXPECT_NE(fused->find(", fused attention"), std::string::npos) << *fused;
  EXPECT_EQ(fused->find("attention auto"), std::string::npos) << *fused;
  spec_.attention = AttentionKernels::kAuto;
  spec_.deterministic = true;  // a timing must not change a reproducible run
  auto det = Build(Timer(Timing(9.0, 1.0)));
  ASSERT_TRUE(det.ok()) << det.status().ToString();
  EXPECT_NE(det->find(", fused attention, deterministic; attention auto: fused, not timed"), std::string::npos)
      << *det;
  spec_.deterministic = false;
  spec_.precision = dgca::Precision::kFp32;  // no fused kernels: nothing to time
  auto fp32 = Build(Timer(Timing(9.0, 1.0)));
  ASSERT_TRUE(fp32.ok()) << fp32.status().ToString();
  EXPECT_EQ(fp32->find("attention"), std::string::npos) << *fp32;
  EXPECT_EQ(calls_, 0);
}

TEST_F(AttentionChoiceTest, OutOfMemoryKeepsTheFusedOtherErrorsFailTheBuild) {
  auto oom = Build(Timer(ResourceExhaustedError("cudaMalloc 9 bytes: cudaErrorMemoryAllocation")));
  ASSERT_TRUE(oom.ok()) << oom.status().ToString();
  EXPECT_NE(oom->find(", fused attention; attention auto: fused, the timing failed (RESOURCE_EXHAUSTED"),
            std::string::npos)
      << *oom;
  auto broken = Build(Timer(InternalError("FlashForwardKernel: cudaErrorIllegalAddress")));
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), StatusCode::kInternal);
  EXPECT_NE(broken.status().message().find("timing the attention kernels: FlashForwardKernel"), std::string::npos)
      << broken.status().ToString();
}

// Data parallel: ranks time a little differently; every rank takes rank 0's
// choice (one flag broadcast), so all run the same kernels.
TEST_F(AttentionChoiceTest, RanksAdoptRankZerosTimedChoice) {
  auto device = Make(Timer(Timing(3.0, 2.0)));  // this rank timed GEMM faster
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  ASSERT_EQ((*device)->Describe().find(", fused attention"), std::string::npos);
  EXPECT_EQ((*device)->attention_kernels(), "gemm");  // what every step reports
  RankOneOfTwo fused_at_rank0(1.0f);
  bool changed = false;
  ASSERT_TRUE((*device)->AdoptRankZeroChoices(&fused_at_rank0, &changed).ok());
  EXPECT_TRUE(changed);
  EXPECT_EQ(fused_at_rank0.broadcasts, 1);
  const std::string line = (*device)->Describe();
  EXPECT_NE(line.find(", fused attention; attention auto: GEMM chosen"), std::string::npos) << line;
  EXPECT_NE(line.find("; rank 0 kept the fused kernels, adopted"), std::string::npos) << line;
  EXPECT_EQ((*device)->attention_kernels(), "fused");
  // Agreeing already: nothing changes.
  RankOneOfTwo fused_again(1.0f);
  ASSERT_TRUE((*device)->AdoptRankZeroChoices(&fused_again, &changed).ok());
  EXPECT_FALSE(changed);
  // Untimed (deterministic): nothing to agree on, no collective.
  spec_.deterministic = true;
  auto det = Make(Timer(Timing(3.0, 2.0)));
  ASSERT_TRUE(det.ok()) << det.status().ToString();
  RankOneOfTwo gemm_at_rank0(0.0f);
  ASSERT_TRUE((*det)->AdoptRankZeroChoices(&gemm_at_rank0, &changed).ok());
  EXPECT_FALSE(changed);
  EXPECT_EQ(gemm_at_rank0.broadcasts, 0);
  EXPECT_NE((*det)->Describe().find(", fused attention"), std::string::npos);
  // This rank's timing ran out of memory, rank 0's did not: it still takes
  // part in the broadcast (a collective one rank skips hangs the others)
  // and takes rank 0's choice.
  spec_.deterministic = false;
  auto oom = Make(Timer(ResourceExhaustedError("cudaMalloc: cudaErrorMemoryAllocation")));
  ASSERT_TRUE(oom.ok()) << oom.status().ToString();
  RankOneOfTwo gemm_again(0.0f);
  ASSERT_TRUE((*oom)->AdoptRankZeroChoices(&gemm_again, &changed).ok());
  EXPECT_EQ(gemm_again.broadcasts, 1);
  EXPECT_TRUE(changed);
  EXPECT_EQ((*oom)->Describe().find(", fused attention"), std::string::npos) << (*oom)->Describe();
  EXPECT_NE((*oom)->Describe().find("; rank 0 kept GEMM, adopted"), std::string::npos) << (*oom)->Describe();
}

}  // namespace
}  // namespace cuda
}  // namespace dgca
