#include "model/cpu/gemm_rate.h"

#include <gtest/gtest.h>

namespace dgca {
namespace cpu {
namespace {

// A rate, not a time limit: positive and finite, and of a plausible order
// for a CPU core that runs the test suite (above 0.1 GFLOP/s, below 10
// TFLOP/s). Catches a measurement that returns 0 or a wrong FLOP count by
// orders of magnitude.
TEST(MeasureGemmFlops, GivesAPlausibleRate) {
  const double one = MeasureGemmFlops(1, 0.02);
  EXPECT_GT(one, 1e8);
  EXPECT_LT(one, 1e13);
  const double two = MeasureGemmFlops(2, 0.02);
  EXPECT_GT(two, 1e8);
  EXPECT_LT(two, 1e13);
}

}  // namespace
}  // namespace cpu
}  // namespace dgca
