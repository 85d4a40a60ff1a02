// Tests of model/cpu/ops: each kernel against a naive double-precision
// reference written out here, backward kernels against central finite
// differences, the built-in GEMM against OpenBLAS, and bit-reproducibility
// for a fixed thread count.
#include "model/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace dgca {
namespace cpu {
namespace {

// A process-wide two-thread pool for the tests (the pool is not the unit
// under test here; thread_pool_test.cc covers it).
Context Ctx(int threads) {
  static ThreadPool* pool2 = new ThreadPool(2);
  return threads == 1 ? Context{} : Context{pool2};
}

std::vector<float> Randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ||a - b|| / max(||b||, tiny): the norm-based relative error used throughout.
double RelErr(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}
double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  return RelErr(a, std::vector<double>(b.begin(), b.end()));
}

// Central finite differences of f at every element of x (f reads x).
std::vector<double> NumGrad(std::vector<float>& x, const std::function<double()>& f,
                            float eps = 1e-2f) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float old = x[i];
    x[i] = old + eps;
    const double fp = f();
    x[i] = old - eps;
    const double fm = f();
    x[i] = old;
    g[i] = (fp - fm) / (2.0 * eps);
  }
  return g;
}

double Dot(const std::vector<float>& a, const std::vector<float>& w) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * w[i];
  return s;
}

// ----------------------------------------------------------------- GEMM

std::vector<double> NaiveGemm(bool ta, bool tb, int M, int N, int K, float alpha,
                              const std::vector<float>& A, int lda, const std::vector<float>& B,
                              int ldb, float beta, const std::vector<float>& C, int ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
      }
      out[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * C[i * ldc + j]);
    }
  return out;
}

TEST(OpsGemm, BuiltinAndBlasMatchNaiveForAllTransposes) {
  const int M = 37, N = 530, K = 45;  // N > the built-in's column block
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        const int lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
        auto A = Randn(static_cast<size_t>(M) * K, 1);
        auto B = Randn(static_cast<size_t>(K) * N, 2);
        auto C0 = Randn(static_cast<size_t>(M) * N, 3);
        auto ref = NaiveGemm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C0, ldc);
        for (int threads : {1, 2}) {
          Context ctx = Ctx(threads);
          auto c1 = C0;
          GemmBuiltin(ctx, ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, beta, c1.data(),
                      ldc);
          EXPECT_LT(RelErr(c1, ref), 1e-6) << "builtin ta=" << ta << " tb=" << tb << " beta=" << beta;
          auto c2 = C0;
          Gemm(ctx, ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, beta, c2.data(), ldc);
          EXPECT_LT(RelErr(c2, ref), 1e-6) << "Gemm ta=" << ta << " tb=" << tb << " beta=" << beta;
          // The built-in path against the BLAS path directly (same when no BLAS).
          EXPECT_LT(RelErr(c1, c2), 2e-6);
        }
      }
}

TEST(OpsGemm, BuiltinIsBitIdenticalAcrossThreadCounts) {
  const int M = 64, N = 96, K = 200;
  auto A = Randn(M * K, 4), B = Randn(N * K, 5);
  std::vector<float> c1(M * N), c2(M * N);
  GemmBuiltin(Ctx(1), false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, c1.data(), N);
  GemmBuiltin(Ctx(2), false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, c2.data(), N);
  EXPECT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)));
}

// --------------------------------------------------------------- Linear

TEST(OpsLinear, ForwardAndBackwardMatchNaive) {
  const int n = 13, ic = 24, oc = 17;
  Context ctx = Ctx(2);
  auto x = Randn(n * ic, 6), w = Randn(oc * ic, 7), b = Randn(oc, 8), dy = Randn(n * oc, 9);
  std::vector<float> y(n * oc);
  LinearForward(ctx, y.data(), x.data(), w.data(), b.data(), n, ic, oc);
  std::vector<double> yr(n * oc);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < oc; ++o) {
      double s = b[o];
      for (int k = 0; k < ic; ++k) s += static_cast<double>(x[i * ic + k]) * w[o * ic + k];
      yr[i * oc + o] = s;
    }
  EXPECT_LT(RelErr(y, yr), 1e-6);

  std::vector<float> dx(n * ic, 5.0f), dw(oc * ic, 1.0f), db(oc, 2.0f);
  LinearBackward(ctx, dx.data(), false, dw.data(), db.data(), dy.data(), x.data(), w.data(), n,
                 ic, oc);
  std::vector<double> dxr(n * ic, 0), dwr(oc * ic, 1.0), dbr(oc, 2.0);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < oc; ++o) {
      dbr[o] += dy[i * oc + o];
      for (int k = 0; k < ic; ++k) {
        dxr[i * ic + k] += static_cast<double>(dy[i * oc + o]) * w[o * ic + k];
        dwr[o * ic + k] += static_cast<double>(dy[i * oc + o]) * x[i * ic + k];
      }
    }
  EXPECT_LT(RelErr(dx, dxr), 1e-6);
  EXPECT_LT(RelErr(dw, dwr), 1e-6);  // accumulated onto the 1.0 already there
  EXPECT_LT(RelErr(db, dbr), 1e-6);

  // accumulate_dinp adds.
  std::vector<float> dx2(n * ic, 5.0f);
  LinearBackward(ctx, dx2.data(), true, nullptr, nullptr, dy.data(), x.data(), w.data(), n, ic, oc);
  for (auto& v : dxr) v += 5.0;
  EXPECT_LT(RelErr(dx2, dxr), 1e-6);
}

// ------------------------------------------------------------ LayerNorm

TEST(OpsLayerNorm, ForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  const int n = 7, c = 40;
  const float eps = 1e-5f;
  Context ctx = Ctx(2);
  auto x = Randn(n * c, 10, 2.0f), g = Randn(c, 11), b = Randn(c, 12), wout = Randn(n * c, 13);
  for (auto& v : x) v += 3.0f;  // a non-zero mean
  std::vector<float> y(n * c), mean(n), rstd(n);
  LayerNormForward(ctx, y.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), n, c, eps);
  std::vector<double> yr(n * c);
  for (int i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int j = 0; j < c; ++j) m += x[i * c + j];
    m /= c;
    for (int j = 0; j < c; ++j) v += (x[i * c + j] - m) * (x[i * c + j] - m);
    v /= c;
    for (int j = 0; j < c; ++j) yr[i * c + j] = (x[i * c + j] - m) / std::sqrt(v + eps) * g[j] + b[j];
  }
  EXPECT_LT(RelErr(y, yr), 1e-6);

  std::vector<float> dx(n * c), dg(c, 0.0f), db(c, 0.0f);
  LayerNormBackward(ctx, dx.data(), false, dg.data(), db.data(), wout.data(), x.data(), g.data(),
                    mean.data(), rstd.data(), n, c);
  auto loss = [&]() {
    std::vector<float> yy(n * c), mm(n), rr(n);
    LayerNormForward(ctx, yy.data(), mm.data(), rr.data(), x.data(), g.data(), b.data(), n, c, eps);
    return Dot(yy, wout);
  };
  EXPECT_LT(RelErr(dx, NumGrad(x, loss, 1e-2f)), 5e-3);
  EXPECT_LT(RelErr(dg, NumGrad(g, loss, 1e-2f)), 5e-3);
  EXPECT_LT(RelErr(db, NumGrad(b, loss, 1e-2f)), 5e-3);
}

// ----------------------------------------------------------------- GELU

TEST(OpsGelu, ExactErfFormAndDerivative) {
  Context ctx = Ctx(1);
  auto x = Randn(300, 14, 2.0f);
  std::vector<float> y(x.size());
  GeluForward(ctx, y.data(), x.data(), x.size());
  std::vector<double> yr(x.size()), ytanh(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    yr[i] = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    ytanh[i] = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  EXPECT_LT(RelErr(y, yr), 1e-6);
  // The tanh approximation is measurably different, so this test tells them apart.
  EXPECT_GT(RelErr(std::vector<float>(ytanh.begin(), ytanh.end()), yr), 1e-5);

  auto w = Randn(x.size(), 15);
  std::vector<float> dx(x.size());
  GeluBackward(ctx, dx.data(), x.data(), w.data(), x.size());
  auto loss = [&]() {
    std::vector<float> yy(x.size());
    GeluForward(ctx, yy.data(), x.data(), x.size());
    return Dot(yy, w);
  };
  EXPECT_LT(RelErr(dx, NumGrad(x, loss, 1e-2f)), 2e-3);
}

// -------------------------------------------------------------- Softmax

TEST(OpsSoftmax, MatchesNaive) {
  const int rows = 5, cols = 33;
  auto x = Randn(rows * cols, 16, 5.0f);
  std::vector<float> y(x.size());
  SoftmaxRows(Ctx(2), y.data(), x.data(), rows, cols);
  std::vector<double> yr(x.size());
  for (int i = 0; i < rows; ++i) {
    double s = 0;
    for (int j = 0; j < cols; ++j) s += std::exp(static_cast<double>(x[i * cols + j]));
    for (int j = 0; j < cols; ++j) yr[i * cols + j] = std::exp(static_cast<double>(x[i * cols + j])) / s;
  }
  EXPECT_LT(RelErr(y, yr), 1e-6);
}

// ------------------------------------------------------------ Attention

struct AttnCase {
  int B = 2, L = 9, H = 12, nh = 3;
  std::vector<int32_t> mask;
  AttnCase() {
    mask.assign(B * L, 1);
    for (int j = 6; j < L; ++j) mask[1 * L + j] = 0;  // row 1 has 3 padding keys
  }
};

std::vector<double> NaiveAttention(const AttnCase& c, const std::vector<float>& qkv) {
  const int d = c.H / c.nh;
  std::vector<double> out(c.B * c.L * c.H, 0.0);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.nh; ++h)
      for (int i = 0; i < c.L; ++i) {
        std::vector<double> s(c.L);
        double mx = -1e300;
        for (int j = 0; j < c.L; ++j) {
          double v = 0;
          for (int e = 0; e < d; ++e)
            v += static_cast<double>(qkv[(b * c.L + i) * 3 * c.H + h * d + e]) *
                 qkv[(b * c.L + j) * 3 * c.H + c.H + h * d + e];
          v /= std::sqrt(static_cast<double>(d));
          // HF: + finfo(float32).min on padding keys.
          if (!c.mask[b * c.L + j]) v += -3.4028234663852886e38;
          s[j] = v;
          mx = std::max(mx, v);
        }
        double sum = 0;
        for (int j = 0; j < c.L; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j < c.L; ++j)
          for (int e = 0; e < d; ++e)
            out[(b * c.L + i) * c.H + h * d + e] +=
                s[j] / sum * qkv[(b * c.L + j) * 3 * c.H + 2 * c.H + h * d + e];
      }
  return out;
}

TEST(OpsAttention, ForwardMatchesNaiveWithPaddingMask) {
  AttnCase c;
  auto qkv = Randn(c.B * c.L * 3 * c.H, 17);
  std::vector<float> out(c.B * c.L * c.H), probs(c.B * c.nh * c.L * c.L);
  AttentionForward(Ctx(2), out.data(), probs.data(), qkv.data(), c.mask.data(), c.B, c.L, c.H,
                   c.nh);
  EXPECT_LT(RelErr(out, NaiveAttention(c, qkv)), 1e-6);
  // Masked keys have probability exactly 0; each row sums to 1.
  for (int h = 0; h < c.nh; ++h)
    for (int i = 0; i < c.L; ++i) {
      const float* p = &probs[((1 * c.nh + h) * c.L + i) * c.L];
      double s = 0;
      for (int j = 0; j < c.L; ++j) s += p[j];
      EXPECT_NEAR(s, 1.0, 1e-6);
      for (int j = 6; j < c.L; ++j) EXPECT_EQ(p[j], 0.0f);
    }
}

TEST(OpsAttention, BackwardMatchesFiniteDifferencesAndIsReproducible) {
  AttnCase c;
  auto qkv = Randn(c.B * c.L * 3 * c.H, 18);
  auto w = Randn(c.B * c.L * c.H, 19);
  Context ctx = Ctx(2);
  std::vector<float> out(c.B * c.L * c.H), probs(c.B * c.nh * c.L * c.L);
  AttentionForward(ctx, out.data(), probs.data(), qkv.data(), c.mask.data(), c.B, c.L, c.H, c.nh);
  std::vector<float> dqkv(qkv.size(), 7.0f);  // overwritten
  AttentionBackward(ctx, dqkv.data(), w.data(), qkv.data(), probs.data(), c.B, c.L, c.H, c.nh);
  auto loss = [&]() {
    std::vector<float> o(c.B * c.L * c.H), p(c.B * c.nh * c.L * c.L);
    AttentionForward(ctx, o.data(), p.data(), qkv.data(), c.mask.data(), c.B, c.L, c.H, c.nh);
    return Dot(o, w);
  };
  EXPECT_LT(RelErr(dqkv, NumGrad(qkv, loss, 1e-2f)), 5e-3);

  std::vector<float> again(qkv.size());
  AttentionBackward(ctx, again.data(), w.data(), qkv.data(), probs.data(), c.B, c.L, c.H, c.nh);
  EXPECT_EQ(0, std::memcmp(again.data(), dqkv.data(), again.size() * sizeof(float)));
}

// ------------------------------------------------------------ Embedding

TEST(OpsEmbedding, GatherAndScatterAddWithRepeatedIds) {
  const int V = 6, c = 40, n = 8;
  const std::vector<int32_t> ids = {1, 3, 1, 0, 5, 3, 1, -1};
  auto table = Randn(V * c, 20), dy = Randn(n * c, 21);
  std::vector<float> y(n * c);
  std::vector<int32_t> in_range(ids.begin(), ids.end() - 1);
  EmbeddingForward(Ctx(2), y.data(), in_range.data(), table.data(), n - 1, c);
  for (int i = 0; i < n - 1; ++i)
    for (int j = 0; j < c; ++j) EXPECT_EQ(y[i * c + j], table[ids[i] * c + j]);
  std::vector<float> y2 = y;
  EmbeddingAdd(Ctx(2), y2.data(), in_range.data(), table.data(), n - 1, c);
  for (int i = 0; i < n - 1; ++i)
    for (int j = 0; j < c; ++j) EXPECT_FLOAT_EQ(y2[i * c + j], 2 * table[ids[i] * c + j]);

  std::vector<float> dt(V * c, 1.0f);
  EmbeddingBackward(Ctx(2), dt.data(), ids.data(), dy.data(), n, c);
  std::vector<double> ref(V * c, 1.0);
  for (int i = 0; i < n; ++i)
    if (ids[i] >= 0)
      for (int j = 0; j < c; ++j) ref[ids[i] * c + j] += dy[i * c + j];
  EXPECT_LT(RelErr(dt, ref), 1e-6);
  // Row 2 and 4 (ids 2, 4) got nothing.
  for (int j = 0; j < c; ++j) EXPECT_EQ(dt[2 * c + j], 1.0f);
  // Thread count does not change the bits.
  std::vector<float> dt1(V * c, 1.0f);
  EmbeddingBackward(Ctx(1), dt1.data(), ids.data(), dy.data(), n, c);
  EXPECT_EQ(0, std::memcmp(dt1.data(), dt.data(), dt.size() * sizeof(float)));
}

// -------------------------------------------------------- Cross-entropy

TEST(OpsCrossEntropy, LossGradientAndIgnoreIndex) {
  const int n = 6, v = 50;
  auto x = Randn(n * v, 22, 3.0f);
  const std::vector<int32_t> t = {3, -100, 49, 0, -100, 7};
  int64_t cnt = 0;
  std::vector<float> g(n * v, 9.0f);
  const double loss = CrossEntropy(Ctx(2), g.data(), x.data(), t.data(), n, v, 0.25f, &cnt);
  EXPECT_EQ(cnt, 4);
  double ref = 0;
  for (int i = 0; i < n; ++i) {
    if (t[i] < 0) continue;
    double s = 0;
    for (int j = 0; j < v; ++j) s += std::exp(static_cast<double>(x[i * v + j]));
    ref += std::log(s) - x[i * v + t[i]];
  }
  EXPECT_NEAR(loss, ref, 1e-9 * std::abs(ref) + 1e-9);
  for (int j = 0; j < v; ++j) {
    EXPECT_EQ(g[1 * v + j], 0.0f);
    EXPECT_EQ(g[4 * v + j], 0.0f);
  }
  auto f = [&]() { return 0.25 * CrossEntropy(Ctx(1), nullptr, x.data(), t.data(), n, v, 1.0f, nullptr); };
  EXPECT_LT(RelErr(g, NumGrad(x, f, 1e-2f)), 2e-3);

  // In place (dlogits aliasing logits) gives the same gradient.
  std::vector<float> inplace = x;
  CrossEntropy(Ctx(2), inplace.data(), inplace.data(), t.data(), n, v, 0.25f, nullptr);
  EXPECT_EQ(0, std::memcmp(inplace.data(), g.data(), g.size() * sizeof(float)));
}

TEST(OpsArgmax, FirstMaximum) {
  const std::vector<float> x = {1, 5, 5, 0, -1, -2, -3, -1};
  std::vector<int32_t> out(2);
  ArgmaxRows(Ctx(1), out.data(), x.data(), 2, 4);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 0);
}

// Large enough that every kernel takes its parallel path: the results must
// be bit-identical to the serial ones (static splits, no cross-thread sums).
TEST(OpsParallel, EveryKernelMatchesSerialBitForBit) {
  const int B = 4, L = 32, H = 64, nh = 4, n = B * L;
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  auto x = Randn(n * H, 30), g = Randn(H, 31), bt = Randn(H, 32), dy = Randn(n * H, 33);
  std::vector<int32_t> mask(n, 1), ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 7) % 50;
  for (int j = 20; j < L; ++j) mask[L + j] = 0;
  auto qkv = Randn(n * 3 * H, 34);
  auto logits = Randn(n * 200, 35);
  std::vector<int32_t> tg(n);
  for (int i = 0; i < n; ++i) tg[i] = i % 3 == 0 ? -100 : (i * 13) % 200;
  std::vector<std::vector<float>> res[2];
  for (int threads : {1, 2}) {
    Context ctx = Ctx(threads);
    auto& r = res[threads - 1];
    std::vector<float> y(n * H), mean(n), rstd(n), dx(n * H), dg(H, 0.0f), db(H, 0.0f);
    LayerNormForward(ctx, y.data(), mean.data(), rstd.data(), x.data(), g.data(), bt.data(), n, H, 1e-12f);
    LayerNormBackward(ctx, dx.data(), false, dg.data(), db.data(), dy.data(), x.data(), g.data(),
                      mean.data(), rstd.data(), n, H);
    r.insert(r.end(), {y, dx, dg, db});
    std::vector<float> ge(n * H), gb(n * H);
    GeluForward(ctx, ge.data(), x.data(), n * H);
    GeluBackward(ctx, gb.data(), x.data(), dy.data(), n * H);
    r.insert(r.end(), {ge, gb});
    std::vector<float> ao(n * H), pr(B * nh * L * L), dq(n * 3 * H);
    AttentionForward(ctx, ao.data(), pr.data(), qkv.data(), mask.data(), B, L, H, nh);
    AttentionBackward(ctx, dq.data(), dy.data(), qkv.data(), pr.data(), B, L, H, nh);
    r.insert(r.end(), {ao, pr, dq});
    std::vector<float> tab(50 * H, 0.0f), cs(H, 0.0f), emb(n * H);
    EmbeddingBackward(ctx, tab.data(), ids.data(), dy.data(), n, H);
    EmbeddingForward(ctx, emb.data(), ids.data(), tab.data(), n, H);
    ColumnSumAdd(ctx, cs.data(), dy.data(), n, H);
    r.insert(r.end(), {tab, cs, emb});
    std::vector<float> dl(logits.size());
    const double loss = CrossEntropy(ctx, dl.data(), logits.data(), tg.data(), n, 200, 0.5f, nullptr);
    r.insert(r.end(), {dl, std::vector<float>{static_cast<float>(loss)}});
  }
  ASSERT_EQ(res[0].size(), res[1].size());
  for (size_t k = 0; k < res[0].size(); ++k) EXPECT_TRUE(same(res[0][k], res[1][k])) << "output " << k;
}

}  // namespace
}  // namespace cpu
}  // namespace dgca
