// Tests for DgcaHeads: forward losses against a dense double-precision
// reference written straight from docs/model.md, finite-difference gradient
// checks of every input and parameter, Predict against a brute-force argmax
// of the dense P, and input validation.
//
// Finite differences: central, step kEps = 3e-3 on float inputs, objective
// (the loss) accumulated in double. Expected error: float rounding inside the
// heads (~1e-7 relative on a loss of O(1)) / 6e-3 ≈ 2e-5, plus the
// truncation term eps²·f'''/6 ≈ 1e-6..1e-5. Measured worst case: 1.0e-4
// absolute (candidate.dense.weight, through GELU and LayerNorm), 1.4e-3
// relative. A gradient passes when |analytic − fd| <= kAtol + kRtol·|fd|
// with kAtol = 5e-4, kRtol = 1e-2 (about 5x the measured worst case).
// Every checked group must also have max |fd| > 1e-3, so a check can never
// pass on gradients that are all (near) zero; a sign flip or a dropped term
// of that size fails it.
#include "model/nn/heads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace dgca {
namespace {

constexpr float kEps = 3e-3f;
constexpr double kAtol = 5e-4;
constexpr double kRtol = 1e-2;

struct Problem {
  int T = 6, H = 6, V = 15, K = 4;
  std::vector<float> h, z, E;
  std::vector<int32_t> cand, x, y;
};

// Slots: 0 correct char (y = x); 1 error, y among candidates; 2 error, y NOT
// among candidates; 3 padded candidates (two -1), y = x; 4 duplicate
// candidate id equal to y; 5 error, y among candidates, one padding.
Problem MakeProblem(uint64_t seed, int T = 6, int H = 6, int V = 15, int K = 4) {
  Problem p;
  p.T = T;
  p.H = H;
  p.V = V;
  p.K = K;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  p.h.resize(static_cast<size_t>(T) * H);
  p.z.resize(static_cast<size_t>(T) * V);
  p.E.resize(static_cast<size_t>(V) * H);
  for (auto& v : p.h) v = n01(rng);
  for (auto& v : p.z) v = 1.5f * n01(rng);
  for (auto& v : p.E) v = 0.7f * n01(rng);
  p.cand.assign(static_cast<size_t>(T) * K, -1);
  p.x.resize(T);
  p.y.resize(T);
  for (int t = 0; t < T; ++t) {
    // K distinct ids starting at a slot-dependent offset.
    const int x = (3 * t + 1) % V;
    p.x[t] = x;
    for (int k = 0; k < K; ++k) p.cand[t * K + k] = (x + 2 * k) % V;
    p.y[t] = x;
    switch (t % 6) {
      case 0: break;
      case 1: p.y[t] = p.cand[t * K + 2]; break;
      case 2: p.y[t] = (x + 1) % V; break;  // odd offset: never a candidate
      case 3:
        p.cand[t * K + K - 1] = -1;
        p.cand[t * K + K - 2] = -1;
        break;
      case 4:
        p.y[t] = p.cand[t * K + 1];
        p.cand[t * K + 3] = p.cand[t * K + 1];  // duplicate id
        break;
      case 5:
        p.y[t] = p.cand[t * K + 1];
        p.cand[t * K + 2] = -1;
        break;
    }
  }
  return p;
}

ModelConfig Cfg(const Problem& p, bool det, bool cand, FusionKind fusion, float ld = 0.7f,
                float lc = 1.3f) {
  ModelConfig c;
  c.hidden = p.H;
  c.vocab_size = p.V;
  c.candidate_top_k = p.K;
  c.detector = det;
  c.candidate = cand;
  c.fusion = fusion;
  c.lambda_detector = ld;
  c.lambda_candidate = lc;
  c.layer_norm_eps = 1e-12f;
  return c;
}

// Heads + store, params initialised with sizeable random values so every
// nonlinearity is exercised.
struct Rig {
  ParamStore store;
  std::unique_ptr<DgcaHeads> heads;
  explicit Rig(const ModelConfig& cfg, int max_slots, uint64_t seed = 7) {
    heads = std::make_unique<DgcaHeads>(cfg, max_slots);
    Status s = heads->Declare(&store);
    EXPECT_TRUE(s.ok()) << s.ToString();
    store.Finalize();
    s = heads->Bind(&store);
    EXPECT_TRUE(s.ok()) << s.ToString();
    heads->InitParams(seed);
    std::mt19937_64 rng(seed + 1);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (int i = 0; i < store.size(); ++i) {
      const std::string& name = store.info(i).name;
      float* v = store.value(i);
      for (int64_t j = 0; j < store.info(i).numel; ++j) {
        if (name == "candidate.LayerNorm.weight") v[j] = 1.0f + 0.3f * n01(rng);
        else if (name == "fusion.gate.det_scale") v[j] = 0.8f;
        else v[j] = 0.5f * n01(rng);
      }
    }
  }
  float* P(const std::string& name) {
    const int i = store.Find(name);
    return i < 0 ? nullptr : store.value(i);
  }
  float Get(const std::string& name, int j = 0) { return P(name)[j]; }
};

// Dense double-precision reference of the heads in docs/model.md.
struct RefOut {
  double fusion = 0, detector = 0, candidate = 0, total = 0;
  int64_t n_cand = 0;
  std::vector<int32_t> argmax;
};

RefOut Reference(Rig& r, const ModelConfig& cfg, const Problem& p) {
  const int T = p.T, H = p.H, V = p.V, K = p.K;
  const bool gated = cfg.fusion == FusionKind::kGated && cfg.candidate;
  RefOut o;
  o.argmax.resize(T);
  for (int t = 0; t < T; ++t) {
    const float* h = &p.h[t * H];
    double e = 0;
    if (cfg.detector) {
      e = r.Get("detector.bias");
      for (int j = 0; j < H; ++j) e += static_cast<double>(r.Get("detector.weight", j)) * h[j];
      const double lab = p.x[t] != p.y[t] ? 1.0 : 0.0;
      const double sg = 1.0 / (1.0 + std::exp(-e));
      o.detector += -(lab * std::log(sg) + (1 - lab) * std::log(1 - sg));
    }
    std::vector<double> q(K, 0.0);
    if (cfg.candidate) {
      std::vector<double> g(H), u(H);
      double mean = 0, var = 0;
      for (int i = 0; i < H; ++i) {
        double a = r.Get("candidate.dense.bias", i);
        for (int j = 0; j < H; ++j) a += static_cast<double>(r.Get("candidate.dense.weight", i * H + j)) * h[j];
        g[i] = 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0)));
        mean += g[i] / H;
      }
      for (int i = 0; i < H; ++i) var += (g[i] - mean) * (g[i] - mean) / H;
      for (int i = 0; i < H; ++i)
        u[i] = (g[i] - mean) / std::sqrt(var + cfg.layer_norm_eps) * r.Get("candidate.LayerNorm.weight", i) +
               r.Get("candidate.LayerNorm.bias", i);
      double mx = -1e300, sum = 0;
      std::vector<double> s(K, 0.0);
      for (int k = 0; k < K; ++k) {
        const int c = p.cand[t * K + k];
        if (c < 0) continue;
        for (int j = 0; j < H; ++j) s[k] += u[j] * p.E[c * H + j];
        mx = std::max(mx, s[k]);
      }
      for (int k = 0; k < K; ++k)
        if (p.cand[t * K + k] >= 0) sum += std::exp(s[k] - mx);
      double Q = 0;
      bool in = false;
      for (int k = 0; k < K; ++k) {
        const int c = p.cand[t * K + k];
        if (c < 0) continue;
        q[k] = std::exp(s[k] - mx) / sum;
        if (c == p.y[t]) {
          Q += q[k];
          in = true;
        }
      }
      if (in) {
        o.candidate += -std::log(Q);
        ++o.n_cand;
      }
    }
    // Dense P.
    double zm = -1e300, zs = 0;
    for (int v = 0; v < V; ++v) zm = std::max(zm, static_cast<double>(p.z[t * V + v]));
    for (int v = 0; v < V; ++v) zs += std::exp(p.z[t * V + v] - zm);
    std::vector<double> P(V);
    for (int v = 0; v < V; ++v) P[v] = std::exp(p.z[t * V + v] - zm) / zs;
    if (gated) {
      double l = r.Get("fusion.gate.bias");
      for (int j = 0; j < H; ++j) l += static_cast<double>(r.Get("fusion.gate.weight", j)) * h[j];
      if (cfg.detector) l += r.Get("fusion.gate.det_scale") * e;
      const double g = 1.0 / (1.0 + std::exp(-l));
      for (int v = 0; v < V; ++v) P[v] *= (1 - g);
      for (int k = 0; k < K; ++k)
        if (p.cand[t * K + k] >= 0) P[p.cand[t * K + k]] += g * q[k];
    }
    o.fusion += -std::log(P[p.y[t]]);
    o.argmax[t] = static_cast<int32_t>(std::max_element(P.begin(), P.end()) - P.begin());
  }
  o.fusion /= T;
  o.detector /= T;
  if (o.n_cand > 0) o.candidate /= o.n_cand;
  o.total = o.fusion + (cfg.detector ? cfg.lambda_detector * o.detector : 0) +
            (cfg.candidate ? cfg.lambda_candidate * o.candidate : 0);
  return o;
}

double Loss(Rig& r, Problem& p, HeadLosses* out = nullptr) {
  HeadLosses l;
  Status s = r.heads->Forward(p.h.data(), p.z.data(), p.E.data(), p.cand.data(), p.x.data(),
                              p.y.data(), p.T, p.V, &l);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (out) *out = l;
  return l.total;
}

struct Grads {
  std::vector<float> dh, dz, dE;
};

Grads Analytic(Rig& r, Problem& p, float scale) {
  r.store.ZeroGrads();
  Loss(r, p);
  Grads g;
  g.dh.assign(p.h.size(), 0.0f);
  g.dz.assign(p.z.size(), std::numeric_limits<float>::quiet_NaN());  // must be overwritten
  g.dE.assign(p.E.size(), 0.0f);
  r.heads->Backward(scale, g.dh.data(), g.dz.data(), g.dE.data());
  return g;
}

struct CheckResult {
  double max_abs_err = 0, max_rel_err = 0, max_fd = 0;
  int bad = 0, n = 0;
};

// FD-checks `n` entries of `x` (all of them) against `analytic`, objective
// scale·Loss().
CheckResult FdCheck(Rig& r, Problem& p, float* x, const float* analytic, int64_t n, float scale,
                    const std::string& what) {
  CheckResult c;
  for (int64_t i = 0; i < n; ++i) {
    const float old = x[i];
    x[i] = old + kEps;
    const double lp = Loss(r, p);
    x[i] = old - kEps;
    const double lm = Loss(r, p);
    x[i] = old;
    const double fd = scale * (lp - lm) / (2.0 * kEps);
    const double err = std::fabs(analytic[i] - fd);
    c.max_abs_err = std::max(c.max_abs_err, err);
    if (std::fabs(fd) > 1e-2) c.max_rel_err = std::max(c.max_rel_err, err / std::fabs(fd));
    c.max_fd = std::max(c.max_fd, std::fabs(fd));
    ++c.n;
    if (!(err <= kAtol + kRtol * std::fabs(fd))) {
      if (c.bad < 5)
        ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " fd " << fd;
      ++c.bad;
    }
  }
  EXPECT_GT(c.max_fd, 1e-3) << what << ": gradient is trivially small; the check would be vacuous";
  std::printf("  FD %-28s n=%4d max|fd|=%.3e max abs err=%.2e max rel err(|fd|>1e-2)=%.2e\n",
              what.c_str(), c.n, c.max_fd, c.max_abs_err, c.max_rel_err);
  return c;
}

// Checks dh, dz, dE (if with_E) and every declared parameter.
void CheckAll(Rig& r, Problem& p, float scale, bool with_E, bool h_used = true) {
  // Parameter gradients are copied before FD, which reruns Forward().
  Grads g = Analytic(r, p, scale);
  std::vector<float> pgrad(r.store.grads(), r.store.grads() + r.store.total_numel());
  for (float v : g.dz) ASSERT_TRUE(std::isfinite(v)) << "dz not written in full";
  if (h_used) {
    EXPECT_EQ(FdCheck(r, p, p.h.data(), g.dh.data(), p.h.size(), scale, "dh").bad, 0);
  } else {
    for (float v : g.dh) EXPECT_EQ(v, 0.0f) << "dh touched with every head off";
  }
  EXPECT_EQ(FdCheck(r, p, p.z.data(), g.dz.data(), p.z.size(), scale, "dz").bad, 0);
  if (with_E) {
    EXPECT_EQ(FdCheck(r, p, p.E.data(), g.dE.data(), p.E.size(), scale, "dE").bad, 0);
  } else {
    for (float v : g.dE) EXPECT_EQ(v, 0.0f) << "dE touched with the candidate head off";
  }
  for (int i = 0; i < r.store.size(); ++i) {
    const ParamInfo& info = r.store.info(i);
    EXPECT_EQ(FdCheck(r, p, r.store.value(i), pgrad.data() + info.offset, info.numel, scale, info.name)
                  .bad,
              0);
  }
}

TEST(HeadsKernels, ExpFMatchesStdExp) {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * i / 200000.0f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(HeadsExpF(x) - want) / want);
  }
  std::printf("  HeadsExpF max rel err on [-87, 88]: %.2e\n", worst);
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(HeadsExpF(0.0f), 1.0f);
  // Clamped below: tiny but positive and finite; never NaN for -inf.
  EXPECT_GT(HeadsExpF(-1000.0f), 0.0f);
  EXPECT_LT(HeadsExpF(-1000.0f), 1e-37f);
  EXPECT_TRUE(std::isfinite(HeadsExpF(-std::numeric_limits<float>::infinity())));
}

TEST(HeadsForward, LossesMatchDenseReference) {
  struct Case {
    bool det, cand;
    FusionKind f;
  } cases[] = {{true, true, FusionKind::kGated},  {false, true, FusionKind::kGated},
               {true, false, FusionKind::kGated}, {true, true, FusionKind::kNone},
               {false, false, FusionKind::kNone}};
  for (const auto& cs : cases) {
    Problem p = MakeProblem(11);
    ModelConfig cfg = Cfg(p, cs.det, cs.cand, cs.f);
    Rig r(cfg, p.T);
    HeadLosses l;
    Loss(r, p, &l);
    RefOut ref = Reference(r, cfg, p);
    SCOPED_TRACE(std::to_string(cs.det) + std::to_string(cs.cand) + std::to_string(int(cs.f)));
    EXPECT_NEAR(l.fusion, ref.fusion, 1e-5 * std::max(1.0, ref.fusion));
    EXPECT_NEAR(l.detector, ref.detector, 1e-5 * std::max(1.0, ref.detector));
    EXPECT_NEAR(l.candidate, ref.candidate, 1e-5 * std::max(1.0, ref.candidate));
    EXPECT_NEAR(l.total, ref.total, 1e-5 * std::max(1.0, ref.total));
    EXPECT_EQ(l.candidate_slots, cs.cand ? ref.n_cand : 0);
    EXPECT_EQ(l.slots, p.T);
    if (cs.cand) EXPECT_EQ(l.candidate_slots, 5);  // slot 2's target is not a candidate
    if (!cs.det) EXPECT_EQ(l.detector, 0.0);
    if (!cs.cand) EXPECT_EQ(l.candidate, 0.0);
  }
}

TEST(HeadsForward, FusionNoneIsPlainCrossEntropy) {
  Problem p = MakeProblem(12);
  ModelConfig cfg = Cfg(p, false, false, FusionKind::kNone);
  Rig r(cfg, p.T);
  HeadLosses l;
  Loss(r, p, &l);
  double ce = 0;
  for (int t = 0; t < p.T; ++t) {
    double m = -1e300, s = 0;
    for (int v = 0; v < p.V; ++v) m = std::max(m, double(p.z[t * p.V + v]));
    for (int v = 0; v < p.V; ++v) s += std::exp(p.z[t * p.V + v] - m);
    ce += -(p.z[t * p.V + p.y[t]] - m - std::log(s));
  }
  EXPECT_NEAR(l.fusion, ce / p.T, 1e-6);
  EXPECT_NEAR(l.total, ce / p.T, 1e-6);
  EXPECT_EQ(r.store.size(), 0);
}

TEST(HeadsForward, ExtremeLogitsStayFinite) {
  // p_y underflows in float (z_y 200 below the max) and y is not a candidate:
  // the log-space loss must stay finite and equal the exact value.
  Problem p = MakeProblem(13);
  ModelConfig cfg = Cfg(p, true, true, FusionKind::kGated);
  Rig r(cfg, p.T);
  const int t = 2;  // y not among candidates
  p.z[t * p.V + p.y[t]] -= 200.0f;
  HeadLosses l;
  Loss(r, p, &l);
  EXPECT_TRUE(std::isfinite(l.total));
  RefOut ref = Reference(r, cfg, p);
  EXPECT_NEAR(l.fusion, ref.fusion, 1e-5 * ref.fusion);
  Grads g = Analytic(r, p, 1.0f);
  for (float v : g.dz) EXPECT_TRUE(std::isfinite(v));
  for (float v : g.dh) EXPECT_TRUE(std::isfinite(v));
}

TEST(HeadsGrad, DetectorOnly) {
  Problem p = MakeProblem(21);
  Rig r(Cfg(p, true, false, FusionKind::kGated), p.T);  // no candidates: fusion acts as none
  EXPECT_FALSE(r.heads->gated());
  EXPECT_EQ(r.store.size(), 2);
  CheckAll(r, p, 1.0f, /*with_E=*/false);
}

TEST(HeadsGrad, CandidateHeadWithPaddingAndMissingTarget) {
  Problem p = MakeProblem(22);
  Rig r(Cfg(p, false, true, FusionKind::kNone), p.T);  // CE(z) + λ_cand·L_cand
  CheckAll(r, p, 1.0f, /*with_E=*/true);
}

TEST(HeadsGrad, GatedFusionWithDetector) {
  Problem p = MakeProblem(23);
  Rig r(Cfg(p, true, true, FusionKind::kGated), p.T);
  ASSERT_NE(r.store.Find("fusion.gate.det_scale"), -1);
  CheckAll(r, p, 1.0f, /*with_E=*/true);
}

TEST(HeadsGrad, GatedFusionWithoutDetector) {
  Problem p = MakeProblem(24);
  Rig r(Cfg(p, false, true, FusionKind::kGated), p.T);
  EXPECT_EQ(r.store.Find("fusion.gate.det_scale"), -1);  // no a·e term
  CheckAll(r, p, 1.0f, /*with_E=*/true);
}

TEST(HeadsGrad, GatedFusionOnlyFusionLoss) {
  // λ_det = λ_cand = 0: every gradient comes through P alone (gate, q, z).
  Problem p = MakeProblem(25);
  Rig r(Cfg(p, true, true, FusionKind::kGated, 0.0f, 0.0f), p.T);
  CheckAll(r, p, 1.0f, /*with_E=*/true);
}

TEST(HeadsGrad, LambdaCompositionAndScale) {
  Problem p = MakeProblem(26);
  ModelConfig cfg = Cfg(p, true, true, FusionKind::kGated, 0.3f, 2.0f);
  Rig r(cfg, p.T);
  HeadLosses l;
  Loss(r, p, &l);
  EXPECT_NEAR(l.total,
              l.fusion + double(0.3f) * l.detector + double(2.0f) * l.candidate, 1e-12);
  CheckAll(r, p, 0.5f, /*with_E=*/true);
  // Gradients are linear in scale.
  Grads g1 = Analytic(r, p, 1.0f);
  std::vector<float> p1(r.store.grads(), r.store.grads() + r.store.total_numel());
  Grads g3 = Analytic(r, p, 3.0f);
  for (size_t i = 0; i < g1.dh.size(); ++i) EXPECT_NEAR(g3.dh[i], 3 * g1.dh[i], 1e-5);
  for (int64_t i = 0; i < r.store.total_numel(); ++i)
    EXPECT_NEAR(r.store.grads()[i], 3 * p1[i], 1e-5);
}

TEST(HeadsGrad, FusionNone) {
  Problem p = MakeProblem(27);
  Rig r(Cfg(p, false, false, FusionKind::kNone), p.T);
  CheckAll(r, p, 1.0f, /*with_E=*/false, /*h_used=*/false);
  // Closed form: dz = (softmax(z) − onehot(y)) / T.
  Grads g = Analytic(r, p, 1.0f);
  for (int t = 0; t < p.T; ++t) {
    double m = -1e300, s = 0;
    for (int v = 0; v < p.V; ++v) m = std::max(m, double(p.z[t * p.V + v]));
    for (int v = 0; v < p.V; ++v) s += std::exp(p.z[t * p.V + v] - m);
    for (int v = 0; v < p.V; ++v) {
      const double want = (std::exp(p.z[t * p.V + v] - m) / s - (v == p.y[t])) / p.T;
      EXPECT_NEAR(g.dz[t * p.V + v], want, 1e-6);
    }
  }
  for (float v : g.dh) EXPECT_EQ(v, 0.0f);
}

TEST(HeadsBackward, AddsIntoDhAndDEAndParamsAndDzMayAliasZ) {
  Problem p = MakeProblem(31);
  Rig r(Cfg(p, true, true, FusionKind::kGated), p.T);
  Grads g = Analytic(r, p, 1.0f);
  std::vector<float> pg(r.store.grads(), r.store.grads() + r.store.total_numel());
  // Second backward on top of pre-filled buffers: everything but dz adds.
  Loss(r, p);
  std::vector<float> dh(p.h.size(), 0.25f), dE(p.E.size(), -0.5f);
  std::vector<float> zcopy = p.z;
  r.heads->Backward(1.0f, dh.data(), p.z.data(), dE.data());  // dz aliases z
  // (1e-6: the sums round differently when they start from a non-zero value.)
  for (size_t i = 0; i < dh.size(); ++i) EXPECT_NEAR(dh[i], 0.25f + g.dh[i], 1e-6);
  for (size_t i = 0; i < dE.size(); ++i) EXPECT_NEAR(dE[i], -0.5f + g.dE[i], 1e-6);
  for (size_t i = 0; i < p.z.size(); ++i) EXPECT_EQ(p.z[i], g.dz[i]);
  for (int64_t i = 0; i < r.store.total_numel(); ++i)
    EXPECT_NEAR(r.store.grads()[i], 2 * pg[i], 1e-6);
  // Non-candidate rows of dE are untouched.
  std::vector<bool> is_cand(p.V, false);
  for (int32_t c : p.cand)
    if (c >= 0) is_cand[c] = true;
  for (int v = 0; v < p.V; ++v)
    if (!is_cand[v])
      for (int j = 0; j < p.H; ++j) EXPECT_EQ(g.dE[v * p.H + j], 0.0f);
}

TEST(HeadsBackward, Deterministic) {
  Problem p = MakeProblem(32, 40, 16, 200, 8);
  Rig r(Cfg(p, true, true, FusionKind::kGated), p.T);
  Grads a = Analytic(r, p, 1.0f);
  std::vector<float> pa(r.store.grads(), r.store.grads() + r.store.total_numel());
  Grads b = Analytic(r, p, 1.0f);
  EXPECT_EQ(a.dh, b.dh);
  EXPECT_EQ(a.dz, b.dz);
  EXPECT_EQ(a.dE, b.dE);
  EXPECT_EQ(pa, std::vector<float>(r.store.grads(), r.store.grads() + r.store.total_numel()));
}

TEST(HeadsBackward, ThreadCountDoesNotChangeResults) {
  Problem p = MakeProblem(33, 64, 16, 300, 8);
  Rig r(Cfg(p, true, true, FusionKind::kGated), p.T);
  HeadLosses l1, l3;
  r.heads->set_threads(1);
  Loss(r, p, &l1);
  Grads a = Analytic(r, p, 1.0f);
  std::vector<float> pa(r.store.grads(), r.store.grads() + r.store.total_numel());
  std::vector<int32_t> pred1(p.T), pred3(p.T);
  ASSERT_TRUE(r.heads->Predict(p.h.data(), p.z.data(), p.E.data(), p.cand.data(), p.x.data(), p.T,
                               p.V, pred1.data())
                  .ok());
  r.heads->set_threads(3);
  Loss(r, p, &l3);
  Grads b = Analytic(r, p, 1.0f);
  ASSERT_TRUE(r.heads->Predict(p.h.data(), p.z.data(), p.E.data(), p.cand.data(), p.x.data(), p.T,
                               p.V, pred3.data())
                  .ok());
  EXPECT_EQ(l1.total, l3.total);
  EXPECT_EQ(a.dh, b.dh);
  EXPECT_EQ(a.dz, b.dz);
  EXPECT_EQ(a.dE, b.dE);
  EXPECT_EQ(pa, std::vector<float>(r.store.grads(), r.store.grads() + r.store.total_numel()));
  EXPECT_EQ(pred1, pred3);
}

TEST(HeadsPredict, MatchesBruteForceDenseArgmax) {
  int candidate_wins = 0, other_wins = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    Problem p = MakeProblem(100 + seed, 12, 8, 40, 5);
    for (bool det : {true, false}) {
      for (FusionKind f : {FusionKind::kGated, FusionKind::kNone}) {
        ModelConfig cfg = Cfg(p, det, true, f);
        Rig r(cfg, p.T, seed);
        // Vary the gate bias so both the dense and the sparse part win.
        if (f == FusionKind::kGated) r.P("fusion.gate.bias")[0] = static_cast<float>(seed % 5) - 2.0f;
        RefOut ref = Reference(r, cfg, p);
        std::vector<int32_t> pred(p.T, -7);
        Status s = r.heads->Predict(p.h.data(), p.z.data(), p.E.data(), p.cand.data(), p.x.data(),
                                    p.T, p.V, pred.data());
        ASSERT_TRUE(s.ok()) << s.ToString();
        EXPECT_EQ(pred, ref.argmax) << "seed " << seed << " det " << det << " fusion " << int(f);
        if (f == FusionKind::kGated)
          for (int t = 0; t < p.T; ++t) {
            bool c = false;
            for (int k = 0; k < p.K; ++k) c |= p.cand[t * p.K + k] == pred[t];
            (c ? candidate_wins : other_wins)++;
          }
      }
    }
  }
  // Both branches of the sparse argmax were exercised.
  EXPECT_GT(candidate_wins, 20);
  EXPECT_GT(other_wins, 20);
}

TEST(HeadsPredict, FusionNoneIsArgmaxZ) {
  Problem p = MakeProblem(41);
  Rig r(Cfg(p, true, true, FusionKind::kNone), p.T);
  std::vector<int32_t> pred(p.T);
  ASSERT_TRUE(r.heads->Predict(p.h.data(), p.z.data(), p.E.data(), p.cand.data(), p.x.data(), p.T,
                               p.V, pred.data())
                  .ok());
  for (int t = 0; t < p.T; ++t)
    EXPECT_EQ(pred[t], std::max_element(&p.z[t * p.V], &p.z[t * p.V] + p.V) - &p.z[t * p.V]);
}

TEST(HeadsInput, BadIdsAndSizesAreErrors) {
  Problem p = MakeProblem(51);
  Rig r(Cfg(p, true, true, FusionKind::kGated), p.T);
  HeadLosses l;
  auto fwd = [&](int T) {
    return r.heads->Forward(p.h.data(), p.z.data(), p.E.data(), p.cand.data(), p.x.data(),
                            p.y.data(), T, p.V, &l);
  };
  EXPECT_TRUE(fwd(p.T).ok());
  Status s = fwd(p.T + 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_slots"), std::string::npos) << s.message();
  p.y[3] = p.V;
  s = fwd(p.T);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slot 3"), std::string::npos) << s.message();
  p.y[3] = p.x[3];
  p.cand[2 * p.K + 1] = -2;
  s = fwd(p.T);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("candidate 1"), std::string::npos) << s.message();
  p.cand[2 * p.K + 1] = -1;
  p.x[0] = -5;
  EXPECT_FALSE(fwd(p.T).ok());
  std::vector<int32_t> pred(p.T);
  EXPECT_FALSE(r.heads->Predict(p.h.data(), p.z.data(), p.E.data(), p.cand.data(), p.x.data(), p.T,
                                p.V, pred.data())
                   .ok());
  // T = 0 is fine and gives zero losses.
  p.x[0] = 1;
  ASSERT_TRUE(fwd(0).ok());
  EXPECT_EQ(l.total, 0.0);
}

TEST(HeadsParams, NamesShapesAndCounts) {
  Problem p = MakeProblem(61);
  for (bool det : {true, false})
    for (bool cand : {true, false})
      for (FusionKind f : {FusionKind::kGated, FusionKind::kNone}) {
        ModelConfig cfg = Cfg(p, det, cand, f);
        ParamStore st;
        DgcaHeads h(cfg, 4);
        ASSERT_TRUE(h.Declare(&st).ok());
        EXPECT_EQ(st.parameter_count(), DgcaHeads::NumParams(cfg));
        EXPECT_EQ(st.Find("detector.weight") >= 0, det);
        EXPECT_EQ(st.Find("candidate.dense.weight") >= 0, cand);
        EXPECT_EQ(st.Find("fusion.gate.weight") >= 0, cand && f == FusionKind::kGated);
        EXPECT_EQ(st.Find("fusion.gate.det_scale") >= 0, det && cand && f == FusionKind::kGated);
        if (cand) {
          EXPECT_EQ(st.info(st.Find("candidate.dense.weight")).shape, (std::vector<int64_t>{p.H, p.H}));
          EXPECT_FALSE(st.info(st.Find("candidate.LayerNorm.weight")).weight_decay);
          EXPECT_FALSE(st.info(st.Find("candidate.dense.bias")).weight_decay);
          EXPECT_TRUE(st.info(st.Find("candidate.dense.weight")).weight_decay);
        }
        // Declaring twice is an error, not a crash.
        if (st.size() > 0) EXPECT_FALSE(h.Declare(&st).ok());
        st.Finalize();
        EXPECT_TRUE(h.Bind(&st).ok());
      }
  // Bind against a store with a wrong shape names the tensor.
  ModelConfig cfg = Cfg(p, true, true, FusionKind::kGated);
  ParamStore st;
  st.Declare("detector.weight", {p.H + 1}, true);
  st.Finalize();
  DgcaHeads h(cfg, 4);
  Status s = h.Bind(&st);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("detector.weight"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace dgca
