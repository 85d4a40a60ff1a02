#include "model/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#ifdef DGCA_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "model/core/dropout.h"

namespace dgca {
namespace cpu {

bool HaveBlas() {
#ifdef DGCA_HAVE_OPENBLAS
  return true;
#else
  return false;
#endif
}

void SetBlasThreads() {
#ifdef DGCA_HAVE_OPENBLAS
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
#endif
}

// ---------------------------------------------------------------------------
// GEMM

void GemmBuiltin(const Context& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                 const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  // op(B) as a contiguous [K,N] panel, so the inner loop is an axpy over a row
  // of C that the compiler vectorizes (a dot-product form would be a float
  // reduction, which it may not reorder).
  std::vector<float> bt;
  const float* Bk = B;
  int ldbk = ldb;
  if (trans_b) {
    bt.resize(static_cast<size_t>(K) * N);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        bt[static_cast<size_t>(k) * N + n] = B[static_cast<size_t>(n) * ldb + k];
    Bk = bt.data();
    ldbk = N;
  }
  constexpr int kRowBlock = 4;    // C rows updated per pass over a B row
  constexpr int kColBlock = 512;  // C columns kept hot in L1
  const int row_blocks = (M + kRowBlock - 1) / kRowBlock;
  ParallelFor(ctx, row_blocks, static_cast<int64_t>(M) * N * K, [&](int64_t rb0, int64_t rb1) {
    for (int rb = static_cast<int>(rb0); rb < rb1; ++rb) {
      const int i0 = rb * kRowBlock, i1 = std::min(M, i0 + kRowBlock);
      for (int j0 = 0; j0 < N; j0 += kColBlock) {
        const int j1 = std::min(N, j0 + kColBlock);
        float acc[kRowBlock][kColBlock];
        for (int i = i0; i < i1; ++i)
          for (int j = j0; j < j1; ++j) acc[i - i0][j - j0] = 0.0f;
        for (int k = 0; k < K; ++k) {
          const float* brow = Bk + static_cast<size_t>(k) * ldbk;
          for (int i = i0; i < i1; ++i) {
            const float a =
                trans_a ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
            float* arow = acc[i - i0];
            for (int j = j0; j < j1; ++j) arow[j - j0] += a * brow[j];
          }
        }
        for (int i = i0; i < i1; ++i) {
          float* crow = C + static_cast<size_t>(i) * ldc;
          for (int j = j0; j < j1; ++j) {
            const float v = alpha * acc[i - i0][j - j0];
            crow[j] = beta == 0.0f ? v : v + beta * crow[j];
          }
        }
      }
    }
  });
}

void Gemm(const Context& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef DGCA_HAVE_OPENBLAS
  if (K <= 0) {  // BLAS leaves C untouched for K == 0 only when beta == 1.
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float& c = C[static_cast<size_t>(i) * ldc + j];
        c = beta == 0.0f ? 0.0f : beta * c;
      }
    return;
  }
  SetBlasThreads();
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  // Split the larger output dimension into one block per thread; every
  // element is computed inside one single-threaded BLAS call.
  const int64_t work = static_cast<int64_t>(M) * N * K;
  if (M >= N) {
    ParallelFor(ctx, M, work, [&](int64_t i0, int64_t i1) {
      const float* a = trans_a ? A + i0 : A + i0 * lda;
      cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(i1 - i0), N, K, alpha, a, lda, B, ldb,
                  beta, C + i0 * ldc, ldc);
    });
  } else {
    ParallelFor(ctx, N, work, [&](int64_t j0, int64_t j1) {
      const float* b = trans_b ? B + j0 * ldb : B + j0;
      cblas_sgemm(CblasRowMajor, ta, tb, M, static_cast<int>(j1 - j0), K, alpha, A, lda, b, ldb,
                  beta, C + j0, ldc);
    });
  }
#else
  GemmBuiltin(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

// ---------------------------------------------------------------------------
// Linear

void LinearForward(const Context& ctx, float* out, const float* inp, const float* w, const float* b,
                   int n, int ic, int oc) {
  if (b != nullptr) {
    ParallelFor(ctx, n, static_cast<int64_t>(n) * oc, [&](int64_t i0_, int64_t i1_) {
      for (int i = static_cast<int>(i0_); i < i1_; ++i)
        std::memcpy(out + static_cast<size_t>(i) * oc, b, sizeof(float) * oc);
    });
  }
  Gemm(ctx, false, true, n, oc, ic, 1.0f, inp, ic, w, ic, b != nullptr ? 1.0f : 0.0f, out, oc);
}

void LinearBackward(const Context& ctx, float* dinp, bool accumulate_dinp, float* dw, float* db,
                    const float* dout, const float* inp, const float* w, int n, int ic, int oc) {
  if (dinp != nullptr)
    Gemm(ctx, false, false, n, ic, oc, 1.0f, dout, oc, w, ic, accumulate_dinp ? 1.0f : 0.0f, dinp,
         ic);
  if (dw != nullptr) Gemm(ctx, true, false, oc, ic, n, 1.0f, dout, oc, inp, ic, 1.0f, dw, ic);
  if (db != nullptr) ColumnSumAdd(ctx, db, dout, n, oc);
}

void ColumnSumAdd(const Context& ctx, float* dst, const float* src, int rows, int cols) {
  // Column ranges per thread, rows in order inside: independent of the
  // thread count.
  ParallelFor(ctx, cols, static_cast<int64_t>(rows) * cols, [&](int64_t c0, int64_t c1) {
    for (int r = 0; r < rows; ++r) {
      const float* s = src + static_cast<size_t>(r) * cols;
      for (int64_t c = c0; c < c1; ++c) dst[c] += s[c];
    }
  });
}

// ---------------------------------------------------------------------------
// LayerNorm

void LayerNormForward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                      const float* gamma, const float* beta, int n, int c, float eps) {
  ParallelFor(ctx, n, static_cast<int64_t>(n) * c, [&](int64_t i0_, int64_t i1_) {
    for (int i = static_cast<int>(i0_); i < i1_; ++i) {
      const float* x = inp + static_cast<size_t>(i) * c;
      float* y = out + static_cast<size_t>(i) * c;
      double s = 0;
      for (int j = 0; j < c; ++j) s += x[j];
      const double m = s / c;
      double v = 0;
      for (int j = 0; j < c; ++j) {
        const double d = x[j] - m;
        v += d * d;
      }
      v /= c;  // biased variance, as torch.nn.LayerNorm
      const float rs = static_cast<float>(1.0 / std::sqrt(v + static_cast<double>(eps)));
      const float mf = static_cast<float>(m);
      for (int j = 0; j < c; ++j) y[j] = (x[j] - mf) * rs * gamma[j] + beta[j];
      mean[i] = mf;
      rstd[i] = rs;
    }
  });
}

void LayerNormBackward(const Context& ctx, float* dinp, bool accumulate, float* dgamma,
                       float* dbeta, const float* dout, const float* inp, const float* gamma,
                       const float* mean, const float* rstd, int n, int c) {
  const int64_t work = static_cast<int64_t>(n) * c;
  if (dinp != nullptr) {
    ParallelFor(ctx, n, work, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float* x = inp + static_cast<size_t>(i) * c;
        const float* dy = dout + static_cast<size_t>(i) * c;
        float* dx = dinp + static_cast<size_t>(i) * c;
        const float m = mean[i], rs = rstd[i];
        // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
        double sg = 0, sgx = 0;
        for (int j = 0; j < c; ++j) {
          const float g = dy[j] * gamma[j];
          sg += g;
          sgx += static_cast<double>(g) * ((x[j] - m) * rs);
        }
        const float mg = static_cast<float>(sg / c), mgx = static_cast<float>(sgx / c);
        for (int j = 0; j < c; ++j) {
          const float xhat = (x[j] - m) * rs;
          const float v = rs * (dy[j] * gamma[j] - mg - xhat * mgx);
          dx[j] = accumulate ? dx[j] + v : v;
        }
      }
    });
  }
  if (dgamma == nullptr && dbeta == nullptr) return;
  // Column ranges per thread, rows in order inside: independent of the
  // thread count.
  ParallelFor(ctx, c, work, [&](int64_t c0, int64_t c1) {
    for (int i = 0; i < n; ++i) {
      const float* x = inp + static_cast<size_t>(i) * c;
      const float* dy = dout + static_cast<size_t>(i) * c;
      const float m = mean[i], rs = rstd[i];
      for (int64_t j = c0; j < c1; ++j) {
        if (dgamma != nullptr) dgamma[j] += dy[j] * ((x[j] - m) * rs);
        if (dbeta != nullptr) dbeta[j] += dy[j];
      }
    }
  });
}

// ---------------------------------------------------------------------------
// GELU (exact erf form, as BERT / HF "gelu")

void GeluForward(const Context& ctx, float* out, const float* inp, int64_t n) {
  const float inv_sqrt2 = static_cast<float>(M_SQRT1_2);
  ParallelFor(ctx, n, n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float x = inp[i];
      out[i] = 0.5f * x * (1.0f + std::erf(x * inv_sqrt2));
    }
  });
}

void GeluBackward(const Context& ctx, float* dinp, const float* inp, const float* dout, int64_t n) {
  const float inv_sqrt2 = static_cast<float>(M_SQRT1_2);
  const float inv_sqrt2pi = static_cast<float>(0.3989422804014327);  // 1/sqrt(2 pi)
  ParallelFor(ctx, n, n, [&](int64_t i0_, int64_t i1_) {
    for (int64_t i = static_cast<int64_t>(i0_); i < i1_; ++i) {
      const float x = inp[i];
      const float cdf = 0.5f * (1.0f + std::erf(x * inv_sqrt2));
      const float pdf = inv_sqrt2pi * std::exp(-0.5f * x * x);
      dinp[i] = dout[i] * (cdf + x * pdf);
    }
  });
}

// ---------------------------------------------------------------------------
// Softmax

namespace {
inline void SoftmaxRow(float* y, const float* x, int cols) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < cols; ++j) mx = std::max(mx, x[j]);
  double s = 0;
  for (int j = 0; j < cols; ++j) {
    const float e = std::exp(x[j] - mx);
    y[j] = e;
    s += e;
  }
  const float inv = static_cast<float>(1.0 / s);
  for (int j = 0; j < cols; ++j) y[j] *= inv;
}
}  // namespace

void SoftmaxRows(const Context& ctx, float* out, const float* inp, int rows, int cols) {
  ParallelFor(ctx, rows, static_cast<int64_t>(rows) * cols, [&](int64_t i0_, int64_t i1_) {
    for (int i = static_cast<int>(i0_); i < i1_; ++i)
      SoftmaxRow(out + static_cast<size_t>(i) * cols, inp + static_cast<size_t>(i) * cols, cols);
  });
}

// ---------------------------------------------------------------------------
// Attention

// Per (batch row, head) task, as small single-threaded GEMMs on strided
// views of qkv (a head's q, k or v is an [L, d] block with row stride 3H):
//   S = scale Q K^T, P = masked row softmax(S), O = P V.
namespace {

// out[i, j] = in[i, j] * M[i, j] / (1 - p) over the [L, L] block of one
// (b, h); out may alias in.
void DropProbs(float* out, const float* in, int L, int h, uint64_t site_key, uint32_t threshold,
               float scale) {
  for (int i = 0; i < L; ++i)
    for (int j = 0; j < L; ++j) {
      const size_t o = static_cast<size_t>(i) * L + j;
      out[o] = DropoutKeep(site_key, DropoutProbsIndex(h, i, j), threshold) ? in[o] * scale : 0.0f;
    }
}

}  // namespace

void AttentionForward(const Context& ctx, float* out, float* probs, const float* qkv,
                      const int32_t* mask, int B, int L, int H, int nh, const AttentionDropout& drop) {
  const int d = H / nh;
  const int H3 = 3 * H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const uint32_t threshold = drop.on() ? DropoutThreshold(drop.p) : 0u;
  const float drop_scale = DropoutScale(drop.p);
  const Context serial;
  ParallelFor(ctx, B * nh, static_cast<int64_t>(B) * nh * L * L * d, [&](int64_t t0, int64_t t1) {
    std::vector<float> pd(drop.on() ? static_cast<size_t>(L) * L : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int b = static_cast<int>(t / nh), h = static_cast<int>(t % nh);
      const float* base = qkv + static_cast<size_t>(b) * L * H3;
      const float* q = base + h * d;
      const float* k = base + H + h * d;
      const float* v = base + 2 * H + h * d;
      const int32_t* m = mask + static_cast<size_t>(b) * L;
      float* p = probs + static_cast<size_t>(t) * L * L;
      Gemm(serial, false, true, L, L, d, scale, q, H3, k, H3, 0.0f, p, L);
      for (int i = 0; i < L; ++i) {
        float* row = p + static_cast<size_t>(i) * L;
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < L; ++j)
          if (m[j] != 0) mx = std::max(mx, row[j]);
        double sum = 0;
        for (int j = 0; j < L; ++j) {
          // Like HF's additive dtype-min mask: exactly 0 weight on padding keys.
          const float e = m[j] != 0 ? std::exp(row[j] - mx) : 0.0f;
          row[j] = e;
          sum += e;
        }
        const float inv = sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
        for (int j = 0; j < L; ++j) row[j] *= inv;
      }
      const float* pv = p;
      if (drop.on()) {
        DropProbs(pd.data(), p, L, h, DropoutSiteKey(drop.keys[b], drop.layer, kDropAttnProbs), threshold,
                  drop_scale);
        pv = pd.data();
      }
      Gemm(serial, false, false, L, d, L, 1.0f, pv, L, v, H3, 0.0f,
           out + static_cast<size_t>(b) * L * H + h * d, H);
    }
  });
}

// dV = Pd^T dO; dPd = dO V^T; dP = dPd * M / (1-p) (dP = dPd without
// dropout); dS = P * (dP - rowsum(P * dP)); dQ = scale dS K; dK = scale dS^T Q.
void AttentionBackward(const Context& ctx, float* dqkv, const float* dout, const float* qkv,
                       const float* probs, int B, int L, int H, int nh, const AttentionDropout& drop) {
  const int d = H / nh;
  const int H3 = 3 * H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const uint32_t threshold = drop.on() ? DropoutThreshold(drop.p) : 0u;
  const float drop_scale = DropoutScale(drop.p);
  const Context serial;
  ParallelFor(ctx, B * nh, static_cast<int64_t>(B) * nh * L * L * d, [&](int64_t t0, int64_t t1) {
    std::vector<float> ds(static_cast<size_t>(L) * L);
    std::vector<float> pd(drop.on() ? static_cast<size_t>(L) * L : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int b = static_cast<int>(t / nh), h = static_cast<int>(t % nh);
      const float* base = qkv + static_cast<size_t>(b) * L * H3;
      float* dbase = dqkv + static_cast<size_t>(b) * L * H3;
      const float* q = base + h * d;
      const float* k = base + H + h * d;
      const float* v = base + 2 * H + h * d;
      const float* go = dout + static_cast<size_t>(b) * L * H + h * d;
      const float* p = probs + static_cast<size_t>(t) * L * L;
      const float* pv = p;
      const uint64_t site = drop.on() ? DropoutSiteKey(drop.keys[b], drop.layer, kDropAttnProbs) : 0;
      if (drop.on()) {
        DropProbs(pd.data(), p, L, h, site, threshold, drop_scale);
        pv = pd.data();
      }
      Gemm(serial, true, false, L, d, L, 1.0f, pv, L, go, H, 0.0f, dbase + 2 * H + h * d, H3);
      Gemm(serial, false, true, L, L, d, 1.0f, go, H, v, H3, 0.0f, ds.data(), L);
      if (drop.on()) DropProbs(ds.data(), ds.data(), L, h, site, threshold, drop_scale);  // dP = dPd M / (1-p)
      for (int i = 0; i < L; ++i) {
        const float* pr = p + static_cast<size_t>(i) * L;
        float* dr = ds.data() + static_cast<size_t>(i) * L;
        double dot = 0;
        for (int j = 0; j < L; ++j) dot += static_cast<double>(pr[j]) * dr[j];
        const float dotf = static_cast<float>(dot);
        for (int j = 0; j < L; ++j) dr[j] = pr[j] * (dr[j] - dotf);
      }
      Gemm(serial, false, false, L, d, L, scale, ds.data(), L, k, H3, 0.0f, dbase + h * d, H3);
      Gemm(serial, true, false, L, d, L, scale, ds.data(), L, q, H3, 0.0f, dbase + H + h * d, H3);
    }
  });
}

void DropoutRows(const Context& ctx, float* out, const float* in, const float* residual,
                 const uint64_t* keys, int layer, int site, float p, int B, int L, int H) {
  const uint32_t threshold = DropoutThreshold(p);
  const float scale = DropoutScale(p);
  const int64_t N = static_cast<int64_t>(B) * L;
  ParallelFor(ctx, N, N * H, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int b = static_cast<int>(i / L), pos = static_cast<int>(i % L);
      const uint64_t key = DropoutSiteKey(keys[b], layer, site);
      const float* x = in + i * H;
      const float* r = residual != nullptr ? residual + i * H : nullptr;
      float* y = out + i * H;
      for (int j = 0; j < H; ++j) {
        float v = DropoutKeep(key, DropoutHiddenIndex(pos, j), threshold) ? x[j] * scale : 0.0f;
        if (r != nullptr) v += r[j];
        y[j] = v;
      }
    }
  });
}

void DropoutProbs(const Context& ctx, float* out, const float* in, const AttentionDropout& drop, int B,
                  int nh, int L) {
  const uint32_t threshold = DropoutThreshold(drop.p);
  const float scale = DropoutScale(drop.p);
  const size_t block = static_cast<size_t>(L) * L;
  ParallelFor(ctx, B * nh, static_cast<int64_t>(B) * nh * block, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int b = static_cast<int>(t / nh), h = static_cast<int>(t % nh);
      DropProbs(out + t * block, in + t * block, L, h, DropoutSiteKey(drop.keys[b], drop.layer, kDropAttnProbs),
                threshold, scale);
    }
  });
}

// ---------------------------------------------------------------------------
// Embeddings

void EmbeddingForward(const Context& ctx, float* out, const int32_t* ids, const float* table, int n,
                      int c) {
  ParallelFor(ctx, n, static_cast<int64_t>(n) * c, [&](int64_t i0_, int64_t i1_) {
    for (int i = static_cast<int>(i0_); i < i1_; ++i)
      std::memcpy(out + static_cast<size_t>(i) * c, table + static_cast<size_t>(ids[i]) * c,
                  sizeof(float) * c);
  });
}

void EmbeddingAdd(const Context& ctx, float* out, const int32_t* ids, const float* table, int n,
                  int c) {
  ParallelFor(ctx, n, static_cast<int64_t>(n) * c, [&](int64_t i0_, int64_t i1_) {
    for (int i = static_cast<int>(i0_); i < i1_; ++i) {
      float* o = out + static_cast<size_t>(i) * c;
      const float* r = table + static_cast<size_t>(ids[i]) * c;
      for (int j = 0; j < c; ++j) o[j] += r[j];
    }
  });
}

void EmbeddingBackward(const Context& ctx, float* dtable, const int32_t* ids, const float* dout,
                       int n, int c) {
  // Split by columns, rows in order: no two threads touch one element, and
  // repeated ids are summed in row order whatever the thread count.
  // Column ranges per thread, rows in order inside: independent of the
  // thread count.
  ParallelFor(ctx, c, static_cast<int64_t>(n) * c, [&](int64_t c0, int64_t c1) {
    for (int i = 0; i < n; ++i) {
      if (ids[i] < 0) continue;
      float* t = dtable + static_cast<size_t>(ids[i]) * c;
      const float* g = dout + static_cast<size_t>(i) * c;
      for (int64_t j = c0; j < c1; ++j) t[j] += g[j];
    }
  });
}

// ---------------------------------------------------------------------------
// Cross-entropy

double CrossEntropy(const Context& ctx, float* dlogits, const float* logits, const int32_t* targets,
                    int n, int v, float dscale, int64_t* counted) {
  std::vector<double> row_loss(static_cast<size_t>(n), 0.0);
  ParallelFor(ctx, n, static_cast<int64_t>(n) * v, [&](int64_t i0_, int64_t i1_) {
    for (int i = static_cast<int>(i0_); i < i1_; ++i) {
      const float* x = logits + static_cast<size_t>(i) * v;
      const int32_t t = targets[i];
      if (t < 0 || t >= v) {
        if (dlogits != nullptr)
          std::memset(dlogits + static_cast<size_t>(i) * v, 0, sizeof(float) * v);
        continue;
      }
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < v; ++j) mx = std::max(mx, x[j]);
      const float xt = x[t];  // before g (which may alias x) is written
      // One float exp per logit (kept in g for the gradient), summed in double.
      double s = 0;
      float* g = dlogits != nullptr ? dlogits + static_cast<size_t>(i) * v : nullptr;
      if (g != nullptr) {
        for (int j = 0; j < v; ++j) {
          const float e = std::exp(x[j] - mx);
          g[j] = e;
          s += e;
        }
      } else {
        for (int j = 0; j < v; ++j) s += std::exp(x[j] - mx);
      }
      row_loss[i] = std::log(s) + mx - xt;
      if (g != nullptr) {
        const float f = static_cast<float>(dscale / s);
        for (int j = 0; j < v; ++j) g[j] *= f;
        g[t] -= dscale;
      }
    }
  });
  double total = 0;
  int64_t cnt = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t t = targets[i];
    if (t < 0 || t >= v) continue;
    total += row_loss[i];
    ++cnt;
  }
  if (counted != nullptr) *counted = cnt;
  return total;
}

void ArgmaxRows(const Context& ctx, int32_t* out, const float* x, int n, int v) {
  ParallelFor(ctx, n, static_cast<int64_t>(n) * v, [&](int64_t i0_, int64_t i1_) {
    for (int i = static_cast<int>(i0_); i < i1_; ++i) {
      const float* r = x + static_cast<size_t>(i) * v;
      int best = 0;
      for (int j = 1; j < v; ++j)
        if (r[j] > r[best]) best = j;
      out[i] = best;
    }
  });
}

}  // namespace cpu
}  // namespace dgca
