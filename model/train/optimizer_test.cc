#include "model/train/optimizer.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dgca {
namespace {

// Straightforward double-precision AdamW (torch.optim.AdamW's algorithm).
struct RefAdamW {
  std::vector<double> p, m, v;
  std::vector<bool> decay;
  double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0;
  int t = 0;
  void Step(const std::vector<double>& g, double lr) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      if (decay[i]) p[i] *= (1 - lr * wd);
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double mh = m[i] / (1 - std::pow(b1, t));
      double vh = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
};

TEST(AdamWTest, MatchesDoubleReferenceWithDecayMask) {
  ParamStore ps;
  ps.Declare("w", {2, 3}, true);
  ps.Declare("b", {3}, false);  // after an alignment gap (ParamStore)
  ps.Finalize();
  // The tensors' elements in the flat buffers, and whether each decays.
  std::vector<int64_t> at;
  RefAdamW ref;
  for (int t = 0; t < ps.size(); ++t)
    for (int64_t j = 0; j < ps.info(t).numel; ++j) {
      at.push_back(ps.info(t).offset + j);
      ref.decay.push_back(ps.info(t).weight_decay);
    }
  ref.wd = 0.1;
  for (size_t i = 0; i < at.size(); ++i) {
    ps.values()[at[i]] = 0.1f * (i + 1) - 0.4f;
    ref.p.push_back(ps.values()[at[i]]);
  }
  ref.m.assign(ref.p.size(), 0);
  ref.v.assign(ref.p.size(), 0);
  AdamWOptions opt;
  opt.weight_decay = 0.1f;
  AdamW adam(&ps, opt);
  for (int step = 0; step < 5; ++step) {
    std::vector<double> g;
    for (size_t i = 0; i < at.size(); ++i) {
      // Varying signs and magnitudes, some tiny to exercise eps.
      double gi = std::sin(0.7 * i + 1.3 * step) * (i % 3 == 0 ? 1e-6 : 0.5);
      ps.grads()[at[i]] = static_cast<float>(gi);
      g.push_back(ps.grads()[at[i]]);
    }
    const double lr = 1e-2 * (step + 1);
    adam.Step(static_cast<float>(lr));
    ref.Step(g, static_cast<float>(lr));
  }
  EXPECT_EQ(adam.step(), 5);
  for (size_t i = 0; i < at.size(); ++i) {
    EXPECT_NEAR(ps.values()[at[i]], ref.p[i], 1e-6) << "element " << i;
  }
}

TEST(AdamWTest, FirstStepIsSignTimesLr) {
  // With bias correction the first update is lr * g/(|g|+eps) ~ lr * sign(g).
  ParamStore ps;
  ps.Declare("w", {3}, false);
  ps.Finalize();
  float g[3] = {2.0f, -0.5f, 0.0f};
  for (int i = 0; i < 3; ++i) ps.grads()[i] = g[i];
  AdamW adam(&ps, AdamWOptions{});
  adam.Step(0.1f);
  EXPECT_NEAR(ps.values()[0], -0.1f, 1e-6);
  EXPECT_NEAR(ps.values()[1], 0.1f, 1e-6);
  EXPECT_EQ(ps.values()[2], 0.0f);
}

TEST(AdamWTest, DecayOnlyWhereAllowed) {
  ParamStore ps;
  const int w = ps.Declare("w", {1}, true);
  const int ln = ps.Declare("ln.weight", {1}, false);
  ps.Finalize();
  ps.value(w)[0] = 1.0f;
  ps.value(ln)[0] = 1.0f;
  AdamWOptions o;
  o.weight_decay = 0.5f;
  AdamW adam(&ps, o);
  adam.Step(0.1f);  // zero grads: only the decay moves p
  EXPECT_NEAR(ps.value(w)[0], 1.0f - 0.1f * 0.5f, 1e-7);
  EXPECT_EQ(ps.value(ln)[0], 1.0f);
}

TEST(ScheduleTest, LinearWarmupThenDecayLikeHf) {
  // HF get_linear_schedule_with_warmup(warmup=2, total=10), base 1.0.
  const double expected[] = {0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0};
  for (int s = 0; s <= 10; ++s) {
    EXPECT_NEAR(ScheduledLr(LrSchedule::kLinear, 1.0, s, 2, 10), expected[s], 1e-12) << s;
  }
  EXPECT_EQ(ScheduledLr(LrSchedule::kLinear, 1.0, 12, 2, 10), 0.0);
  EXPECT_EQ(ScheduledLr(LrSchedule::kLinear, 2.0, 0, 0, 4), 2.0);
}

TEST(ScheduleTest, ConstantWithWarmup) {
  EXPECT_NEAR(ScheduledLr(LrSchedule::kConstant, 3.0, 1, 4, 100), 0.75, 1e-12);
  EXPECT_EQ(ScheduledLr(LrSchedule::kConstant, 3.0, 4, 4, 100), 3.0);
  EXPECT_EQ(ScheduledLr(LrSchedule::kConstant, 3.0, 99, 0, 100), 3.0);
}

TEST(ClipTest, ReturnsPreClipNormAndScales) {
  float g[2] = {3.0f, 4.0f};
  EXPECT_NEAR(ClipGradNorm(g, 2, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(g[0], 3.0 / (5.0 + 1e-6), 1e-6);
  EXPECT_NEAR(g[1], 4.0 / (5.0 + 1e-6), 1e-6);
  float h[2] = {3.0f, 4.0f};
  EXPECT_NEAR(ClipGradNorm(h, 2, 10.0), 5.0, 1e-9);
  EXPECT_EQ(h[0], 3.0f);
  float k[2] = {3.0f, 4.0f};
  EXPECT_NEAR(ClipGradNorm(k, 2, 0.0), 5.0, 1e-9);  // off
  EXPECT_EQ(k[1], 4.0f);
}

}  // namespace
}  // namespace dgca
