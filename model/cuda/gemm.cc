#include "model/cuda/gemm.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace dgca {
namespace cuda {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

namespace {

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}
int64_t TypeBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// The largest power of two <= 256 that divides the address (cuBLASLt's
// heuristic assumes 256-byte alignment unless told; offset pointers into
// qkv or strided batches are less aligned).
int Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

}  // namespace

struct GemmRunner::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  bool fallback = false;  // no cuBLASLt algorithm: FallbackGemm
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

GemmRunner::GemmRunner(const CudaContext* ctx) : ctx_(ctx) {}
GemmRunner::~GemmRunner() = default;

StatusOr<GemmRunner::Plan*> GemmRunner::GetPlan(const GemmArgs& g, const Key& key, int alignment) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  if (force_fallback_) {
    plan->fallback = true;
    ++fallback_plans_;
    Plan* p = plan.get();
    plans_.emplace(key, std::move(plan));
    return p;
  }
  DGCA_RETURN_IF_ERROR(CublasStatus(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                    "cublasLtMatmulDescCreate"));
  // Column-major view: D^T[N,M] = op(B)^T[N,K] op(A)^T[K,M]. cuBLASLt's "A"
  // is our B: stored row-major [K,N] (= col-major [N,K], ld ldb) when not
  // transposed, so no transpose; [N,K] row-major when trans_b (= col-major
  // [K,N]) needs a transpose.
  cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  DGCA_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "TRANSA"));
  DGCA_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "TRANSB"));
  if (g.bias != nullptr) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    DGCA_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "EPILOGUE"));
    int32_t bt = CudaType(g.out_type);
    DGCA_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)),
        "BIAS_DATA_TYPE"));
    DGCA_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)),
        "BIAS_POINTER"));
  }
  const cudaDataType_t it_ = CudaType(g.in_type), ot = CudaType(g.out_type);
  // cuBLASLt A (our B): rows x cols as stored col-major.
  const uint64_t a_rows = g.trans_b ? g.K : g.N, a_cols = g.trans_b ? g.N : g.K;
  const uint64_t b_rows = g.trans_a ? g.M : g.K, b_cols = g.trans_a ? g.K : g.M;
  DGCA_RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&plan->a, it_, a_rows, a_cols, g.ldb), "layout A"));
  DGCA_RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&plan->b, it_, b_rows, b_cols, g.lda), "layout B"));
  DGCA_RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&plan->c, ot, g.N, g.M, g.ldc), "layout C"));
  if (g.batch > 1) {
    const int32_t bc = g.batch;
    const int64_t sa = g.stride_b, sb = g.stride_a, sc = g.stride_c;
    for (auto [layout, stride] : {std::pair{plan->a, sa}, std::pair{plan->b, sb}, std::pair{plan->c, sc}}) {
      DGCA_RETURN_IF_ERROR(CublasStatus(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)), "BATCH_COUNT"));
      DGCA_RETURN_IF_ERROR(CublasStatus(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
          "STRIDED_BATCH_OFFSET"));
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  DGCA_RETURN_IF_ERROR(CublasStatus(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
  uint64_t ws = ctx_->workspace_bytes();
  uint32_t al = static_cast<uint32_t>(alignment);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al));
  }
  // A few candidates: the first whose state is SUCCESS is used. No
  // algorithm at all is reported either as 0 results or as NOT_SUPPORTED
  // (real cuBLASLt does the latter, e.g. for operands it cannot align; so
  // does PyTorch's check): both fall back.
  constexpr int kCandidates = 4;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int returned = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(ctx_->lt(), plan->op, plan->a, plan->b, plan->c, plan->c, pref,
                                        kCandidates, results, &returned);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    returned = 0;
  } else {
    DGCA_RETURN_IF_ERROR(CublasStatus(st, "cublasLtMatmulAlgoGetHeuristic"));
  }
  const cublasLtMatmulHeuristicResult_t* chosen = nullptr;
  for (int i = 0; i < returned && chosen == nullptr; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) chosen = &results[i];
  if (chosen == nullptr) {
    plan->fallback = true;  // correct but slow; counted for the benchmark's report
    ++fallback_plans_;
  } else {
    plan->algo = chosen->algo;
  }
  Plan* p = plan.get();
  plans_.emplace(key, std::move(plan));
  return p;
}

Status GemmRunner::Run(const GemmArgs& g) {
  if (g.M <= 0 || g.N <= 0 || g.K <= 0 || g.batch <= 0) {
    return InvalidArgumentError("GEMM sizes must be positive: M=" + std::to_string(g.M) + " N=" +
                                std::to_string(g.N) + " K=" + std::to_string(g.K) + " batch=" +
                                std::to_string(g.batch));
  }
  if (g.out_type != g.in_type && g.out_type != DType::kF32) {
    return InvalidArgumentError(std::string("GEMM output type must be the input type or fp32, got ") +
                                DTypeName(g.in_type) + "->" + DTypeName(g.out_type));
  }
  const int64_t a_cols = g.trans_a ? g.M : g.K, b_cols = g.trans_b ? g.K : g.N;
  if (g.lda < a_cols || g.ldb < b_cols || g.ldc < g.N) {
    return InvalidArgumentError("GEMM leading dimensions too small: lda=" + std::to_string(g.lda) + " (>= " +
                                std::to_string(a_cols) + "), ldb=" + std::to_string(g.ldb) + " (>= " +
                                std::to_string(b_cols) + "), ldc=" + std::to_string(g.ldc) + " (>= " +
                                std::to_string(g.N) + ")");
  }
  // cuBLASLt's alignment preferences cover A, B, C and D, not the bias,
  // which its epilogue kernels may read with 16-byte loads: a misaligned
  // bias would fault the context, so it is refused (callers add such a bias
  // themselves, as CudaBert::Linear does).
  if (g.bias != nullptr && Alignment(g.bias) < 16) {
    return InvalidArgumentError("GEMM bias must be 16-byte aligned for cuBLASLt's bias epilogue, got " +
                                std::to_string(Alignment(g.bias)) + "-byte alignment; add it separately");
  }
  // The least-aligned operand (named for the under-aligned note).
  int al = 256;
  const char* least = "";
  auto take = [&](const char* name, int a) {
    if (a < al) al = a, least = name;
  };
  take("A", Alignment(g.A));
  take("B", Alignment(g.B));
  take("C", Alignment(g.C));
  if (g.C_in != nullptr) take("C_in", Alignment(g.C_in));
  // Strided batches move the pointers: their alignment counts too.
  if (g.batch > 1) {
    auto stride = [](int64_t s) { return Alignment(reinterpret_cast<const void*>(static_cast<uintptr_t>(s == 0 ? 256 : s))); };
    take("A's batch stride", stride(g.stride_a * TypeBytes(g.in_type)));
    take("B's batch stride", stride(g.stride_b * TypeBytes(g.in_type)));
    take("C's batch stride", stride(g.stride_c * TypeBytes(g.out_type)));
  }
  const Key key{static_cast<int>(g.in_type), static_cast<int>(g.out_type), g.trans_a, g.trans_b, g.M, g.N, g.K,
                g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b, g.stride_c, g.bias != nullptr, al};
  const size_t plans_before = plans_.size();
  DGCA_ASSIGN_OR_RETURN(Plan * plan, GetPlan(g, key, al));
  if (plans_.size() > plans_before && al < 16) {
    ++underaligned_plans_;
    if (underaligned_notes_.size() < kMaxUnderalignedNotes)
      underaligned_notes_.push_back(std::string(DTypeName(g.in_type)) + "->" + DTypeName(g.out_type) +
                                    " M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) + " K=" +
                                    std::to_string(g.K) + (g.batch > 1 ? " batch=" + std::to_string(g.batch) : "") +
                                    ": " + least + " " + std::to_string(al) + "-byte aligned");
  }
  if (profiler_ != nullptr) DGCA_RETURN_IF_ERROR(profiler_->BeginGemm());
  Status s = Enqueue(g, plan);
  if (profiler_ != nullptr && s.ok()) s = profiler_->EndGemm();
  return s;
}

// The plan's GEMM on the context's stream (the bias pointer is set per call:
// the cached descriptor outlives the arrays of any one call).
Status GemmRunner::Enqueue(const GemmArgs& g, Plan* plan) {
  if (plan->fallback) return FallbackGemm(ctx_->stream(), g);
  if (g.bias != nullptr) {
    DGCA_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)),
        "BIAS_POINTER"));
  }
  const void* c_in = g.C_in != nullptr ? g.C_in : g.C;
  const cublasStatus_t st =
      cublasLtMatmul(ctx_->lt(), plan->op, &g.alpha, g.B, plan->a, g.A, plan->b, &g.beta, c_in, plan->c, g.C,
                     plan->c, &plan->algo, ctx_->workspace(), ctx_->workspace_bytes(), ctx_->stream());
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The heuristic's algorithm refused the call (nothing was enqueued):
    // this shape falls back from now on, counted like a heuristic miss.
    plan->fallback = true;
    ++fallback_plans_;
    return FallbackGemm(ctx_->stream(), g);
  }
  return CublasStatus(st, "cublasLtMatmul");
}

}  // namespace cuda
}  // namespace dgca
