// The emulator's cuBLASLt (emulator.h): the entry points model/cuda/gemm.cc
// calls, with cuBLASLt's documented semantics (column-major layouts,
// D = alpha * op(A) op(B) + beta * C, CUBLASLT_EPILOGUE_BIAS adding a
// packed vector of length rows(D) to every column, strided batches, fp32
// compute, output rounded to D's type), checked as strictly as the
// documentation allows: layout shapes must agree with the transposes,
// leading dimensions cover the rows, every operand's whole extent lies in
// one device allocation, the pointers are at least as aligned as the
// preference the algorithm was chosen with promised. The heuristic always
// offers one algorithm (real availability is a GPU question).
//
// The matmul runs in stream order like every emulated kernel; alpha, beta
// (host pointer mode) and the descriptor attributes are read at the call.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "model/cuda_emu/internal.h"

namespace {

namespace emu = dgca::cuda::emu;

struct Desc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;
  int64_t bias_batch_stride = 0;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
};
struct Layout {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
  int32_t order = CUBLASLT_ORDER_COL;
};
struct Pref {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};
// What cublasLtMatmulAlgo_t::data carries here.
struct Algo {
  uint64_t magic;
  uint32_t align[4];
};
constexpr uint64_t kAlgoMagic = 0x64676361656d75ull;  // "dgcaemu"

Desc* D(cublasLtMatmulDesc_t d) { return reinterpret_cast<Desc*>(d); }
Layout* L(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l); }
Pref* P(cublasLtMatmulPreference_t p) { return reinterpret_cast<Pref*>(p); }

cublasStatus_t Fail(cublasStatus_t st, const std::string& msg) {
  emu::ApiError(cudaErrorInvalidValue, "cuBLASLt (emulated): " + msg);
  return st;
}

template <typename T>
cublasStatus_t Set(T* field, const void* buf, size_t size, const char* name) {
  if (buf == nullptr || size != sizeof(T)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, std::string(name) + ": sizeInBytes " + std::to_string(size) +
                                                 " (expected " + std::to_string(sizeof(T)) + ")");
  }
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

size_t TypeBytes(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF: return 2;
    case CUDA_R_16F: return 2;
    default: return 0;
  }
}
float Load(cudaDataType_t t, const void* p, int64_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return __half2float(static_cast<const __half*>(p)[i]);
  }
}
void Store(cudaDataType_t t, void* p, int64_t i, float v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = v; break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v); break;
    default: static_cast<__half*>(p)[i] = __float2half(v); break;
  }
}

// Bytes spanned by a layout's matrices.
uint64_t ExtentBytes(const Layout& l) {
  const uint64_t last = uint64_t(l.batch - 1) * uint64_t(l.stride) + (l.cols - 1) * uint64_t(l.ld) + l.rows;
  return last * TypeBytes(l.type);
}

int Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

std::string Shape(const char* name, const Layout& l) {
  return std::string(name) + " " + std::to_string(l.rows) + "x" + std::to_string(l.cols) + " ld " +
         std::to_string(l.ld) + (l.batch > 1 ? " batch " + std::to_string(l.batch) + " stride " + std::to_string(l.stride) : "");
}

// Checks the problem; fills m, n, k. Empty string when valid.
std::string Validate(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl, uint64_t* m,
                     uint64_t* n, uint64_t* k) {
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F) return "only CUBLAS_COMPUTE_32F with fp32 scale is emulated";
  if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST) return "only host pointer mode is emulated";
  if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && d.epilogue != CUBLASLT_EPILOGUE_BIAS)
    return "epilogue " + std::to_string(d.epilogue) + " is not emulated (DEFAULT and BIAS are)";
  for (const Layout* l : {&a, &b, &c, &dl}) {
    if (TypeBytes(l->type) == 0) return "a layout type other than fp32/bf16/fp16";
    if (l->order != CUBLASLT_ORDER_COL) return "only column-major layouts are emulated";
    if (l->rows == 0 || l->cols == 0) return "a layout with zero rows or columns";
    if (l->ld < int64_t(l->rows)) return Shape("layout", *l) + ": ld is smaller than the row count";
  }
  if (a.type != b.type) return "A and B types differ";
  if (c.type != dl.type || c.rows != dl.rows || c.cols != dl.cols) return "C and D layouts differ";
  *m = dl.rows;
  *n = dl.cols;
  const uint64_t a_rows = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols, a_cols = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t b_rows = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols, b_cols = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  if (a_rows != *m || b_cols != *n || a_cols != b_rows) {
    return "shapes disagree: op(A) is " + std::to_string(a_rows) + "x" + std::to_string(a_cols) + ", op(B) " +
           std::to_string(b_rows) + "x" + std::to_string(b_cols) + ", D " + std::to_string(*m) + "x" +
           std::to_string(*n) + " (" + Shape("A", a) + "; " + Shape("B", b) + "; " + Shape("D", dl) + ")";
  }
  *k = a_cols;
  if (a.batch != dl.batch || b.batch != dl.batch || c.batch != dl.batch) return "batch counts differ";
  if (d.epilogue == CUBLASLT_EPILOGUE_BIAS) {
    const int32_t bt = d.bias_type == -1 ? int32_t(dl.type) : d.bias_type;
    if (bt != int32_t(dl.type)) return "bias type differs from D's type (allowed only for fp8/IMMA kernels)";
  }
  return "";
}

}  // namespace

// ====================================================================== API
const char* cublasLtGetStatusName(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_(emulated other)";
  }
}
const char* cublasLtGetStatusString(cublasStatus_t st) { return cublasLtGetStatusName(st); }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  static char handle;
  *h = reinterpret_cast<cublasLtHandle_t>(&handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  auto* desc = new Desc;
  desc->compute = compute;
  desc->scale = scale;
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete D(d);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  Desc* x = D(d);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return Set(&x->trans_a, buf, size, "TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB: return Set(&x->trans_b, buf, size, "TRANSB");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return Set(&x->epilogue, buf, size, "EPILOGUE");
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return Set(&x->bias, buf, size, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return Set(&x->bias_type, buf, size, "BIAS_DATA_TYPE");
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return Set(&x->bias_batch_stride, buf, size, "BIAS_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return Set(&x->pointer_mode, buf, size, "POINTER_MODE");
    default: return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "matmul descriptor attribute " + std::to_string(int(attr)) + " is not emulated");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  auto* x = new Layout;
  x->type = type;
  x->rows = rows;
  x->cols = cols;
  x->ld = ld;
  *l = reinterpret_cast<cublasLtMatrixLayout_t>(x);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete L(l);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  Layout* x = L(l);
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return Set(&x->batch, buf, size, "BATCH_COUNT");
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return Set(&x->stride, buf, size, "STRIDED_BATCH_OFFSET");
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return Set(&x->order, buf, size, "ORDER");
    default: return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "layout attribute " + std::to_string(int(attr)) + " is not emulated");
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = reinterpret_cast<cublasLtMatmulPreference_t>(new Pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete P(p);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  Pref* x = P(p);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return Set(&x->workspace, buf, size, "MAX_WORKSPACE_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return Set(&x->align[0], buf, size, "MIN_ALIGNMENT_A_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return Set(&x->align[1], buf, size, "MIN_ALIGNMENT_B_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return Set(&x->align[2], buf, size, "MIN_ALIGNMENT_C_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return Set(&x->align[3], buf, size, "MIN_ALIGNMENT_D_BYTES");
    default: return Fail(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute " + std::to_string(int(attr)) + " is not emulated");
  }
}

// DGCA_EMU_CUBLASLT_REFUSE=heuristic|matmul: answer as real cuBLASLt does
// for a shape it has no algorithm for (NOT_SUPPORTED from the heuristic, or
// from cublasLtMatmul itself), so GemmRunner's fallback is tested.
static bool Refuses(const char* where) {
  const char* v = std::getenv("DGCA_EMU_CUBLASLT_REFUSE");
  return v != nullptr && std::strcmp(v, where) == 0;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  *returned = 0;
  uint64_t m, n, k;
  const std::string bad = Validate(*D(op), *L(a), *L(b), *L(c), *L(d), &m, &n, &k);
  if (!bad.empty()) return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: " + bad);
  if (requested < 1) return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: requestedAlgoCount < 1");
  if (Refuses("heuristic")) return CUBLAS_STATUS_NOT_SUPPORTED;
  std::memset(&results[0], 0, sizeof(results[0]));
  Algo algo{kAlgoMagic, {}};
  std::memcpy(algo.align, P(pref)->align, sizeof(algo.align));
  static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t), "Algo must fit cublasLtMatmulAlgo_t");
  std::memcpy(&results[0].algo, &algo, sizeof(algo));
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t adesc, const void* B, cublasLtMatrixLayout_t bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t cdesc, void* Dp,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t* algo, void*, size_t,
                              cudaStream_t stream) {
  const Desc d = *D(op);
  const Layout a = *L(adesc), b = *L(bdesc), c = *L(cdesc), dl = *L(ddesc);
  uint64_t m, n, k;
  const std::string bad = Validate(d, a, b, c, dl, &m, &n, &k);
  if (!bad.empty()) return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: " + bad);
  if (Refuses("matmul")) return CUBLAS_STATUS_NOT_SUPPORTED;  // nothing enqueued
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // The operands read or written (C is not read when beta is 0), in
  // cuBLASLt's order (the algorithm's alignments are indexed so).
  struct Operand { const char* name; const void* p; const Layout* l; int index; };
  std::vector<Operand> used;
  for (const Operand& o : {Operand{"A", A, &a, 0}, Operand{"B", B, &b, 1}, Operand{"C", C, &c, 2}, Operand{"D", Dp, &dl, 3}})
    if (o.index != 2 || be != 0.0f) used.push_back(o);
  // Every operand's extent must be inside one device allocation.
  for (const Operand& o : used) {
    emu::AllocationInfo info;
    if (!emu::FindAllocation(o.p, ExtentBytes(*o.l), &info) || info.kind != emu::MemKind::kDevice) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, std::string("cublasLtMatmul: ") + o.name + " (" + Shape(o.name, *o.l) +
                                                   ", " + std::to_string(ExtentBytes(*o.l)) +
                                                   " bytes) is not inside one device allocation");
    }
  }
  if (d.epilogue == CUBLASLT_EPILOGUE_BIAS) {
    const uint64_t bytes = m * TypeBytes(dl.type) + uint64_t(dl.batch - 1) * uint64_t(d.bias_batch_stride) * TypeBytes(dl.type);
    if (d.bias == nullptr || !emu::FindAllocation(d.bias, bytes, nullptr)) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: BIAS epilogue with a bias pointer that is null or not " +
                                                   std::to_string(bytes) + " bytes of device memory");
    }
    // cuBLASLt's alignment preferences do not cover the bias: its bias
    // epilogue kernels may read it with 16-byte loads (a misaligned bias
    // faulted a real GPU with "misaligned address"), so a bias that is not
    // 16-byte aligned is refused here rather than passing by luck.
    if (Alignment(d.bias) < 16) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: the BIAS epilogue's bias is " +
                                                   std::to_string(Alignment(d.bias)) +
                                                   "-byte aligned; GPU bias epilogue kernels may need 16 bytes");
    }
  }
  if (algo != nullptr) {
    Algo got;
    std::memcpy(&got, algo, sizeof(got));
    if (got.magic != kAlgoMagic) return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: algo not from cublasLtMatmulAlgoGetHeuristic");
    for (const Operand& o : used) {
      const int have = Alignment(o.p);
      if (uint32_t(have) < got.align[o.index]) {
        return Fail(CUBLAS_STATUS_INVALID_VALUE, std::string("cublasLtMatmul: ") + o.name + " is " +
                                                     std::to_string(have) +
                                                     "-byte aligned but the algorithm was chosen for " +
                                                     std::to_string(got.align[o.index]) + "-byte alignment (misaligned access on a GPU)");
      }
    }
  }
  const std::string what = "cublasLtMatmul " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                           (dl.batch > 1 ? " x" + std::to_string(dl.batch) : "");
  cudaError_t e = emu::Enqueue(stream, what, [=] {
    // op(A) and op(B) converted to fp32 column-major (contiguous columns),
    // then D's columns as sums of A's columns: an axpy inner loop the
    // compiler vectorizes (the model's vocabulary GEMMs are large).
    std::vector<float> af(m * k), bf(k * n), acc(m * n);
    for (int32_t z = 0; z < dl.batch; ++z) {
      const int64_t za = z * a.stride, zb = z * b.stride, zc = z * c.stride, zd = z * dl.stride;
      for (uint64_t p = 0; p < k; ++p)
        for (uint64_t i = 0; i < m; ++i)
          af[i + p * m] = Load(a.type, A, za + (d.trans_a == CUBLAS_OP_N ? int64_t(i + p * a.ld) : int64_t(p + i * a.ld)));
      for (uint64_t j = 0; j < n; ++j)
        for (uint64_t p = 0; p < k; ++p)
          bf[p + j * k] = Load(b.type, B, zb + (d.trans_b == CUBLAS_OP_N ? int64_t(p + j * b.ld) : int64_t(j + p * b.ld)));
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (uint64_t j = 0; j < n; ++j) {
        float* out = acc.data() + j * m;
        for (uint64_t p = 0; p < k; ++p) {
          const float bv = bf[p + j * k];
          const float* col = af.data() + p * m;
          for (uint64_t i = 0; i < m; ++i) out[i] += col[i] * bv;
        }
      }
      for (uint64_t j = 0; j < n; ++j) {
        for (uint64_t i = 0; i < m; ++i) {
          float v = al * acc[i + j * m];
          if (be != 0.0f) v += be * Load(c.type, C, zc + int64_t(i + j * c.ld));
          if (d.epilogue == CUBLASLT_EPILOGUE_BIAS) v += Load(dl.type, d.bias, z * d.bias_batch_stride + int64_t(i));
          Store(dl.type, Dp, zd + int64_t(i + j * dl.ld), v);
        }
      }
    }
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
