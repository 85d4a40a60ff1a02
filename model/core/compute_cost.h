// What one training sample costs in arithmetic, and what a device can do at
// most: the two halves of the planner's compute prior (planner/
// compute_prior.h) and of the MFU that model/tools/dgca_bench.cc reports.
//
// Thread-safety: pure functions over constant tables.
#ifndef DGCA_MODEL_CORE_COMPUTE_COST_H_
#define DGCA_MODEL_CORE_COMPUTE_COST_H_

#include <optional>
#include <string>

#include "model/core/config.h"

namespace dgca {

// Training FLOPs of one sample of `seq_len` tokens, forward + backward
// (3x forward): the encoder's GEMMs and attention, and the MLM head (dense
// + vocabulary projection) on the target slots, (seq_len - 8) / 2, plus the
// MFT rows, 0.27 of them (the ReLM batches' share of masked source
// characters). The prompt encoder and the candidate head are left out
// (about 0.2 GFLOP of bert-base's 75 GFLOP at seq_len 128).
// bench/torch_dgca.py flops_per_sample is the same formula, so the MFU of
// PyTorch and of dgca compare.
double TrainFlopsPerSample(const ModelConfig& cfg, int seq_len);

// Dense peak FLOP/s of one GPU, from its vendor's datasheet: tensor-core
// bf16 and fp16 with fp32 accumulation (what cuBLASLt and the fused
// attention use; a GeForce card's half of its fp16-accumulate figure), and
// fp32 on the CUDA cores (no TF32); and the memory's bandwidth.
struct GpuPeak {
  std::string model;   // the table's row, e.g. "RTX 4090"
  double bf16 = 0;     // FLOP/s; 0 = no fast bf16 (before sm_80)
  double fp16 = 0;
  double fp32 = 0;
  double memory_bandwidth = 0;  // bytes/s
  std::string source;  // the datasheet
  // The figure for `precision`; bf16 falls back to fp16's where a GPU has
  // no bf16 tensor cores (the planner plans fp16 there anyway).
  double For(Precision precision) const;
};

// The row for a GPU name as nvidia-smi or NVML report it ("NVIDIA GeForce
// RTX 4090", "NVIDIA H100 80GB HBM3"); nullopt for a GPU the table lacks.
std::optional<GpuPeak> LookupGpuPeak(const std::string& name);

// Peak fp32 FLOP/s of one CPU core from what /proc/cpuinfo says: clock x
// SIMD lanes (vector_bits / 32) x 2 (fused multiply-add) x 2 (FMA ports,
// as on the server cores of the last decade). 0 when either is unknown.
double CpuCorePeakFlops(double clock_mhz, int vector_bits);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_COMPUTE_COST_H_
