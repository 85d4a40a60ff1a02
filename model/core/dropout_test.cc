#include "model/core/dropout.h"

#include <cmath>
#include <cstdint>

#include <gtest/gtest.h>

namespace dgca {
namespace {

// Fraction of dropped elements over n indices of one site, against p
// (binomial: within 5 standard deviations).
void ExpectDropRate(float p, uint64_t key, int n) {
  const uint32_t t = DropoutThreshold(p);
  int dropped = 0;
  for (int i = 0; i < n; ++i) dropped += DropoutKeep(key, DropoutHiddenIndex(i / 768, i % 768), t) ? 0 : 1;
  const double sd = std::sqrt(n * p * (1.0 - p));
  EXPECT_NEAR(dropped, n * p, 5 * sd + 1) << "p " << p;
}

TEST(Dropout, DropsAtTheRequestedRate) {
  for (float p : {0.01f, 0.1f, 0.3f, 0.5f, 0.9f}) ExpectDropRate(p, DropoutSiteKey(12345, 3, kDropFfnOut), 200000);
}

TEST(Dropout, ZeroKeepsEverythingAndScaleIsInverted) {
  EXPECT_EQ(DropoutThreshold(0.0f), 0u);
  for (uint64_t i = 0; i < 1000; ++i) EXPECT_TRUE(DropoutKeep(i * 7919, i, 0u));
  EXPECT_FLOAT_EQ(DropoutScale(0.0f), 1.0f);
  EXPECT_FLOAT_EQ(DropoutScale(0.2f), 1.25f);
  EXPECT_EQ(DropoutThreshold(0.5f), 2147483648u);
}

// Neighbouring elements, sites, layers and samples drop independently: the
// joint drop rate of two masks is p^2 (a correlated or shared mask would
// give p).
TEST(Dropout, MasksOfNeighboursSitesLayersAndSamplesAreIndependent) {
  const float p = 0.5f;
  const uint32_t t = DropoutThreshold(p);
  const int n = 100000;
  struct Pair {
    const char* what;
    uint64_t k1, k2;
    int shift;  // index offset of the second mask
  };
  const uint64_t key = 0xABCDEF;
  for (const Pair& pr : {Pair{"next column", DropoutSiteKey(key, 0, kDropAttnOut), DropoutSiteKey(key, 0, kDropAttnOut), 1},
                         Pair{"other site", DropoutSiteKey(key, 0, kDropAttnOut), DropoutSiteKey(key, 0, kDropFfnOut), 0},
                         Pair{"other layer", DropoutSiteKey(key, 0, kDropAttnOut), DropoutSiteKey(key, 1, kDropAttnOut), 0},
                         Pair{"embeddings vs layer 0", DropoutSiteKey(key, -1, kDropHidden), DropoutSiteKey(key, 0, kDropHidden), 0},
                         Pair{"next sample", DropoutSiteKey(key, 0, kDropAttnOut), DropoutSiteKey(key + 1, 0, kDropAttnOut), 0}}) {
    int both = 0;
    for (int i = 0; i < n; ++i) {
      const bool a = !DropoutKeep(pr.k1, DropoutHiddenIndex(i / 128, i % 128), t);
      const int j = i + pr.shift;
      const bool b = !DropoutKeep(pr.k2, DropoutHiddenIndex(j / 128, j % 128), t);
      both += a && b ? 1 : 0;
    }
    const double q = p * p, sd = std::sqrt(n * q * (1 - q));
    EXPECT_NEAR(both, n * q, 5 * sd) << pr.what;
  }
}

TEST(Dropout, IndicesDoNotCollide) {
  // Hidden and probability indices of distinct places differ (the hash of
  // equal indices would give equal bits).
  EXPECT_NE(DropoutHiddenIndex(1, 0), DropoutHiddenIndex(0, 1));
  EXPECT_NE(DropoutProbsIndex(1, 0, 0), DropoutProbsIndex(0, 1, 0));
  EXPECT_NE(DropoutProbsIndex(0, 1, 0), DropoutProbsIndex(0, 0, 1));
  EXPECT_NE(DropoutProbsIndex(0, 511, 511), DropoutProbsIndex(1, 0, 0));
}

}  // namespace
}  // namespace dgca
