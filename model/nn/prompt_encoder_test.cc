// Tests for PromptEncoder: forward against a naive double-precision
// reference of PyTorch's nn.LSTM equations (and against scalar hand
// formulas for H = 1), finite-difference gradient checks of every entry of
// every parameter tensor for the lstm and mlp kinds, parameter names/shapes,
// and the none kind.
//
// Finite differences: objective J = Σ out ⊙ W (W fixed random weights),
// accumulated in double; central differences with step kEps = 1e-2 on the
// float parameters. Expected error: float rounding in the forward
// (~1e-7 relative on outputs of O(1)) / 2e-2 ≈ 1e-5, plus truncation
// eps²·f'''/6 ≈ 1e-5. Measured worst case 1.8e-5 absolute, 1.1e-3
// relative. A gradient passes when |analytic − fd| <= kAtol + kRtol·|fd|
// with kAtol = 1e-4, kRtol = 1e-2. Entries whose ±eps step flips the sign of
// a ReLU input (found with the double reference) are skipped: a difference
// across the kink measures nothing; fewer than 5% may be skipped. Each tensor
// must also have max |fd| > 1e-3 so the check is never vacuous.
#include "model/nn/prompt_encoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace dgca {
namespace {

constexpr float kEps = 1e-2f;
constexpr double kAtol = 1e-4;
constexpr double kRtol = 1e-2;

ModelConfig Cfg(PromptEncoderKind kind, int H, int P) {
  ModelConfig c;
  c.hidden = H;
  c.prompt_length = P;
  c.prompt_encoder = kind;
  return c;
}

struct Rig {
  ParamStore store;
  std::unique_ptr<PromptEncoder> enc;
  Rig(const ModelConfig& cfg, uint64_t seed) {
    enc = std::make_unique<PromptEncoder>(cfg);
    Status s = enc->Declare(&store);
    EXPECT_TRUE(s.ok()) << s.ToString();
    store.Finalize();
    s = enc->Bind(&store);
    EXPECT_TRUE(s.ok()) << s.ToString();
    enc->InitParams(seed);
    // PyTorch's init with a tiny H leaves the LSTM nearly linear and its
    // gradients small next to the FD noise: widen the LSTM weights so every
    // gate's nonlinearity matters, and the MLP weights so the gradients
    // reaching the LSTM are O(0.1).
    for (int i = 0; i < store.size(); ++i) {
      const std::string& n = store.info(i).name;
      const float f = n.find("lstm") != std::string::npos            ? 1.5f
                      : n.find("mlp.0.weight") != std::string::npos ? 2.0f
                                                                      : 1.0f;
      float* v = store.value(i);
      for (int64_t j = 0; j < store.info(i).numel; ++j) v[j] *= f;
    }
  }
  const float* V(const std::string& name) {
    const int i = store.Find(name);
    EXPECT_GE(i, 0) << name;
    return store.value(i);
  }
};

// Naive double LSTM straight from the PyTorch nn.LSTM documentation:
//   i = σ(W_ii x + b_ii + W_hi h + b_hi), f = σ(..), g = tanh(..), o = σ(..)
//   c' = f c + i g, h' = o tanh(c'); rows of W are [i; f; g; o].
// `pre_relu`, when given, receives the [S, H] input of the ReLU.
std::vector<double> ReferenceForward(Rig& r, PromptEncoderKind kind, int H, int S,
                                     std::vector<double>* pre_relu = nullptr) {
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  std::vector<double> x(S * H);
  const float* emb = r.V("prompt.embedding.weight");
  for (int i = 0; i < S * H; ++i) x[i] = emb[i];
  int in = H;
  if (kind == PromptEncoderKind::kLstm) {
    const char* sfx[2][2] = {{"_l0", "_l0_reverse"}, {"_l1", "_l1_reverse"}};
    for (int layer = 0; layer < 2; ++layer) {
      std::vector<double> y(S * 2 * H, 0.0);
      for (int dir = 0; dir < 2; ++dir) {
        const std::string s = sfx[layer][dir];
        const float* Wih = r.V("prompt.lstm.weight_ih" + s);
        const float* Whh = r.V("prompt.lstm.weight_hh" + s);
        const float* bih = r.V("prompt.lstm.bias_ih" + s);
        const float* bhh = r.V("prompt.lstm.bias_hh" + s);
        std::vector<double> h(H, 0.0), c(H, 0.0), a(4 * H);
        for (int step = 0; step < S; ++step) {
          const int t = dir == 0 ? step : S - 1 - step;
          for (int k = 0; k < 4 * H; ++k) {
            double v = bih[k] + bhh[k];
            for (int j = 0; j < in; ++j) v += Wih[k * in + j] * x[t * in + j];
            for (int j = 0; j < H; ++j) v += Whh[k * H + j] * h[j];
            a[k] = v;
          }
          for (int j = 0; j < H; ++j) {
            const double gi = sig(a[j]), gf = sig(a[H + j]), gg = std::tanh(a[2 * H + j]),
                         go = sig(a[3 * H + j]);
            c[j] = gf * c[j] + gi * gg;
            h[j] = go * std::tanh(c[j]);
            y[t * 2 * H + dir * H + j] = h[j];
          }
        }
      }
      x = y;
      in = 2 * H;
    }
  }
  const float* W0 = r.V("prompt.mlp.0.weight");
  const float* b0 = r.V("prompt.mlp.0.bias");
  const float* W2 = r.V("prompt.mlp.2.weight");
  const float* b2 = r.V("prompt.mlp.2.bias");
  std::vector<double> hid(S * H), out(S * H);
  for (int t = 0; t < S; ++t)
    for (int i = 0; i < H; ++i) {
      double v = b0[i];
      for (int j = 0; j < in; ++j) v += W0[i * in + j] * x[t * in + j];
      hid[t * H + i] = std::max(0.0, v);
      if (pre_relu) (*pre_relu)[t * H + i] = v;
    }
  for (int t = 0; t < S; ++t)
    for (int i = 0; i < H; ++i) {
      double v = b2[i];
      for (int j = 0; j < H; ++j) v += W2[i * H + j] * hid[t * H + j];
      out[t * H + i] = v;
    }
  return out;
}

TEST(PromptEncoderForward, LstmMatchesNaiveReference) {
  const int H = 5, P = 3, S = 2 * P;
  Rig r(Cfg(PromptEncoderKind::kLstm, H, P), 3);
  const float* out = r.enc->Forward();
  ASSERT_NE(out, nullptr);
  std::vector<double> ref = ReferenceForward(r, PromptEncoderKind::kLstm, H, S);
  double max_err = 0;
  for (int i = 0; i < S * H; ++i) max_err = std::max(max_err, std::fabs(out[i] - ref[i]));
  std::printf("  lstm forward vs naive double reference: max abs err %.2e\n", max_err);
  EXPECT_LT(max_err, 1e-5);
}

TEST(PromptEncoderForward, MlpMatchesNaiveReference) {
  const int H = 5, P = 2, S = 2 * P;
  Rig r(Cfg(PromptEncoderKind::kMlp, H, P), 4);
  const float* out = r.enc->Forward();
  ASSERT_NE(out, nullptr);
  std::vector<double> ref = ReferenceForward(r, PromptEncoderKind::kMlp, H, S);
  for (int i = 0; i < S * H; ++i) EXPECT_NEAR(out[i], ref[i], 1e-5) << i;
}

// H = 1, P = 1 (two positions), every weight set by hand; the expected
// output is written out as scalar formulas, step by step.
TEST(PromptEncoderForward, LstmHandComputedH1) {
  const int H = 1, P = 1;
  Rig r(Cfg(PromptEncoderKind::kLstm, H, P), 5);
  auto set = [&](const std::string& n, std::vector<float> v) {
    const int i = r.store.Find(n);
    ASSERT_GE(i, 0) << n;
    ASSERT_EQ(static_cast<size_t>(r.store.info(i).numel), v.size()) << n;
    std::copy(v.begin(), v.end(), r.store.value(i));
  };
  set("prompt.embedding.weight", {0.5f, -1.0f});
  // Gate rows i, f, g, o. Layer 0 forward / reverse.
  set("prompt.lstm.weight_ih_l0", {1.0f, 0.5f, -1.0f, 2.0f});
  set("prompt.lstm.weight_hh_l0", {0.3f, -0.2f, 0.7f, 0.1f});
  set("prompt.lstm.bias_ih_l0", {0.1f, 0.2f, 0.0f, -0.1f});
  set("prompt.lstm.bias_hh_l0", {0.0f, 0.1f, 0.1f, 0.0f});
  set("prompt.lstm.weight_ih_l0_reverse", {-0.5f, 1.0f, 0.5f, 1.0f});
  set("prompt.lstm.weight_hh_l0_reverse", {0.2f, 0.4f, -0.3f, 0.5f});
  set("prompt.lstm.bias_ih_l0_reverse", {0.0f, 0.0f, 0.2f, 0.0f});
  set("prompt.lstm.bias_hh_l0_reverse", {0.1f, -0.1f, 0.0f, 0.3f});
  // Layer 1: input is [h_fwd, h_rev] (2 columns per gate row).
  set("prompt.lstm.weight_ih_l1", {1.0f, -1.0f, 0.5f, 0.5f, 2.0f, 1.0f, -1.0f, 0.3f});
  set("prompt.lstm.weight_hh_l1", {0.1f, 0.2f, 0.3f, 0.4f});
  set("prompt.lstm.bias_ih_l1", {0.0f, 0.0f, 0.0f, 0.0f});
  set("prompt.lstm.bias_hh_l1", {0.05f, 0.0f, -0.05f, 0.0f});
  set("prompt.lstm.weight_ih_l1_reverse", {0.3f, 0.6f, -0.4f, 0.2f, 1.0f, -2.0f, 0.8f, 0.1f});
  set("prompt.lstm.weight_hh_l1_reverse", {-0.1f, 0.3f, 0.2f, -0.2f});
  set("prompt.lstm.bias_ih_l1_reverse", {0.0f, 0.1f, 0.0f, 0.0f});
  set("prompt.lstm.bias_hh_l1_reverse", {0.0f, 0.0f, 0.0f, 0.2f});
  set("prompt.mlp.0.weight", {1.5f, -0.5f});
  set("prompt.mlp.0.bias", {0.25f});
  set("prompt.mlp.2.weight", {-2.0f});
  set("prompt.mlp.2.bias", {0.5f});

  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  // One LSTM cell step for H = 1: a = pre-activations of i, f, g, o.
  auto cell = [&](double ai, double af, double ag, double ao, double c_prev, double* c) {
    *c = sig(af) * c_prev + sig(ai) * std::tanh(ag);
    return sig(ao) * std::tanh(*c);
  };
  const double x0 = 0.5, x1 = -1.0;
  double c;
  // Layer 0, forward: t=0 (h_prev = c_prev = 0), then t=1.
  double c0;
  const double f0 = cell(1.0 * x0 + 0.1, 0.5 * x0 + 0.3, -1.0 * x0 + 0.1, 2.0 * x0 - 0.1, 0.0, &c0);
  const double f1 = cell(1.0 * x1 + 0.1 + 0.3 * f0, 0.5 * x1 + 0.3 - 0.2 * f0,
                         -1.0 * x1 + 0.1 + 0.7 * f0, 2.0 * x1 - 0.1 + 0.1 * f0, c0, &c);
  // Layer 0, reverse: t=1 first, then t=0.
  double c1;
  const double r1 = cell(-0.5 * x1 + 0.1, 1.0 * x1 - 0.1, 0.5 * x1 + 0.2, 1.0 * x1 + 0.3, 0.0, &c1);
  const double r0 = cell(-0.5 * x0 + 0.1 + 0.2 * r1, 1.0 * x0 - 0.1 + 0.4 * r1,
                         0.5 * x0 + 0.2 - 0.3 * r1, 1.0 * x0 + 0.3 + 0.5 * r1, c1, &c);
  // Layer 1 inputs: u_t = [f_t, r_t].
  double d0;
  const double F0 = cell(1.0 * f0 - 1.0 * r0 + 0.05, 0.5 * f0 + 0.5 * r0, 2.0 * f0 + 1.0 * r0 - 0.05,
                         -1.0 * f0 + 0.3 * r0, 0.0, &d0);
  const double F1 = cell(1.0 * f1 - 1.0 * r1 + 0.05 + 0.1 * F0, 0.5 * f1 + 0.5 * r1 + 0.2 * F0,
                         2.0 * f1 + 1.0 * r1 - 0.05 + 0.3 * F0, -1.0 * f1 + 0.3 * r1 + 0.4 * F0, d0, &c);
  double d1;
  const double R1 = cell(0.3 * f1 + 0.6 * r1, -0.4 * f1 + 0.2 * r1 + 0.1, 1.0 * f1 - 2.0 * r1,
                         0.8 * f1 + 0.1 * r1 + 0.2, 0.0, &d1);
  const double R0 = cell(0.3 * f0 + 0.6 * r0 - 0.1 * R1, -0.4 * f0 + 0.2 * r0 + 0.1 + 0.3 * R1,
                         1.0 * f0 - 2.0 * r0 + 0.2 * R1, 0.8 * f0 + 0.1 * r0 + 0.2 - 0.2 * R1, d1, &c);
  const double out0 = -2.0 * std::max(0.0, 1.5 * F0 - 0.5 * R0 + 0.25) + 0.5;
  const double out1 = -2.0 * std::max(0.0, 1.5 * F1 - 0.5 * R1 + 0.25) + 0.5;
  const float* out = r.enc->Forward();
  ASSERT_NE(out, nullptr);
  EXPECT_NEAR(out[0], out0, 1e-6);
  EXPECT_NEAR(out[1], out1, 1e-6);
  // The two outputs differ, so position order (and direction) matters.
  EXPECT_GT(std::fabs(out0 - out1), 1e-3);
}

// Gradient check of every entry of every parameter tensor.
void FdCheckAll(PromptEncoderKind kind, int H, int P, uint64_t seed) {
  const int S = 2 * P;
  Rig r(Cfg(kind, H, P), seed);
  std::mt19937_64 rng(seed + 100);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::vector<float> w(S * H);
  for (auto& v : w) v = static_cast<float>(n01(rng));
  auto J = [&]() {
    const float* out = r.enc->Forward();
    double j = 0;
    for (int i = 0; i < S * H; ++i) j += static_cast<double>(out[i]) * w[i];
    return j;
  };
  r.store.ZeroGrads();
  J();
  r.enc->Backward(w.data());
  std::vector<float> grads(r.store.grads(), r.store.grads() + r.store.total_numel());
  double worst_abs = 0, worst_rel = 0;
  int skipped = 0, total = 0;
  std::vector<double> pre_plus(S * H), pre_minus(S * H);
  for (int p = 0; p < r.store.size(); ++p) {
    const ParamInfo& info = r.store.info(p);
    float* x = r.store.value(p);
    const float* an = grads.data() + info.offset;
    double max_err = 0, max_rel = 0, max_fd = 0;
    int bad = 0;
    for (int64_t i = 0; i < info.numel; ++i) {
      const float old = x[i];
      x[i] = old + kEps;
      const double jp = J();
      ReferenceForward(r, kind, H, S, &pre_plus);
      x[i] = old - kEps;
      const double jm = J();
      ReferenceForward(r, kind, H, S, &pre_minus);
      x[i] = old;
      ++total;
      // A central difference across the ReLU's kink measures nothing:
      // skip entries whose step flips a ReLU input's sign.
      bool kink = false;
      for (int k = 0; k < S * H; ++k) kink |= (pre_plus[k] > 0) != (pre_minus[k] > 0);
      if (kink) {
        ++skipped;
        continue;
      }
      const double fd = (jp - jm) / (2.0 * kEps);
      const double err = std::fabs(an[i] - fd);
      max_err = std::max(max_err, err);
      if (std::fabs(fd) > 1e-2) max_rel = std::max(max_rel, err / std::fabs(fd));
      max_fd = std::max(max_fd, std::fabs(fd));
      if (!(err <= kAtol + kRtol * std::fabs(fd))) {
        if (bad < 5) ADD_FAILURE() << info.name << "[" << i << "]: analytic " << an[i] << " fd " << fd;
        ++bad;
      }
    }
    EXPECT_GT(max_fd, 1e-3) << info.name << ": gradient trivially small; the check would be vacuous";
    std::printf("  FD %-34s n=%4lld max|fd|=%.3e max abs err=%.2e max rel err(|fd|>1e-2)=%.2e\n",
                info.name.c_str(), static_cast<long long>(info.numel), max_fd, max_err, max_rel);
    worst_abs = std::max(worst_abs, max_err);
    worst_rel = std::max(worst_rel, max_rel);
  }
  std::printf("  worst: abs %.2e rel %.2e; %d of %d entries skipped (ReLU kink)\n", worst_abs,
              worst_rel, skipped, total);
  EXPECT_LT(skipped, total / 20) << "too many entries straddle a ReLU kink";
}

TEST(PromptEncoderGrad, LstmEveryParameter) { FdCheckAll(PromptEncoderKind::kLstm, 4, 2, 11); }

TEST(PromptEncoderGrad, LstmLongerSequence) { FdCheckAll(PromptEncoderKind::kLstm, 3, 3, 12); }

TEST(PromptEncoderGrad, MlpEveryParameter) { FdCheckAll(PromptEncoderKind::kMlp, 5, 3, 13); }

TEST(PromptEncoderBackward, AddsIntoGradsAndIsDeterministic) {
  const int H = 6, P = 3, S = 2 * P;
  Rig r(Cfg(PromptEncoderKind::kLstm, H, P), 21);
  std::vector<float> w(S * H);
  for (int i = 0; i < S * H; ++i) w[i] = std::sin(0.37f * i);
  r.store.ZeroGrads();
  std::vector<float> out1(r.enc->Forward(), r.enc->Forward() + S * H);
  r.enc->Backward(w.data());
  std::vector<float> g1(r.store.grads(), r.store.grads() + r.store.total_numel());
  std::vector<float> out2(r.enc->Forward(), r.enc->Forward() + S * H);
  EXPECT_EQ(out1, out2);
  r.enc->Backward(w.data());
  for (int64_t i = 0; i < r.store.total_numel(); ++i) EXPECT_NEAR(r.store.grads()[i], 2 * g1[i], 1e-6);
  r.store.ZeroGrads();
  r.enc->Forward();
  r.enc->Backward(w.data());
  EXPECT_EQ(g1, std::vector<float>(r.store.grads(), r.store.grads() + r.store.total_numel()));
}

TEST(PromptEncoderParams, PyTorchNamesShapesAndCounts) {
  const int H = 4, P = 2;
  ModelConfig cfg = Cfg(PromptEncoderKind::kLstm, H, P);
  ParamStore st;
  PromptEncoder enc(cfg);
  ASSERT_TRUE(enc.Declare(&st).ok());
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"prompt.embedding.weight", {4, 4}},
      {"prompt.lstm.weight_ih_l0", {16, 4}},          {"prompt.lstm.weight_hh_l0", {16, 4}},
      {"prompt.lstm.bias_ih_l0", {16}},               {"prompt.lstm.bias_hh_l0", {16}},
      {"prompt.lstm.weight_ih_l0_reverse", {16, 4}},  {"prompt.lstm.weight_hh_l0_reverse", {16, 4}},
      {"prompt.lstm.bias_ih_l0_reverse", {16}},       {"prompt.lstm.bias_hh_l0_reverse", {16}},
      {"prompt.lstm.weight_ih_l1", {16, 8}},          {"prompt.lstm.weight_hh_l1", {16, 4}},
      {"prompt.lstm.bias_ih_l1", {16}},               {"prompt.lstm.bias_hh_l1", {16}},
      {"prompt.lstm.weight_ih_l1_reverse", {16, 8}},  {"prompt.lstm.weight_hh_l1_reverse", {16, 4}},
      {"prompt.lstm.bias_ih_l1_reverse", {16}},       {"prompt.lstm.bias_hh_l1_reverse", {16}},
      {"prompt.mlp.0.weight", {4, 8}},                {"prompt.mlp.0.bias", {4}},
      {"prompt.mlp.2.weight", {4, 4}},                {"prompt.mlp.2.bias", {4}},
  };
  ASSERT_EQ(st.size(), static_cast<int>(want.size()));
  for (int i = 0; i < st.size(); ++i) {
    EXPECT_EQ(st.info(i).name, want[i].first);
    EXPECT_EQ(st.info(i).shape, want[i].second) << want[i].first;
    const bool bias = want[i].first.find("bias") != std::string::npos;
    EXPECT_EQ(st.info(i).weight_decay, !bias) << want[i].first;
  }
  EXPECT_EQ(st.parameter_count(), PromptEncoder::NumParams(cfg));
  EXPECT_FALSE(enc.Declare(&st).ok());  // duplicate names: error, no crash

  ModelConfig mcfg = Cfg(PromptEncoderKind::kMlp, H, P);
  ParamStore ms;
  PromptEncoder menc(mcfg);
  ASSERT_TRUE(menc.Declare(&ms).ok());
  EXPECT_EQ(ms.parameter_count(), PromptEncoder::NumParams(mcfg));
  EXPECT_EQ(ms.info(ms.Find("prompt.mlp.0.weight")).shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(ms.Find("prompt.lstm.weight_ih_l0"), -1);

  // Bind against a store with a wrong shape names the tensor.
  ParamStore bad;
  bad.Declare("prompt.embedding.weight", {4, 5}, true);
  bad.Finalize();
  PromptEncoder benc(mcfg);
  Status s = benc.Bind(&bad);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("prompt.embedding.weight"), std::string::npos) << s.message();
}

TEST(PromptEncoderNone, NoParamsNoOutput) {
  ModelConfig cfg = Cfg(PromptEncoderKind::kNone, 8, 3);
  ParamStore st;
  PromptEncoder enc(cfg);
  EXPECT_FALSE(enc.enabled());
  ASSERT_TRUE(enc.Declare(&st).ok());
  EXPECT_EQ(st.size(), 0);
  EXPECT_EQ(PromptEncoder::NumParams(cfg), 0);
  st.Finalize();
  ASSERT_TRUE(enc.Bind(&st).ok());
  EXPECT_EQ(enc.Forward(), nullptr);
  std::vector<float> d(6 * 8, 1.0f);
  enc.Backward(d.data());  // no-op, no crash
}

}  // namespace
}  // namespace dgca
