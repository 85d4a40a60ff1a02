// Training FLOPs per sample and the devices' peaks (compute_cost.h).
#include "model/core/compute_cost.h"

#include <vector>

namespace dgca {
namespace {

// One row per GPU model: the substrings its reported name must contain
// (all of them), the row's name, and the dense figures in TFLOP/s. Earlier
// rows win, so a variant (H100 PCIe) comes before its family (H100). The
// A100 row takes the 40 GB part's bandwidth (the 80 GB part has 2.0 TB/s).
struct Row {
  std::vector<const char*> has;
  const char* model;
  double bf16, fp16, fp32;  // TFLOP/s
  double bandwidth;         // TB/s, the memory's
  const char* source;
};

const std::vector<Row>& Table() {
  static const auto* rows = new std::vector<Row>{
      {{"H100", "PCIe"}, "H100 PCIe", 756, 756, 51, 2.0, "NVIDIA H100 datasheet (PCIe column, dense)"},
      {{"H100", "NVL"}, "H100 NVL", 835, 835, 60, 3.9, "NVIDIA H100 datasheet (NVL column, dense)"},
      {{"H200", "NVL"}, "H200 NVL", 835, 835, 60, 4.8, "NVIDIA H200 datasheet (NVL column, dense)"},
      {{"H100"}, "H100 SXM", 989, 989, 67, 3.35, "NVIDIA H100 datasheet (SXM column, dense)"},
      {{"H200"}, "H200 SXM", 989, 989, 67, 4.8, "NVIDIA H200 datasheet (SXM column, dense)"},
      {{"GH200"}, "GH200", 989, 989, 67, 4.0, "NVIDIA GH200 datasheet (dense)"},
      {{"B200"}, "B200", 2250, 2250, 75, 8.0, "NVIDIA HGX B200 datasheet (per GPU, dense)"},
      {{"A100"}, "A100", 312, 312, 19.5, 1.555, "NVIDIA A100 datasheet (dense)"},
      {{"A800"}, "A800", 312, 312, 19.5, 2.0, "NVIDIA A800 datasheet (dense)"},
      {{"A10G"}, "A10G", 70, 70, 31.2, 0.6, "AWS EC2 G5 documentation (dense)"},
      {{"A10"}, "A10", 125, 125, 31.2, 0.6, "NVIDIA A10 datasheet (dense)"},
      {{"L40S"}, "L40S", 362, 362, 91.6, 0.864, "NVIDIA L40S datasheet (dense)"},
      {{"L40"}, "L40", 181, 181, 90.5, 0.864, "NVIDIA L40 datasheet (dense)"},
      {{"L4"}, "L4", 121, 121, 30.3, 0.3, "NVIDIA L4 datasheet (dense)"},
      {{"RTX 6000 Ada"}, "RTX 6000 Ada", 364, 364, 91.1, 0.96, "NVIDIA RTX 6000 Ada datasheet (dense)"},
      {{"A6000"}, "RTX A6000", 155, 155, 38.7, 0.768, "NVIDIA RTX A6000 datasheet (dense)"},
      {{"RTX 4090"}, "RTX 4090", 165, 165, 82.6, 1.008,
       "NVIDIA Ada Lovelace architecture whitepaper (fp16/bf16 tensor with fp32 accumulate)"},
      {{"RTX 4080"}, "RTX 4080", 97.5, 97.5, 48.7, 0.717,
       "NVIDIA Ada Lovelace architecture whitepaper (fp16/bf16 tensor with fp32 accumulate)"},
      {{"RTX 3090"}, "RTX 3090", 71, 71, 35.6, 0.936,
       "NVIDIA Ampere GA102 whitepaper (fp16/bf16 tensor with fp32 accumulate)"},
      {{"V100"}, "V100", 0, 125, 15.7, 0.9, "NVIDIA V100 datasheet (SXM2; no bf16)"},
      {{"T4"}, "T4", 0, 65, 8.1, 0.32, "NVIDIA T4 datasheet (no bf16)"},
  };
  return *rows;
}

}  // namespace

double TrainFlopsPerSample(const ModelConfig& c, int seq_len) {
  const double H = c.hidden, F = c.ffn, T = seq_len, V = c.vocab_size;
  // Per layer: Q, K, V, output projections (4 H^2) and the FFN (2 H F) per
  // token, 2 FLOPs per multiply-add; scores and context 2 x T^2 H.
  const double per_layer = 2 * T * (4 * H * H + 2 * H * F) + 2 * 2 * T * T * H;
  const double head_rows = ((seq_len - 8) / 2) * (1 + 0.27);
  const double head = 2 * head_rows * (H * H + H * V);
  return 3 * (c.layers * per_layer + head);
}

double GpuPeak::For(Precision precision) const {
  switch (precision) {
    case Precision::kBf16:
      return bf16 > 0 ? bf16 : fp16;
    case Precision::kFp16:
      return fp16;
    case Precision::kFp32:
      return fp32;
  }
  return fp32;
}

std::optional<GpuPeak> LookupGpuPeak(const std::string& name) {
  for (const Row& r : Table()) {
    bool all = true;
    for (const char* s : r.has) all &= name.find(s) != std::string::npos;
    if (!all) continue;
    GpuPeak p;
    p.model = r.model;
    p.bf16 = r.bf16 * 1e12;
    p.fp16 = r.fp16 * 1e12;
    p.fp32 = r.fp32 * 1e12;
    p.memory_bandwidth = r.bandwidth * 1e12;
    p.source = r.source;
    return p;
  }
  return std::nullopt;
}

double CpuCorePeakFlops(double clock_mhz, int vector_bits) {
  if (clock_mhz <= 0 || vector_bits <= 0) return 0;
  return clock_mhz * 1e6 * (vector_bits / 32.0) * 2 * 2;
}

}  // namespace dgca
