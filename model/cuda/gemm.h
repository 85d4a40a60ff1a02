// cuBLASLt GEMM with the row-major semantics of cpu::Gemm (model/cpu/ops.h):
//   C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C  (+ bias[N] per row)
// A stored [K,M] when trans_a, B stored [N,K] when trans_b; lda/ldb/ldc are
// row strides (elements). Inputs bf16, fp16 or fp32; output the input type or
// fp32; accumulation always fp32 (CUBLAS_COMPUTE_32F: fp32 inputs are NOT
// rounded to TF32, so fp32 matches the CPU within 1e-4).
//
// With C_in set, the beta term reads C_in instead of C (cuBLASLt's
// separate C and D): out = op(A) op(B) + bias + beta * C_in, written to C,
// e.g. a residual added without copying it into the output first. C_in has
// C's shape, type and ldc.
//
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so the
// call passes B as cuBLASLt's A and A as its B with m = N, n = M. The bias
// epilogue (CUBLASLT_EPILOGUE_BIAS) adds a vector of length "rows of D" =
// N here: one value per output column, as Linear's bias. Bias has the
// output type and must be 16-byte aligned (INVALID_ARGUMENT otherwise):
// cuBLASLt's alignment preferences do not cover it, and its epilogue
// kernels may read it with 16-byte loads.
//
// Batched: `batch` > 1 with element strides between consecutive matrices
// (stride_a/b/c); the bias is shared.
//
// Descriptors, layouts and the heuristic's algorithm are cached per shape
// key (types, transposes, sizes, strides, batch, epilogue, pointer
// alignment); the first call of a shape pays cublasLtMatmulAlgoGetHeuristic.
//
// Thread-safety: a GemmRunner is used by one thread at a time (its cache is
// unsynchronized), with one CudaContext.
#ifndef DGCA_MODEL_CUDA_GEMM_H_
#define DGCA_MODEL_CUDA_GEMM_H_

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/dtype.h"
#include "model/cuda/step_profiler.h"

namespace dgca {
namespace cuda {


struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* C = nullptr;
  int64_t ldc = 0;
  const void* C_in = nullptr;  // beta's operand when not C (null: C)
  DType in_type = DType::kF32;   // A and B
  DType out_type = DType::kF32;  // C (and bias): in_type or kF32
  const void* bias = nullptr;    // [N] or null
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

class GemmRunner {
 public:
  // ctx is not owned and must outlive the runner.
  explicit GemmRunner(const CudaContext* ctx);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Enqueues the GEMM on the context's stream. INVALID_ARGUMENT for bad
  // shapes/types; INTERNAL when cuBLASLt fails. When cuBLASLt has no
  // algorithm for a shape (say bf16 operands only 2-byte aligned): its
  // heuristic returns none or NOT_SUPPORTED, or cublasLtMatmul refuses with
  // NOT_SUPPORTED; the plan then falls back to FallbackGemm (correct, slow)
  // and counts it.
  Status Run(const GemmArgs& a);

  // Number of cached plans (for tests), and how many of them fell back.
  size_t cached_plans() const { return plans_.size(); }
  size_t fallback_plans() const { return fallback_plans_; }
  // Plans whose operands (A, B, C, C_in or a batch stride) were less than
  // 16-byte aligned: cuBLASLt then has no tensor-core kernel that uses
  // 16-byte loads, and picks a slower one (or none: the fallback). One line
  // each, e.g. "bf16->bf16 M=512 N=768 K=768: B 2-byte aligned", for the
  // first kMaxUnderalignedNotes plans; the count is underaligned_plans().
  static constexpr size_t kMaxUnderalignedNotes = 8;
  size_t underaligned_plans() const { return underaligned_plans_; }
  const std::vector<std::string>& underaligned_notes() const { return underaligned_notes_; }
  // Tests: every new plan uses FallbackGemm.
  void set_force_fallback(bool f) { force_fallback_ = f; }
  // Brackets every GEMM with profiler->BeginGemm/EndGemm (null: off). Not
  // owned.
  void set_profiler(StepProfiler* profiler) { profiler_ = profiler; }

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int, int, int, int, int64_t, int64_t, int64_t, int,
                         int64_t, int64_t, int64_t, bool, int>;
  StatusOr<Plan*> GetPlan(const GemmArgs& a, const Key& key, int alignment);
  Status Enqueue(const GemmArgs& a, Plan* plan);

  const CudaContext* ctx_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  size_t fallback_plans_ = 0;
  size_t underaligned_plans_ = 0;
  std::vector<std::string> underaligned_notes_;
  bool force_fallback_ = false;
  StepProfiler* profiler_ = nullptr;
};

// A shared-memory tiled GEMM with GemmArgs' semantics (any alignment, any
// leading dimension; fp32 accumulation), enqueued on `stream`. GemmRunner's
// fallback; model/cuda/gemm_fallback.cu.
Status FallbackGemm(cudaStream_t stream, const GemmArgs& a);

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_GEMM_H_
