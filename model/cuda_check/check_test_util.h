// Helpers for the GoogleTest wrappers of the GPU-vs-CPU checks
// (cuda_ops_test, cuda_bert_test, cuda_heads_test; on the CUDA emulator
// their *_emu twins).
//
// Thread-safety: test-thread only.
#ifndef DGCA_MODEL_CUDA_CHECK_CHECK_TEST_UTIL_H_
#define DGCA_MODEL_CUDA_CHECK_CHECK_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include "model/cuda/cuda_context.h"
#include "model/cuda/gemm.h"
#include "model/cuda_check/op_check.h"

namespace dgca {
namespace cuda {
namespace check_test {

inline bool HaveDevice(std::string* why) { return VisibleDeviceCount(why) > 0; }

// The inputs' seed. Fixed unless DGCA_CHECK_SEED says otherwise (a number,
// or "random" for a fresh draw): a test must not fail by the draw of its
// inputs, and some draws are ill-conditioned for a relative measure (a
// scalar parameter's gradient is a sum of signed per-slot terms; when they
// cancel, float32's reordering error is large next to the sum: 1 draw in
// ~1500 put fusion.gate.det_scale at 3e-4 against 1e-4). dgca-model-check,
// the program run on the GPU, draws fresh inputs every run.
inline uint64_t CheckSeed() {
  const char* e = std::getenv("DGCA_CHECK_SEED");
  if (e == nullptr || *e == '\0') return 20261125;
  if (std::string(e) == "random") return std::random_device{}();
  return std::strtoull(e, nullptr, 10);
}

// Runs `check` with inputs drawn from `rng` and expects every row to pass;
// failures name the check, the row, the error, the tolerance and the seed.
inline void ExpectCheckPasses(const OpCheck& check, const CudaContext& ctx, GemmRunner* gemm,
                              std::mt19937_64* rng, uint64_t seed) {
  std::vector<CheckRow> rows;
  Status s = check.run(ctx, gemm, rng, &rows);
  EXPECT_TRUE(s.ok()) << check.name << ": " << s.ToString() << " (seed " << seed << ")";
  EXPECT_FALSE(rows.empty()) << check.name;
  for (const CheckRow& r : rows) {
    EXPECT_TRUE(r.pass()) << check.name << " " << r.op << " " << r.dtype << ": max rel err "
                          << r.max_rel_err << " > tolerance " << r.tolerance << " (seed " << seed
                          << ", DGCA_CHECK_SEED to repeat)";
  }
}

}  // namespace check_test
}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CHECK_CHECK_TEST_UTIL_H_
