#include "model/core/compute_cost.h"

#include <gtest/gtest.h>

namespace dgca {
namespace {

TEST(TrainFlopsPerSample, BertBaseAtSeq128IsAbout75Gflop) {
  auto cfg = ApplyPreset("bert-base", ModelConfig());
  ASSERT_TRUE(cfg.ok());
  // Layers: 12 x (2 x 128 x (4 x 768^2 + 2 x 768 x 3072) + 4 x 128^2 x 768)
  // = 12 x 1.86e9; head: 2 x 76.2 rows x (768^2 + 768 x 21128); x 3.
  const double per_layer = 2.0 * 128 * (4.0 * 768 * 768 + 2.0 * 768 * 3072) + 4.0 * 128 * 128 * 768;
  const double head = 2 * (60 * 1.27) * (768.0 * 768 + 768.0 * 21128);
  EXPECT_DOUBLE_EQ(TrainFlopsPerSample(*cfg, 128), 3 * (12 * per_layer + head));
  EXPECT_NEAR(TrainFlopsPerSample(*cfg, 128) / 1e9, 74.7, 0.1);
  // Longer sequences cost more than linearly (attention's T^2).
  EXPECT_GT(TrainFlopsPerSample(*cfg, 256), 2 * TrainFlopsPerSample(*cfg, 128));
}

TEST(LookupGpuPeak, NamesAsNvidiaSmiReportsThem) {
  struct Case {
    const char* name;
    const char* model;
  };
  for (const Case& c : {Case{"NVIDIA H100 80GB HBM3", "H100 SXM"}, Case{"NVIDIA H100 PCIe", "H100 PCIe"},
                        Case{"NVIDIA H200", "H200 SXM"}, Case{"NVIDIA A100-SXM4-80GB", "A100"},
                        Case{"NVIDIA A100-PCIE-40GB", "A100"}, Case{"NVIDIA A10G", "A10G"},
                        Case{"NVIDIA A10", "A10"}, Case{"NVIDIA L40S", "L40S"},
                        Case{"NVIDIA L4", "L4"}, Case{"NVIDIA GeForce RTX 4090", "RTX 4090"},
                        Case{"Tesla T4", "T4"}, Case{"Tesla V100-SXM2-16GB", "V100"}}) {
    SCOPED_TRACE(c.name);
    auto row = LookupGpuPeak(c.name);
    ASSERT_TRUE(row.has_value());
    EXPECT_EQ(row->model, c.model);
    EXPECT_GT(row->fp16, row->fp32);
    EXPECT_GT(row->memory_bandwidth, 0);
    EXPECT_FALSE(row->source.empty());
  }
  EXPECT_FALSE(LookupGpuPeak("NVIDIA Quantum Accelerator 9000").has_value());
  EXPECT_FALSE(LookupGpuPeak("").has_value());
  // No bf16 tensor cores before sm_80: bf16 falls back to fp16's figure.
  auto v100 = LookupGpuPeak("Tesla V100-SXM2-16GB");
  ASSERT_TRUE(v100.has_value());
  EXPECT_EQ(v100->For(Precision::kBf16), v100->fp16);
  auto h200 = LookupGpuPeak("NVIDIA H200");
  ASSERT_TRUE(h200.has_value());
  EXPECT_DOUBLE_EQ(h200->For(Precision::kBf16), 989e12);
  EXPECT_DOUBLE_EQ(h200->For(Precision::kFp32), 67e12);
}

TEST(CpuCorePeakFlops, ClockTimesLanesTimesTwoFmas) {
  EXPECT_DOUBLE_EQ(CpuCorePeakFlops(2100, 512), 2.1e9 * 16 * 4);
  EXPECT_DOUBLE_EQ(CpuCorePeakFlops(3000, 256), 3e9 * 8 * 4);
  EXPECT_EQ(CpuCorePeakFlops(0, 512), 0);
  EXPECT_EQ(CpuCorePeakFlops(2100, 0), 0);
}

}  // namespace
}  // namespace dgca
