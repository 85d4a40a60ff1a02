// The CPU's GEMM rate as the trainer gets it: cpu::Gemm (OpenBLAS, one
// single-threaded call per block, split on our thread pool: model/cpu/ops.h)
// at a shape of a Linear layer, timed. The planner's CPU compute prior
// (planner/compute_prior.h) divides a sample's FLOPs by it; the agent
// measures it once at start (`dgca-worker gemm-rate`, run by the topology
// probe: topology/probe.h) for one thread and for every CPU, because on
// small VMs the second vCPU often adds little (this project's build machine:
// 28 GFLOP/s on one thread, 34 on two).
//
// Thread-safety: MeasureGemmFlops may be called from any thread; it starts
// its own pool and changes OpenBLAS's process-wide thread setting
// (cpu::SetBlasThreads).
#ifndef DGCA_MODEL_CPU_GEMM_RATE_H_
#define DGCA_MODEL_CPU_GEMM_RATE_H_

namespace dgca {
namespace cpu {

// The side of the square GEMM timed: a Linear layer of a small BERT on a
// micro-batch of a few hundred tokens, large enough that call overhead is
// noise, small enough to time in a few milliseconds.
inline constexpr int kGemmRateSize = 384;

// The best FLOP/s of repeated [n, n] x [n, n]^T products on `threads`
// threads within about `seconds` (at least 3 repetitions).
double MeasureGemmFlops(int threads, double seconds);

}  // namespace cpu
}  // namespace dgca

#endif  // DGCA_MODEL_CPU_GEMM_RATE_H_
