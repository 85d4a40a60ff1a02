#include "model/nn/heads.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

// Parallel per-slot loops: `nt_` (a local int) threads; a no-op without
// OpenMP. Every loop so marked writes only its own slot's outputs.
#ifdef _OPENMP
#define DGCA_HEADS_PARALLEL_FOR _Pragma("omp parallel for schedule(static) num_threads(nt_) if (nt_ > 1)")
#else
#define DGCA_HEADS_PARALLEL_FOR
#endif

#include "model/core/rng.h"
#include "model/cpu/ops.h"

namespace dgca {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Row-major C[M,N] = beta*C + op(A)[M,Kd] · op(B)[Kd,N], on the calling
// thread: the shared kernel of model/cpu/ops.h with alpha 1.
void Gemm(bool ta, bool tb, int M, int N, int Kd, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  cpu::Gemm(cpu::Context{}, ta, tb, M, N, Kd, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// log(1 + exp(v)), stable for any v.
double Softplus(double v) { return std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v))); }
double Sigmoid(double v) {
  if (v >= 0) return 1.0 / (1.0 + std::exp(-v));
  const double e = std::exp(v);
  return e / (1.0 + e);
}
double LogAddExp(double a, double b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::fabs(a - b)));
}

// Exact (erf) GELU and its derivative.
inline float Gelu(float a) { return 0.5f * a * (1.0f + std::erf(a * 0.70710678118654752f)); }
inline float GeluGrad(float a) {
  const float cdf = 0.5f * (1.0f + std::erf(a * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * std::exp(-0.5f * a * a);
  return cdf + a * pdf;
}

// exp(x) in float, branch-free so the V-wide loops vectorize: Cephes'
// expf (range reduction by ln 2 in two parts, degree-6 polynomial),
// relative error < 3e-7 on [-87, 88] (heads_test checks it against
// std::exp). x is clamped to [-87, 88]: exp(-87) ≈ 1.6e-38 stands in for
// anything smaller, which no softmax sum or gradient can tell apart.
inline float ExpF(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // n = round(x·log2 e) with the 1.5·2^23 trick (vectorizes on plain SSE2).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 127]
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

#ifdef __SSE2__
// Four lanes of ExpF with SSE2 intrinsics (plain loops do not vectorize
// here: GCC will not if-convert float compares under -ftrapping-math).
// Same operations in the same order as ExpF, so lanes and scalar agree.
inline __m128 ExpF4(__m128 x) {
  x = _mm_min_ps(_mm_max_ps(x, _mm_set1_ps(-87.0f)), _mm_set1_ps(88.0f));
  const __m128 magic = _mm_set1_ps(12582912.0f);
  const __m128 n = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)), magic), magic);
  const __m128 r = _mm_sub_ps(_mm_sub_ps(x, _mm_mul_ps(n, _mm_set1_ps(0.693359375f))),
                              _mm_mul_ps(n, _mm_set1_ps(-2.12194440e-4f)));
  __m128 p = _mm_set1_ps(1.9875691500e-4f);
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.3981999507e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(8.3334519073e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(4.1665795894e-2f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.6666665459e-1f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(5.0000001201e-1f));
  p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), r), _mm_set1_ps(1.0f));
  const __m128i bits =
      _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(n), _mm_set1_epi32(127)), 23);
  return _mm_mul_ps(p, _mm_castsi128_ps(bits));
}
#endif

// Row max and Σ exp(z − max) of a float row. The sum is kept in fixed
// partial sums (double), so the result does not depend on threads.
// logsumexp = max + log(sum).
void RowMaxSum(const float* z, int V, float* max_out, double* sum_out) {
  int j = 0;
  float m = z[0];
  double s = 0.0;
#ifdef __SSE2__
  __m128 m4 = _mm_set1_ps(z[0]);
  for (; j + 4 <= V; j += 4) m4 = _mm_max_ps(m4, _mm_loadu_ps(z + j));
  float mm[4];
  _mm_storeu_ps(mm, m4);
  m = std::max(std::max(mm[0], mm[1]), std::max(mm[2], mm[3]));
  for (; j < V; ++j) m = std::max(m, z[j]);
  const __m128 mv = _mm_set1_ps(m);
  __m128d a0 = _mm_setzero_pd(), a1 = _mm_setzero_pd();
  for (j = 0; j + 4 <= V; j += 4) {
    const __m128 e = ExpF4(_mm_sub_ps(_mm_loadu_ps(z + j), mv));
    a0 = _mm_add_pd(a0, _mm_cvtps_pd(e));
    a1 = _mm_add_pd(a1, _mm_cvtps_pd(_mm_movehl_ps(e, e)));
  }
  double aa[4];
  _mm_storeu_pd(aa, a0);
  _mm_storeu_pd(aa + 2, a1);
  s = (aa[0] + aa[1]) + (aa[2] + aa[3]);
#else
  for (; j < V; ++j) m = std::max(m, z[j]);
  j = 0;
#endif
  for (; j < V; ++j) s += ExpF(z[j] - m);
  *max_out = m;
  *sum_out = s;
}

// out[j] = c·exp(z[j] − m) for j < V.
void ScaledExpRow(float* out, const float* z, int V, float m, float c) {
  int j = 0;
#ifdef __SSE2__
  const __m128 mv = _mm_set1_ps(m), cv = _mm_set1_ps(c);
  for (; j + 4 <= V; j += 4)
    _mm_storeu_ps(out + j, _mm_mul_ps(cv, ExpF4(_mm_sub_ps(_mm_loadu_ps(z + j), mv))));
#endif
  for (; j < V; ++j) out[j] = c * ExpF(z[j] - m);
}

}  // namespace

float HeadsExpF(float x) { return ExpF(x); }

DgcaHeads::DgcaHeads(const ModelConfig& cfg, int max_slots)
    : H_(cfg.hidden),
      K_(std::max(1, cfg.candidate_top_k)),
      V_cfg_(cfg.vocab_size),
      max_slots_(std::max(0, max_slots)),
      eps_(cfg.layer_norm_eps),
      detector_(cfg.detector),
      candidate_(cfg.candidate),
      gated_(cfg.fusion == FusionKind::kGated && cfg.candidate),
      lambda_det_(cfg.lambda_detector),
      lambda_cand_(cfg.lambda_candidate) {}

int64_t DgcaHeads::NumParams(const ModelConfig& cfg) {
  const int64_t H = cfg.hidden;
  int64_t n = 0;
  if (cfg.detector) n += H + 1;
  if (cfg.candidate) n += H * H + 3 * H;
  if (cfg.candidate && cfg.fusion == FusionKind::kGated) n += H + 1 + (cfg.detector ? 1 : 0);
  return n;
}

Status DgcaHeads::Declare(ParamStore* store) {
  return p_.ForEach(H_, detector_, candidate_, gated_, ParamDeclarer(store, "DgcaHeads::Declare"));
}

Status DgcaHeads::Bind(ParamStore* store) {
  if (!store->finalized())
    return FailedPreconditionError("DgcaHeads::Bind: call ParamStore::Finalize() first");
  DGCA_RETURN_IF_ERROR(p_.ForEach(H_, detector_, candidate_, gated_, ParamFinder(*store, "DgcaHeads::Bind")));
  store_ = store;
  const size_t T = static_cast<size_t>(max_slots_);
  const size_t TH = T * static_cast<size_t>(H_);
  const size_t TK = T * static_cast<size_t>(K_);
  cand_.assign(TK, -1);
  y_.assign(T, 0);
  label_.assign(T, 0);
  e_.assign(T, 0.0f);
  gl_.assign(T, 0.0f);
  lse_.assign(T, 0.0);
  zmax_.assign(T, 0.0f);
  zsum_.assign(T, 1.0);
  loss_t_.assign(3 * T, 0.0);
  wA_.assign(T, 1.0);
  wB_.assign(T, 0.0);
  logQ_.assign(T, kNegInf);
  dl_.assign(T, 0.0f);
  de_.assign(T, 0.0f);
  if (candidate_) {
    act_.assign(TH, 0.0f);
    gel_.assign(TH, 0.0f);
    nrm_.assign(TH, 0.0f);
    u_.assign(TH, 0.0f);
    rstd_.assign(T, 0.0f);
    logq_.assign(TK, kNegInf);
    ds_.assign(TK, 0.0f);
    du_.assign(TH, 0.0f);
    da_.assign(TH, 0.0f);
  }
  bound_ = true;
  return OkStatus();
}

void DgcaHeads::InitParams(uint64_t seed) {
  if (!bound_) return;
  SplitMix64 rng(seed ^ 0x6467636168656164ULL);
  auto normal = [&](int idx, double std) {
    if (idx < 0) return;
    float* v = store_->value(idx);
    for (int64_t i = 0; i < store_->info(idx).numel; ++i) v[i] = static_cast<float>(std * rng.NextNormal());
  };
  auto fill = [&](int idx, float c) {
    if (idx < 0) return;
    float* v = store_->value(idx);
    std::fill(v, v + store_->info(idx).numel, c);
  };
  normal(p_.det_w, 0.02);
  fill(p_.det_b, 0.0f);
  normal(p_.cd_w, 0.02);
  fill(p_.cd_b, 0.0f);
  fill(p_.ln_w, 1.0f);
  fill(p_.ln_b, 0.0f);
  normal(p_.g_w, 0.02);
  fill(p_.g_a, 1.0f);
  fill(p_.g_b, 0.0f);
}

Status DgcaHeads::CheckInputs(const int32_t* cand, const int32_t* x, const int32_t* y, int T,
                              int V) const {
  if (!bound_) return FailedPreconditionError("DgcaHeads: Bind() was not called");
  if (T < 0 || T > max_slots_)
    return InvalidArgumentError("DgcaHeads: " + std::to_string(T) +
                                " target slots; valid is 0.." + std::to_string(max_slots_) +
                                " (max_slots)");
  if (V < 1) return InvalidArgumentError("DgcaHeads: vocabulary size " + std::to_string(V) +
                                         " must be >= 1");
  for (int t = 0; t < T; ++t) {
    if (x != nullptr && (x[t] < 0 || x[t] >= V))
      return InvalidArgumentError("DgcaHeads: slot " + std::to_string(t) + ": source id " +
                                  std::to_string(x[t]) + " outside [0, " + std::to_string(V) + ")");
    if (y != nullptr && (y[t] < 0 || y[t] >= V))
      return InvalidArgumentError("DgcaHeads: slot " + std::to_string(t) + ": target id " +
                                  std::to_string(y[t]) + " outside [0, " + std::to_string(V) + ")");
    if (candidate_ && cand != nullptr) {
      for (int k = 0; k < K_; ++k) {
        const int32_t c = cand[static_cast<int64_t>(t) * K_ + k];
        if (c < -1 || c >= V)
          return InvalidArgumentError("DgcaHeads: slot " + std::to_string(t) + ": candidate " +
                                      std::to_string(k) + " has id " + std::to_string(c) +
                                      "; valid is -1 (padding) or [0, " + std::to_string(V) + ")");
      }
    }
  }
  if (candidate_ && cand == nullptr && T > 0)
    return InvalidArgumentError("DgcaHeads: candidate head is on but no candidate ids were given");
  return OkStatus();
}

void DgcaHeads::ForwardHeads(const float* h, const float* E, const int32_t* cand, int T) {
  const int H = H_, K = K_;
  const int nt_ = threads_;
  // Detector logits.
  if (detector_) {
    const float* wd = store_->value(p_.det_w);
    const float bd = store_->value(p_.det_b)[0];
    for (int t = 0; t < T; ++t) e_[t] = Dot(wd, h + static_cast<int64_t>(t) * H, H) + bd;
  }
  // Candidate head: a = h W_c^T + b_c; u = LN(GELU(a)); s_k = u·E[c_k]; log q.
  if (candidate_) {
    const float* Wc = store_->value(p_.cd_w);
    const float* bc = store_->value(p_.cd_b);
    const float* gam = store_->value(p_.ln_w);
    const float* bet = store_->value(p_.ln_b);
    Gemm(false, true, T, H, H, h, H, Wc, H, 0.0f, act_.data(), H);
    DGCA_HEADS_PARALLEL_FOR
    for (int t = 0; t < T; ++t) {
      float* a = act_.data() + static_cast<int64_t>(t) * H;
      float* g = gel_.data() + static_cast<int64_t>(t) * H;
      float* n = nrm_.data() + static_cast<int64_t>(t) * H;
      float* u = u_.data() + static_cast<int64_t>(t) * H;
      double mean = 0.0;
      for (int j = 0; j < H; ++j) {
        a[j] += bc[j];
        g[j] = Gelu(a[j]);
        mean += g[j];
      }
      mean /= H;
      double var = 0.0;
      for (int j = 0; j < H; ++j) var += (g[j] - mean) * (g[j] - mean);
      var /= H;
      const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps_));
      rstd_[t] = rstd;
      for (int j = 0; j < H; ++j) {
        n[j] = static_cast<float>((g[j] - mean) * rstd);
        u[j] = n[j] * gam[j] + bet[j];
      }
      // Scores over real candidates and their log-softmax.
      double* lq = logq_.data() + static_cast<int64_t>(t) * K;
      const int32_t* c = cand + static_cast<int64_t>(t) * K;
      double m = kNegInf;
      for (int k = 0; k < K; ++k) {
        if (c[k] < 0) {
          lq[k] = kNegInf;
          continue;
        }
        lq[k] = Dot(u, E + static_cast<int64_t>(c[k]) * H, H);
        m = std::max(m, lq[k]);
      }
      if (m == kNegInf) continue;  // no real candidate: q is empty
      double s = 0.0;
      for (int k = 0; k < K; ++k)
        if (c[k] >= 0) s += std::exp(lq[k] - m);
      const double lse = m + std::log(s);
      for (int k = 0; k < K; ++k)
        if (c[k] >= 0) lq[k] -= lse;
    }
  }
  // Gate logits.
  if (gated_) {
    const float* wg = store_->value(p_.g_w);
    const float bg = store_->value(p_.g_b)[0];
    const float a = detector_ ? store_->value(p_.g_a)[0] : 0.0f;
    for (int t = 0; t < T; ++t) {
      float l = Dot(wg, h + static_cast<int64_t>(t) * H, H) + bg;
      if (detector_) l += a * e_[t];
      gl_[t] = l;
    }
  }
}

Status DgcaHeads::Forward(const float* h, const float* z, const float* E, const int32_t* cand,
                          const int32_t* x, const int32_t* y, int T, int V, HeadLosses* out) {
  DGCA_RETURN_IF_ERROR(CheckInputs(cand, x, y, T, V));
  if (x == nullptr || y == nullptr)
    return InvalidArgumentError("DgcaHeads::Forward: source and target ids are required");
  T_ = T;
  V_ = V;
  h_ = h;
  z_ = z;
  E_ = E;
  for (int t = 0; t < T; ++t) {
    y_[t] = y[t];
    label_[t] = x[t] != y[t] ? 1 : 0;
  }
  if (candidate_) std::copy(cand, cand + static_cast<int64_t>(T) * K_, cand_.begin());
  ForwardHeads(h, E, cand, T);

  // Per-slot losses (parallel; each slot writes only its own entries).
  const int K = K_;
  const int nt_ = threads_;
  DGCA_HEADS_PARALLEL_FOR
  for (int t = 0; t < T; ++t) {
    const float* zt = z + static_cast<int64_t>(t) * V;
    RowMaxSum(zt, V, &zmax_[t], &zsum_[t]);
    lse_[t] = zmax_[t] + std::log(zsum_[t]);
    const double logp_y = zt[y[t]] - lse_[t];
    double* lt = loss_t_.data() + 3 * static_cast<int64_t>(t);
    lt[1] = detector_ ? Softplus(e_[t]) - label_[t] * static_cast<double>(e_[t]) : 0.0;
    double logQ = kNegInf;
    if (candidate_) {
      const double* lq = logq_.data() + static_cast<int64_t>(t) * K;
      const int32_t* c = cand + static_cast<int64_t>(t) * K;
      for (int k = 0; k < K; ++k)
        if (c[k] == y[t]) logQ = LogAddExp(logQ, lq[k]);
    }
    logQ_[t] = logQ;
    lt[2] = logQ == kNegInf ? 0.0 : -logQ;
    if (gated_) {
      const double l = gl_[t];
      const double logA = -Softplus(l) + logp_y;                              // log((1-g) p_y)
      const double logB = logQ == kNegInf ? kNegInf : -Softplus(-l) + logQ;  // log(g Q_y)
      const double logP = LogAddExp(logA, logB);
      lt[0] = -logP;
      wA_[t] = std::exp(logA - logP);
      wB_[t] = logB == kNegInf ? 0.0 : std::exp(logB - logP);
    } else {
      lt[0] = -logp_y;
      wA_[t] = 1.0;
      wB_[t] = 0.0;
    }
  }
  // Sums in slot order: independent of the thread count.
  double fus = 0.0, det = 0.0, cnd = 0.0;
  int64_t n_cand = 0;
  for (int t = 0; t < T; ++t) {
    fus += loss_t_[3 * t];
    det += loss_t_[3 * t + 1];
    if (logQ_[t] != kNegInf) {
      cnd += loss_t_[3 * t + 2];
      ++n_cand;
    }
  }
  n_cand_ = n_cand;
  HeadLosses r;
  r.slots = T;
  r.candidate_slots = n_cand;
  if (T > 0) {
    r.fusion = fus / T;
    r.detector = detector_ ? det / T : 0.0;
  }
  r.candidate = n_cand > 0 ? cnd / static_cast<double>(n_cand) : 0.0;
  r.total = r.fusion + (detector_ ? lambda_det_ * r.detector : 0.0) +
            (candidate_ ? lambda_cand_ * r.candidate : 0.0);
  if (out != nullptr) *out = r;
  return OkStatus();
}

void DgcaHeads::Backward(float scale, float* dh, float* dz, float* dE) {
  const int T = T_, V = V_, H = H_, K = K_;
  if (!bound_ || T == 0) return;
  const int nt_ = threads_;
  const double st = static_cast<double>(scale) / T;

  // dz = st·w_A·(softmax(z) − onehot(y)); written in full, in place if dz == z.
  DGCA_HEADS_PARALLEL_FOR
  for (int t = 0; t < T; ++t) {
    const float* zt = z_ + static_cast<int64_t>(t) * V;
    float* dzt = dz + static_cast<int64_t>(t) * V;
    const double coef = st * wA_[t];
    const float f = static_cast<float>(coef / zsum_[t]);  // coef·p_j = f·exp(z_j − max)
    const float m = zmax_[t];
    ScaledExpRow(dzt, zt, V, m, f);  // in place when dz == z: each z_j is read before dz_j is written
    dzt[y_[t]] -= static_cast<float>(coef);
  }

  // Gate logit and detector logit gradients.
  for (int t = 0; t < T; ++t) {
    double dl = 0.0;
    if (gated_) {
      const double g = Sigmoid(gl_[t]);
      dl = st * (g * wA_[t] - (1.0 - g) * wB_[t]);
    }
    dl_[t] = static_cast<float>(dl);
    if (detector_) {
      double de = st * lambda_det_ * (Sigmoid(e_[t]) - label_[t]);
      if (gated_) de += static_cast<double>(store_->value(p_.g_a)[0]) * dl;
      de_[t] = static_cast<float>(de);
    }
  }
  if (gated_) {
    const float* wg = store_->value(p_.g_w);
    float* dwg = store_->grad(p_.g_w);
    double dbg = 0.0, da = 0.0;
    for (int t = 0; t < T; ++t) {
      const float* ht = h_ + static_cast<int64_t>(t) * H;
      float* dht = dh + static_cast<int64_t>(t) * H;
      const float d = dl_[t];
      for (int j = 0; j < H; ++j) {
        dwg[j] += d * ht[j];
        dht[j] += d * wg[j];
      }
      dbg += d;
      if (detector_) da += static_cast<double>(d) * e_[t];
    }
    store_->grad(p_.g_b)[0] += static_cast<float>(dbg);
    if (detector_) store_->grad(p_.g_a)[0] += static_cast<float>(da);
  }
  if (detector_) {
    const float* wd = store_->value(p_.det_w);
    float* dwd = store_->grad(p_.det_w);
    double dbd = 0.0;
    for (int t = 0; t < T; ++t) {
      const float* ht = h_ + static_cast<int64_t>(t) * H;
      float* dht = dh + static_cast<int64_t>(t) * H;
      const float d = de_[t];
      for (int j = 0; j < H; ++j) {
        dwd[j] += d * ht[j];
        dht[j] += d * wd[j];
      }
      dbd += d;
    }
    store_->grad(p_.det_b)[0] += static_cast<float>(dbd);
  }

  if (!candidate_) return;
  // Per slot (parallel): ds_k = coef·(q_k − [c_k = y]·q_k/Q_y), du = Σ_k ds_k E[c_k],
  // then LayerNorm and GELU backward into da.
  const double cand_w = n_cand_ > 0 ? static_cast<double>(scale) * lambda_cand_ / n_cand_ : 0.0;
  const float* gam = store_->value(p_.ln_w);
  DGCA_HEADS_PARALLEL_FOR
  for (int t = 0; t < T; ++t) {
    const int32_t* c = cand_.data() + static_cast<int64_t>(t) * K;
    const double* lq = logq_.data() + static_cast<int64_t>(t) * K;
    float* ds = ds_.data() + static_cast<int64_t>(t) * K;
    const double logQ = logQ_[t];
    double coef = 0.0;
    if (logQ != kNegInf) coef = st * wB_[t] + cand_w;
    float* du = du_.data() + static_cast<int64_t>(t) * H;
    std::fill(du, du + H, 0.0f);
    for (int k = 0; k < K; ++k) {
      ds[k] = 0.0f;
      if (c[k] < 0 || coef == 0.0) continue;
      const double q = std::exp(lq[k]);
      const double m = c[k] == y_[t] ? std::exp(lq[k] - logQ) : 0.0;
      const float d = static_cast<float>(coef * (q - m));
      ds[k] = d;
      const float* er = E_ + static_cast<int64_t>(c[k]) * H;
      for (int j = 0; j < H; ++j) du[j] += d * er[j];
    }
    // LayerNorm backward: dn = du·γ; dg = rstd·(dn − mean(dn) − n·mean(dn·n)).
    const float* n = nrm_.data() + static_cast<int64_t>(t) * H;
    const float* a = act_.data() + static_cast<int64_t>(t) * H;
    float* da = da_.data() + static_cast<int64_t>(t) * H;
    double mdn = 0.0, mdnn = 0.0;
    for (int j = 0; j < H; ++j) {
      const double dn = static_cast<double>(du[j]) * gam[j];
      mdn += dn;
      mdnn += dn * n[j];
    }
    mdn /= H;
    mdnn /= H;
    const double rstd = rstd_[t];
    for (int j = 0; j < H; ++j) {
      const double dn = static_cast<double>(du[j]) * gam[j];
      const double dg = rstd * (dn - mdn - n[j] * mdnn);
      da[j] = static_cast<float>(dg) * GeluGrad(a[j]);  // GELU backward
    }
  }
  // Sums over slots, serial in slot order (rows of dE repeat across slots):
  // dE[c_k] += ds_k·u; dγ += du·n; dβ += du; db_c += da.
  float* dgam = store_->grad(p_.ln_w);
  float* dbet = store_->grad(p_.ln_b);
  float* dbc = store_->grad(p_.cd_b);
  for (int t = 0; t < T; ++t) {
    const int32_t* c = cand_.data() + static_cast<int64_t>(t) * K;
    const float* ds = ds_.data() + static_cast<int64_t>(t) * K;
    const float* ut = u_.data() + static_cast<int64_t>(t) * H;
    for (int k = 0; k < K; ++k) {
      if (c[k] < 0 || ds[k] == 0.0f) continue;
      float* der = dE + static_cast<int64_t>(c[k]) * H;
      for (int j = 0; j < H; ++j) der[j] += ds[k] * ut[j];
    }
    const float* du = du_.data() + static_cast<int64_t>(t) * H;
    const float* n = nrm_.data() + static_cast<int64_t>(t) * H;
    const float* da = da_.data() + static_cast<int64_t>(t) * H;
    for (int j = 0; j < H; ++j) {
      dgam[j] += du[j] * n[j];
      dbet[j] += du[j];
      dbc[j] += da[j];
    }
  }
  // Dense layer: dW_c += da^T h; dh += da W_c.
  Gemm(true, false, H, H, T, da_.data(), H, h_, H, 1.0f, store_->grad(p_.cd_w), H);
  Gemm(false, false, T, H, H, da_.data(), H, store_->value(p_.cd_w), H, 1.0f, dh, H);
}

Status DgcaHeads::Predict(const float* h, const float* z, const float* E, const int32_t* cand,
                          const int32_t* x, int T, int V, int32_t* pred) {
  DGCA_RETURN_IF_ERROR(CheckInputs(cand, x, nullptr, T, V));
  const int K = K_;
  const int nt_ = threads_;
  if (!gated_) {
    DGCA_HEADS_PARALLEL_FOR
    for (int t = 0; t < T; ++t) {
      const float* zt = z + static_cast<int64_t>(t) * V;
      pred[t] = static_cast<int32_t>(std::max_element(zt, zt + V) - zt);  // first max
    }
    return OkStatus();
  }
  T_ = 0;  // Backward() is not valid after Predict()
  ForwardHeads(h, E, cand, T);
  // P_v = (1−g)·p_v + g·Σ_{k: c_k = v} q_k. A non-candidate's P is monotone
  // in z_v, so the best non-candidate is the largest z among ids not in C:
  // it is among the top K+1 logits (at most K distinct candidate ids).
  const int cap = std::min(K + 1, V);
  DGCA_HEADS_PARALLEL_FOR
  for (int t = 0; t < T; ++t) {
    const float* zt = z + static_cast<int64_t>(t) * V;
    const int32_t* c = cand + static_cast<int64_t>(t) * K;
    const double* lq = logq_.data() + static_cast<int64_t>(t) * K;
    float m;
    double s;
    RowMaxSum(zt, V, &m, &s);
    const double lse = m + std::log(s);
    const double g = Sigmoid(gl_[t]);
    // Top `cap` logits, ordered by (value desc, id asc); cap <= K+1 is small.
    float top_v[64];
    int32_t top_i[64];
    std::vector<float> top_v_big;
    std::vector<int32_t> top_i_big;
    float* tv = top_v;
    int32_t* ti = top_i;
    if (cap > 64) {
      top_v_big.resize(cap);
      top_i_big.resize(cap);
      tv = top_v_big.data();
      ti = top_i_big.data();
    }
    int n = 0;
    for (int v = 0; v < V; ++v) {
      const float zv = zt[v];
      if (n == cap && !(zv > tv[n - 1])) continue;
      int pos = n < cap ? n : cap - 1;
      while (pos > 0 && zv > tv[pos - 1]) {
        tv[pos] = tv[pos - 1];
        ti[pos] = ti[pos - 1];
        --pos;
      }
      tv[pos] = zv;
      ti[pos] = v;
      if (n < cap) ++n;
    }
    auto is_cand = [&](int32_t v) {
      for (int k = 0; k < K; ++k)
        if (c[k] == v) return true;
      return false;
    };
    int32_t best = -1;
    double best_p = -1.0;
    auto offer = [&](int32_t v, double p) {
      if (p > best_p || (p == best_p && v < best)) {
        best = v;
        best_p = p;
      }
    };
    for (int i = 0; i < n; ++i) {
      if (!is_cand(ti[i])) {
        offer(ti[i], (1.0 - g) * std::exp(zt[ti[i]] - lse));
        break;
      }
    }
    for (int k = 0; k < K; ++k) {
      if (c[k] < 0) continue;
      bool seen = false;
      for (int j = 0; j < k; ++j) seen |= c[j] == c[k];
      if (seen) continue;
      double q = 0.0;
      for (int j = k; j < K; ++j)
        if (c[j] == c[k]) q += std::exp(lq[j]);
      offer(c[k], (1.0 - g) * std::exp(zt[c[k]] - lse) + g * q);
    }
    pred[t] = best;
  }
  return OkStatus();
}

}  // namespace dgca
