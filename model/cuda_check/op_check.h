// Every CUDA op checked against its CPU reference (model/cpu/ops.h): random
// inputs drawn fresh from the caller's generator, GPU outputs poisoned with
// NaN before each call (a skipped element fails), the error measured as
//   max_i |gpu_i - ref_i| / max(max_i |ref_i|, 1e-30)   (NaN/inf -> inf)
// and compared with a tolerance tied to the precision:
//   fp32: 1e-4 (the accuracy rule, docs/benchmarks.md).
//   bf16/fp16: ops are fed the same rounded inputs as the reference, so the
//   error is the output rounding (2^-9 relative) plus fp32-vs-fp32 noise;
//   kBf16Tol = 1e-2, kF16Tol = 5e-3 (kAttnBf16Tol = 2e-2, kAttnF16Tol =
//   1e-2 where probabilities are rounded
//   before the second GEMM, or before P·V in the fused kernels) until the next GPU session measures PyTorch's
//   own low-precision error and sets 2x that (the flash-attention rule).
//
// Used by model/cuda/cuda_ops_test.cc and dgca-model-check. Needs a GPU.
// Thread-safety: the checks share nothing; each call uses the given context.
#ifndef DGCA_MODEL_CUDA_CHECK_OP_CHECK_H_
#define DGCA_MODEL_CUDA_CHECK_OP_CHECK_H_

#include <functional>
#include <map>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/dtype.h"
#include "model/cuda/gemm.h"

namespace dgca {
namespace cuda {

constexpr double kF32Tol = 1e-4;
constexpr double kBf16Tol = 1e-2;
constexpr double kF16Tol = 5e-3;
constexpr double kAttnBf16Tol = 2e-2;
constexpr double kAttnF16Tol = 1e-2;
// kF32Tol, kBf16Tol or kF16Tol for t.
inline double DefaultTolerance(DType t) {
  return t == DType::kF32 ? kF32Tol : t == DType::kBF16 ? kBf16Tol : kF16Tol;
}

struct CheckRow {
  std::string op;     // "layernorm_bwd.dgamma"
  std::string dtype;  // "fp32", "bf16", "fp16"
  double max_rel_err = 0.0;
  double tolerance = 0.0;
  bool peer_tolerance = false;  // set from the peer's error (ApplyPeerTolerance)
  bool pass() const { return max_rel_err <= tolerance; }  // false for NaN
};

struct OpCheck {
  std::string name;
  // Appends one row per checked output. A non-OK status is a failure to run
  // (CUDA/cuBLASLt error), reported separately from a numeric FAIL.
  std::function<Status(const CudaContext&, GemmRunner*, std::mt19937_64*, std::vector<CheckRow>*)> run;
};

// All checks, in a fixed order.
const std::vector<OpCheck>& AllOpChecks();

// The error measure above; inf when sizes differ or any value is NaN/inf.
double MaxRelErr(const std::vector<float>& got, const std::vector<float>& want);

// The accuracy rule for low precision (docs/benchmarks.md): at most `factor` (2) times the
// error PyTorch's own low-precision op has against fp32 with the same
// measure. PeerErrors holds those errors as bench/gpu/torch_reference.py
// --mode op-errors prints them: {"errors": {"bf16": {"layernorm_fwd.out":
// 2.6e-3, ...}, "fp16": {...}}} (null for an op without a kernel).
struct PeerErrors {
  // dtype -> (op name prefix, error)
  std::map<std::string, std::vector<std::pair<std::string, double>>> by_dtype;
};
// INVALID_ARGUMENT naming the file and place for anything else.
StatusOr<PeerErrors> ParsePeerErrors(const std::string& json_text, const std::string& source);
// When a peer op of row->dtype is a prefix of row->op (the longest wins):
// row->tolerance = factor x its error, peer_tolerance set, true.
bool ApplyPeerTolerance(const PeerErrors& peer, double factor, CheckRow* row);

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CHECK_OP_CHECK_H_
