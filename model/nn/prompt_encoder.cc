#include "model/nn/prompt_encoder.h"

#include <algorithm>
#include <cmath>
#include <string>


#include "model/core/rng.h"
#include "model/cpu/ops.h"

namespace dgca {
namespace {

// Row-major C[M,N] = beta*C + op(A)[M,Kd] · op(B)[Kd,N], on the calling
// thread: the shared kernel of model/cpu/ops.h with alpha 1.
void Gemm(bool ta, bool tb, int M, int N, int Kd, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  cpu::Gemm(cpu::Context{}, ta, tb, M, N, Kd, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

inline float Sigm(float v) { return 1.0f / (1.0f + std::exp(-v)); }


}  // namespace

PromptEncoder::PromptEncoder(const ModelConfig& cfg)
    : kind_(cfg.prompt_encoder), rows_(2 * cfg.prompt_length), hidden_(cfg.hidden) {}

int64_t PromptEncoder::NumParams(const ModelConfig& cfg) {
  const int64_t H = cfg.hidden, S = 2 * static_cast<int64_t>(cfg.prompt_length);
  switch (cfg.prompt_encoder) {
    case PromptEncoderKind::kNone:
      return 0;
    case PromptEncoderKind::kMlp:
      return S * H + (H * H + H) * 2;
    case PromptEncoderKind::kLstm: {
      // Per direction: 4H*in + 4H*H + 8H; in = H (layer 0) or 2H (layer 1).
      const int64_t l0 = 4 * H * H + 4 * H * H + 8 * H;
      const int64_t l1 = 4 * H * 2 * H + 4 * H * H + 8 * H;
      return S * H + 2 * (l0 + l1) + (H * 2 * H + H) + (H * H + H);
    }
  }
  return 0;
}

Status PromptEncoder::Declare(ParamStore* store) {
  if (kind_ == PromptEncoderKind::kNone) return OkStatus();
  if (rows_ <= 0 || hidden_ <= 0)
    return InvalidArgumentError("PromptEncoder: prompt_length " + std::to_string(rows_ / 2) +
                                " and hidden " + std::to_string(hidden_) +
                                " must both be >= 1 (or use prompt encoder none)");
  return p_.ForEach(kind_, rows_, hidden_, ParamDeclarer(store, "PromptEncoder::Declare"));
}

Status PromptEncoder::Bind(ParamStore* store) {
  if (kind_ == PromptEncoderKind::kNone) {
    store_ = store;
    bound_ = true;
    return OkStatus();
  }
  if (!store->finalized())
    return FailedPreconditionError("PromptEncoder::Bind: call ParamStore::Finalize() first");
  const int64_t H = hidden_, S = rows_;
  DGCA_RETURN_IF_ERROR(p_.ForEach(kind_, S, H, ParamFinder(*store, "PromptEncoder::Bind")));
  if (kind_ == PromptEncoderKind::kLstm) {
    for (int d = 0; d < 4; ++d) {
      const int64_t in = d < 2 ? H : 2 * H;
      LstmDir& D = dirs_[d];
      const LstmParams& L = p_.lstm[d];
      D.in = static_cast<int>(in);
      D.reverse = (d % 2) == 1;
      D.Wih = store->value(L.w_ih);
      D.Whh = store->value(L.w_hh);
      D.Bih = store->value(L.b_ih);
      D.Bhh = store->value(L.b_hh);
      D.dWih = store->grad(L.w_ih);
      D.dWhh = store->grad(L.w_hh);
      D.dBih = store->grad(L.b_ih);
      D.dBhh = store->grad(L.b_hh);
      D.gates.assign(static_cast<size_t>(S * 4 * H), 0.0f);
      D.c.assign(static_cast<size_t>(S * H), 0.0f);
      D.tanh_c.assign(static_cast<size_t>(S * H), 0.0f);
    }
    out0_.assign(static_cast<size_t>(S * 2 * H), 0.0f);
    out1_.assign(static_cast<size_t>(S * 2 * H), 0.0f);
    d_out0_.assign(static_cast<size_t>(S * 2 * H), 0.0f);
    d_out1_.assign(static_cast<size_t>(S * 2 * H), 0.0f);
    dgates_.assign(static_cast<size_t>(S * 4 * H), 0.0f);
    dh_.assign(static_cast<size_t>(H), 0.0f);
    dc_.assign(static_cast<size_t>(H), 0.0f);
  }
  hid_.assign(static_cast<size_t>(S * H), 0.0f);
  out_.assign(static_cast<size_t>(S * H), 0.0f);
  d_hid_.assign(static_cast<size_t>(S * H), 0.0f);
  store_ = store;
  bound_ = true;
  return OkStatus();
}

void PromptEncoder::InitParams(uint64_t seed) {
  if (!bound_ || kind_ == PromptEncoderKind::kNone) return;
  SplitMix64 rng(seed ^ 0x70726f6d7074ULL);
  auto uniform = [&](int idx, double bound) {
    float* v = store_->value(idx);
    for (int64_t i = 0; i < store_->info(idx).numel; ++i)
      v[i] = static_cast<float>((2.0 * rng.NextDouble() - 1.0) * bound);
  };
  float* e = store_->value(p_.emb);
  for (int64_t i = 0; i < store_->info(p_.emb).numel; ++i) e[i] = static_cast<float>(rng.NextNormal());
  if (kind_ == PromptEncoderKind::kLstm) {
    const double b = 1.0 / std::sqrt(static_cast<double>(hidden_));
    for (const LstmParams& L : p_.lstm) {
      uniform(L.w_ih, b);
      uniform(L.w_hh, b);
      uniform(L.b_ih, b);
      uniform(L.b_hh, b);
    }
  }
  const double b0 = 1.0 / std::sqrt(static_cast<double>(store_->info(p_.mlp0_w).shape[1]));
  uniform(p_.mlp0_w, b0);
  uniform(p_.mlp0_b, b0);
  const double b2 = 1.0 / std::sqrt(static_cast<double>(hidden_));
  uniform(p_.mlp2_w, b2);
  uniform(p_.mlp2_b, b2);
}

void PromptEncoder::LstmDirForward(LstmDir* d, const float* x, float* out) {
  const int S = rows_, H = hidden_, G = 4 * hidden_;
  const int col = d->reverse ? H : 0;  // where this direction writes in out [S, 2H]
  // Input projection for all steps at once: gates = x W_ih^T + b_ih + b_hh.
  Gemm(false, true, S, G, d->in, x, d->in, d->Wih, d->in, 0.0f, d->gates.data(), G);
  for (int t = 0; t < S; ++t) {
    float* g = d->gates.data() + static_cast<int64_t>(t) * G;
    for (int j = 0; j < G; ++j) g[j] += d->Bih[j] + d->Bhh[j];
  }
  // Recurrence; h_{-1} = c_{-1} = 0. The reverse direction walks t = S-1..0.
  for (int step = 0; step < S; ++step) {
    const int t = d->reverse ? S - 1 - step : step;
    const int tp = d->reverse ? t + 1 : t - 1;  // previous step's position
    float* g = d->gates.data() + static_cast<int64_t>(t) * G;
    if (step > 0) {
      const float* hp = out + static_cast<int64_t>(tp) * 2 * H + col;
      Gemm(false, true, 1, G, H, hp, 2 * H, d->Whh, H, 1.0f, g, G);
    }
    float* c = d->c.data() + static_cast<int64_t>(t) * H;
    float* tc = d->tanh_c.data() + static_cast<int64_t>(t) * H;
    const float* cp = step > 0 ? d->c.data() + static_cast<int64_t>(tp) * H : nullptr;
    float* h = out + static_cast<int64_t>(t) * 2 * H + col;
    for (int j = 0; j < H; ++j) {
      const float gi = Sigm(g[j]);
      const float gf = Sigm(g[H + j]);
      const float gg = std::tanh(g[2 * H + j]);
      const float go = Sigm(g[3 * H + j]);
      g[j] = gi;
      g[H + j] = gf;
      g[2 * H + j] = gg;
      g[3 * H + j] = go;
      c[j] = (cp ? gf * cp[j] : 0.0f) + gi * gg;
      tc[j] = std::tanh(c[j]);
      h[j] = go * tc[j];
    }
  }
}

void PromptEncoder::LstmDirBackward(LstmDir* d, const float* x, const float* out,
                                    const float* dout, float* dx) {
  const int S = rows_, H = hidden_, G = 4 * hidden_;
  const int col = d->reverse ? H : 0;
  float* dh_next = dh_.data();  // gradient flowing into h_{t-1} via W_hh
  float* dc_next = dc_.data();  // gradient flowing into c_{t-1} via f
  std::fill(dh_next, dh_next + H, 0.0f);
  std::fill(dc_next, dc_next + H, 0.0f);
  // Walk the steps in the opposite order to the forward pass.
  for (int step = S - 1; step >= 0; --step) {
    const int t = d->reverse ? S - 1 - step : step;
    const int tp = d->reverse ? t + 1 : t - 1;
    const float* g = d->gates.data() + static_cast<int64_t>(t) * G;
    const float* tc = d->tanh_c.data() + static_cast<int64_t>(t) * H;
    const float* cp = step > 0 ? d->c.data() + static_cast<int64_t>(tp) * H : nullptr;
    const float* dht = dout + static_cast<int64_t>(t) * 2 * H + col;
    float* dg = dgates_.data() + static_cast<int64_t>(t) * G;
    for (int j = 0; j < H; ++j) {
      const float gi = g[j], gf = g[H + j], gg = g[2 * H + j], go = g[3 * H + j];
      const float dh = dht[j] + dh_next[j];
      const float dc = dc_next[j] + dh * go * (1.0f - tc[j] * tc[j]);
      dg[j] = dc * gg * gi * (1.0f - gi);                          // input gate (pre-act)
      dg[H + j] = cp ? dc * cp[j] * gf * (1.0f - gf) : 0.0f;       // forget gate
      dg[2 * H + j] = dc * gi * (1.0f - gg * gg);                  // cell candidate
      dg[3 * H + j] = dh * tc[j] * go * (1.0f - go);               // output gate
      dc_next[j] = dc * gf;
    }
    if (step > 0) {
      // dh_{t-1} = W_hh^T dgates_t; dW_hh += dgates_t^T h_{t-1}.
      const float* hp = out + static_cast<int64_t>(tp) * 2 * H + col;
      Gemm(false, false, 1, H, G, dg, G, d->Whh, H, 0.0f, dh_next, H);
      Gemm(true, false, G, H, 1, dg, G, hp, 2 * H, 1.0f, d->dWhh, H);
    }
  }
  // Input projection: dW_ih += dgates^T x; biases; dx += dgates W_ih.
  Gemm(true, false, G, d->in, S, dgates_.data(), G, x, d->in, 1.0f, d->dWih, d->in);
  for (int t = 0; t < S; ++t) {
    const float* dg = dgates_.data() + static_cast<int64_t>(t) * G;
    for (int j = 0; j < G; ++j) {
      d->dBih[j] += dg[j];
      d->dBhh[j] += dg[j];
    }
  }
  Gemm(false, false, S, d->in, G, dgates_.data(), G, d->Wih, d->in, 1.0f, dx, d->in);
}

const float* PromptEncoder::Forward() {
  if (!bound_ || kind_ == PromptEncoderKind::kNone) return nullptr;
  const int S = rows_, H = hidden_;
  const float* emb = store_->value(p_.emb);
  const float* in0 = emb;
  int in_w = H;
  if (kind_ == PromptEncoderKind::kLstm) {
    LstmDirForward(&dirs_[0], emb, out0_.data());
    LstmDirForward(&dirs_[1], emb, out0_.data());
    LstmDirForward(&dirs_[2], out0_.data(), out1_.data());
    LstmDirForward(&dirs_[3], out0_.data(), out1_.data());
    in0 = out1_.data();
    in_w = 2 * H;
  }
  // hid = ReLU(in0 W0^T + b0); out = hid W2^T + b2.
  const float* b0 = store_->value(p_.mlp0_b);
  Gemm(false, true, S, H, in_w, in0, in_w, store_->value(p_.mlp0_w), in_w, 0.0f, hid_.data(), H);
  for (int t = 0; t < S; ++t)
    for (int j = 0; j < H; ++j) {
      float& v = hid_[static_cast<size_t>(t) * H + j];
      v = std::max(0.0f, v + b0[j]);
    }
  const float* b2 = store_->value(p_.mlp2_b);
  Gemm(false, true, S, H, H, hid_.data(), H, store_->value(p_.mlp2_w), H, 0.0f, out_.data(), H);
  for (int t = 0; t < S; ++t)
    for (int j = 0; j < H; ++j) out_[static_cast<size_t>(t) * H + j] += b2[j];
  return out_.data();
}

void PromptEncoder::Backward(const float* dout) {
  if (!bound_ || kind_ == PromptEncoderKind::kNone) return;
  const int S = rows_, H = hidden_;
  const bool lstm = kind_ == PromptEncoderKind::kLstm;
  const float* in0 = lstm ? out1_.data() : store_->value(p_.emb);
  const int in_w = lstm ? 2 * H : H;
  // Linear 2: dW2 += dout^T hid; db2 += Σ dout; dhid = dout W2, masked by ReLU.
  Gemm(true, false, H, H, S, dout, H, hid_.data(), H, 1.0f, store_->grad(p_.mlp2_w), H);
  float* db2 = store_->grad(p_.mlp2_b);
  for (int t = 0; t < S; ++t)
    for (int j = 0; j < H; ++j) db2[j] += dout[static_cast<size_t>(t) * H + j];
  Gemm(false, false, S, H, H, dout, H, store_->value(p_.mlp2_w), H, 0.0f, d_hid_.data(), H);
  for (size_t i = 0; i < d_hid_.size(); ++i)
    if (hid_[i] <= 0.0f) d_hid_[i] = 0.0f;
  // Linear 0.
  Gemm(true, false, H, in_w, S, d_hid_.data(), H, in0, in_w, 1.0f, store_->grad(p_.mlp0_w), in_w);
  float* db0 = store_->grad(p_.mlp0_b);
  for (int t = 0; t < S; ++t)
    for (int j = 0; j < H; ++j) db0[j] += d_hid_[static_cast<size_t>(t) * H + j];
  float* demb = store_->grad(p_.emb);
  if (!lstm) {
    // The embedding feeds Linear 0 directly: its gradient is added in place.
    Gemm(false, false, S, H, H, d_hid_.data(), H, store_->value(p_.mlp0_w), H, 1.0f, demb, H);
    return;
  }
  Gemm(false, false, S, in_w, H, d_hid_.data(), H, store_->value(p_.mlp0_w), in_w, 0.0f,
       d_out1_.data(), in_w);
  // Layer 1 (input out0_), then layer 0 (input = embedding, dx = its grad).
  std::fill(d_out0_.begin(), d_out0_.end(), 0.0f);
  LstmDirBackward(&dirs_[2], out0_.data(), out1_.data(), d_out1_.data(), d_out0_.data());
  LstmDirBackward(&dirs_[3], out0_.data(), out1_.data(), d_out1_.data(), d_out0_.data());
  const float* emb = store_->value(p_.emb);
  LstmDirBackward(&dirs_[0], emb, out0_.data(), d_out0_.data(), demb);
  LstmDirBackward(&dirs_[1], emb, out0_.data(), d_out0_.data(), demb);
}

}  // namespace dgca
