#include "model/nn/bert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "model/core/rng.h"

namespace dgca {
namespace {

// Uniform in (0, 1): 53 random bits, never 0.
double Uniform(SplitMix64* s) { return (static_cast<double>(s->Next() >> 11) + 0.5) * 0x1.0p-53; }

// y += x (the residual connections).
void AddInPlace(const cpu::Context& ctx, float* y, const float* x, int64_t n) {
  cpu::ParallelFor(ctx, n, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += x[i];
  });
}

}  // namespace

void InitNormal(float* x, int64_t n, float std, uint64_t seed) {
  SplitMix64 s(seed);
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = Uniform(&s), u2 = Uniform(&s);
    const double r = std::sqrt(-2.0 * std::log(u1));
    x[i] = static_cast<float>(std * r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) x[i + 1] = static_cast<float>(std * r * std::sin(2.0 * M_PI * u2));
  }
}

Bert::Bert(const ModelConfig& cfg, int max_batch, int seq_len, int max_head_rows)
    : cfg_(cfg),
      max_batch_(max_batch),
      seq_len_(seq_len),
      max_rows_(max_head_rows),
      H_(cfg.hidden),
      F_(cfg.ffn),
      V_(cfg.vocab_size),
      nh_(cfg.heads) {}

Status Bert::DeclareWordEmbeddings(ParamStore* store) {
  return p_.ForEachWordEmbedding(cfg_, ParamDeclarer(store, "Bert::Declare"));
}

Status Bert::DeclareBody(ParamStore* store) {
  layers_.resize(cfg_.layers);
  DGCA_RETURN_IF_ERROR(p_.ForEachBody(cfg_, &layers_, ParamDeclarer(store, "Bert::Declare")));
  for (Layer& ly : layers_) ly.first = ly.qkv_w;
  return OkStatus();
}

Status Bert::DeclareMlmHead(ParamStore* store) {
  DGCA_RETURN_IF_ERROR(p_.ForEachMlmHead(cfg_, ParamDeclarer(store, "Bert::Declare")));
  head_first_ = p_.hd_w;
  return OkStatus();
}

Status Bert::Bind(ParamStore* store) {
  if (!store->finalized()) return FailedPreconditionError("Bert::Bind: the store is not finalized");
  if (p_.wte < 0 || p_.pos < 0 || p_.hd_w < 0)
    return FailedPreconditionError("Bert::Bind: parameters were not all declared");
  if (H_ % nh_ != 0)
    return InvalidArgumentError("Bert: hidden " + std::to_string(H_) +
                                " is not a multiple of heads " + std::to_string(nh_));
  if (seq_len_ > cfg_.max_position)
    return InvalidArgumentError("Bert: seq_len " + std::to_string(seq_len_) +
                                " exceeds max_position " + std::to_string(cfg_.max_position));
  // The fused QKV GEMM relies on q, k, v being adjacent in the flat buffer
  // (one [3H, H] weight, one [3H] bias).
  for (const Layer& ly : layers_) {
    const int64_t q_w = store->info(ly.qkv_w).offset, q_b = store->info(ly.qkv_b).offset;
    const int64_t HH = int64_t(H_) * H_;
    if (store->info(ly.k_w).offset != q_w + HH || store->info(ly.v_w).offset != q_w + 2 * HH ||
        store->info(ly.k_b).offset != q_b + H_ || store->info(ly.v_b).offset != q_b + 2 * H_)
      return InternalError("Bert: q/k/v parameters are not contiguous");
  }
  store_ = store;
  const size_t N = static_cast<size_t>(max_batch_) * seq_len_;
  const size_t H = H_, F = F_;
  for (Layer& ly : layers_) {
    ly.qkv.assign(N * 3 * H, 0.0f);
    ly.probs.assign(static_cast<size_t>(max_batch_) * nh_ * seq_len_ * seq_len_, 0.0f);
    ly.ctx.assign(N * H, 0.0f);
    ly.r1.assign(N * H, 0.0f);
    ly.mean1.assign(N, 0.0f);
    ly.rstd1.assign(N, 0.0f);
    ly.h1.assign(N * H, 0.0f);
    ly.f1.assign(N * F, 0.0f);
    ly.g.assign(N * F, 0.0f);
    ly.r2.assign(N * H, 0.0f);
    ly.mean2.assign(N, 0.0f);
    ly.rstd2.assign(N, 0.0f);
    ly.out.assign(N * H, 0.0f);
  }
  emb_in_.assign(N * H, 0.0f);
  emb_out_.assign(N * H, 0.0f);
  emb_mean_.assign(N, 0.0f);
  emb_rstd_.assign(N, 0.0f);
  pos_ids_.assign(N, 0);
  word_ids_.assign(N, 0);
  prompt_ids_.assign(N, -1);
  const size_t R = std::max(1, max_rows_);
  rows_.assign(R, 0);
  sel_.assign(R * H, 0.0f);
  t1_.assign(R * H, 0.0f);
  t2_.assign(R * H, 0.0f);
  t3_.assign(R * H, 0.0f);
  tmean_.assign(R, 0.0f);
  trstd_.assign(R, 0.0f);
  logits_.assign(R * V_, 0.0f);
  dcur_.assign(N * H, 0.0f);
  dtmp_.assign(N * H, 0.0f);
  dctx_.assign(N * H, 0.0f);
  dqkv_.assign(N * 3 * H, 0.0f);
  dg_.assign(N * F, 0.0f);
  dsel_.assign(R * H, 0.0f);
  dt_.assign(R * H, 0.0f);
  return OkStatus();
}

void Bert::InitParams(uint64_t seed) {
  const float kStd = 0.02f;  // BERT's initializer_range
  SplitMix64 s(seed);  // one draw per tensor seeds its InitNormal
  auto normal = [&](int i) { InitNormal(P(i), store_->info(i).numel, kStd, s.Next()); };
  auto fill = [&](int i, float v) { std::fill(P(i), P(i) + store_->info(i).numel, v); };
  normal(p_.wte);
  normal(p_.pos);
  normal(p_.type);
  fill(p_.eln_w, 1.0f);
  fill(p_.eln_b, 0.0f);
  for (Layer& ly : layers_) {
    // W_qkv is [3H, H] contiguous; its bias [3H].
    InitNormal(P(ly.qkv_w), 3LL * H_ * H_, kStd, s.Next());
    std::fill(P(ly.qkv_b), P(ly.qkv_b) + 3 * H_, 0.0f);
    normal(ly.ao_w);
    fill(ly.ao_b, 0.0f);
    fill(ly.ln1_w, 1.0f);
    fill(ly.ln1_b, 0.0f);
    normal(ly.fc1_w);
    fill(ly.fc1_b, 0.0f);
    normal(ly.fc2_w);
    fill(ly.fc2_b, 0.0f);
    fill(ly.ln2_w, 1.0f);
    fill(ly.ln2_b, 0.0f);
  }
  normal(p_.hd_w);
  fill(p_.hd_b, 0.0f);
  fill(p_.hln_w, 1.0f);
  fill(p_.hln_b, 0.0f);
  fill(p_.hbias, 0.0f);
}

// ---------------------------------------------------------------- forward

void Bert::EmbedForward(const cpu::Context& ctx, const int32_t* ids, const int32_t* token_types,
                        const int32_t* prompt_slot, const float* prompt_rows, int B, int L) {
  B_ = B;
  L_ = L;
  ids_ = ids;
  types_ = token_types;
  prompt_slot_ = prompt_slot;
  used_prompt_ = prompt_rows != nullptr;
  const int N = B * L;
  // Index arrays for the gathers here and the scatter-adds of backward: a
  // row takes either its word embedding or its prompt row (the vectorized
  // ReLM scatter); -1 marks "not from this table".
  for (int i = 0; i < N; ++i) {
    pos_ids_[i] = i % L;
    const bool prompt = used_prompt_ && prompt_slot[i] >= 0;
    word_ids_[i] = prompt ? -1 : ids[i];
    prompt_ids_[i] = prompt ? prompt_slot[i] : -1;
  }
  const float* wte = P(p_.wte);
  const float* wpe = P(p_.pos);
  const float* wtt = P(p_.type);
  const int H = H_;
  float* x = emb_in_.data();
  cpu::ParallelFor(ctx, N, static_cast<int64_t>(N) * H, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* w = word_ids_[i] >= 0 ? wte + static_cast<size_t>(word_ids_[i]) * H
                                         : prompt_rows + static_cast<size_t>(prompt_ids_[i]) * H;
      const float* p = wpe + static_cast<size_t>(pos_ids_[i]) * H;
      const float* t = wtt + static_cast<size_t>(token_types[i]) * H;
      float* o = x + static_cast<size_t>(i) * H;
      for (int j = 0; j < H; ++j) o[j] = (w[j] + t[j]) + p[j];  // HF's order of the sums
    }
  });
  cpu::LayerNormForward(ctx, emb_out_.data(), emb_mean_.data(), emb_rstd_.data(), x, P(p_.eln_w),
                        P(p_.eln_b), N, H, cfg_.layer_norm_eps);
  if (drop_.hidden_on()) DropHidden(ctx, emb_out_.data(), emb_out_.data(), nullptr, -1, kDropHidden);
}

void Bert::DropHidden(const cpu::Context& ctx, float* out, const float* in, const float* residual, int l,
                      int site) const {
  cpu::DropoutRows(ctx, out, in, residual, drop_.keys, l, site, drop_.hidden, B_, L_, H_);
}

void Bert::EncoderForward(const cpu::Context& ctx, const int32_t* mask, int B, int L) {
  B_ = B;
  L_ = L;
  for (int l = 0; l < cfg_.layers; ++l)
    LayerForward(ctx, l, l == 0 ? emb_out_.data() : layers_[l - 1].out.data(), mask);
}

const float* Bert::hidden() const {
  return cfg_.layers == 0 ? emb_out_.data() : layers_.back().out.data();
}

void Bert::LayerForward(const cpu::Context& ctx, int l, const float* x, const int32_t* mask) {
  Layer& ly = layers_[l];
  const int N = B_ * L_, H = H_, F = F_;
  const float eps = cfg_.layer_norm_eps;
  // Self-attention: one GEMM for q, k, v.
  cpu::LinearForward(ctx, ly.qkv.data(), x, P(ly.qkv_w), P(ly.qkv_b), N, H, 3 * H);
  cpu::AttentionForward(ctx, ly.ctx.data(), ly.probs.data(), ly.qkv.data(), mask, B_, L_, H, nh_,
                        AttentionDrop(l));
  // Output projection, dropout, residual (one pass), LayerNorm (post-LN).
  cpu::LinearForward(ctx, ly.r1.data(), ly.ctx.data(), P(ly.ao_w), P(ly.ao_b), N, H, H);
  if (drop_.hidden_on()) DropHidden(ctx, ly.r1.data(), ly.r1.data(), x, l, kDropAttnOut);
  else AddInPlace(ctx, ly.r1.data(), x, static_cast<int64_t>(N) * H);
  cpu::LayerNormForward(ctx, ly.h1.data(), ly.mean1.data(), ly.rstd1.data(), ly.r1.data(),
                        P(ly.ln1_w), P(ly.ln1_b), N, H, eps);
  // Feed-forward.
  cpu::LinearForward(ctx, ly.f1.data(), ly.h1.data(), P(ly.fc1_w), P(ly.fc1_b), N, H, F);
  cpu::GeluForward(ctx, ly.g.data(), ly.f1.data(), static_cast<int64_t>(N) * F);
  cpu::LinearForward(ctx, ly.r2.data(), ly.g.data(), P(ly.fc2_w), P(ly.fc2_b), N, F, H);
  if (drop_.hidden_on()) DropHidden(ctx, ly.r2.data(), ly.r2.data(), ly.h1.data(), l, kDropFfnOut);
  else AddInPlace(ctx, ly.r2.data(), ly.h1.data(), static_cast<int64_t>(N) * H);
  cpu::LayerNormForward(ctx, ly.out.data(), ly.mean2.data(), ly.rstd2.data(), ly.r2.data(),
                        P(ly.ln2_w), P(ly.ln2_b), N, H, eps);
}

float* Bert::MlmHeadForward(const cpu::Context& ctx, const int32_t* rows, int R) {
  R_ = R;
  const int H = H_;
  const float* hid = hidden();
  for (int r = 0; r < R; ++r) {
    rows_[r] = rows[r];
    std::memcpy(sel_.data() + static_cast<size_t>(r) * H, hid + static_cast<size_t>(rows[r]) * H,
                sizeof(float) * H);
  }
  if (R == 0) return logits_.data();
  cpu::LinearForward(ctx, t1_.data(), sel_.data(), P(p_.hd_w), P(p_.hd_b), R, H, H);
  cpu::GeluForward(ctx, t2_.data(), t1_.data(), static_cast<int64_t>(R) * H);
  cpu::LayerNormForward(ctx, t3_.data(), tmean_.data(), trstd_.data(), t2_.data(), P(p_.hln_w),
                        P(p_.hln_b), R, H, cfg_.layer_norm_eps);
  // Decoder tied to the word embeddings: logits = t3 E^T + bias.
  cpu::LinearForward(ctx, logits_.data(), t3_.data(), P(p_.wte), P(p_.hbias), R, H, V_);
  return logits_.data();
}

// --------------------------------------------------------------- backward

void Bert::MlmHeadBackward(const cpu::Context& ctx, const float* dlogits, const float* extra_dh,
                           int extra_rows) {
  const int R = R_, H = H_;
  const size_t N = static_cast<size_t>(B_) * L_;
  if (R > 0) {
    // Decoder: dE += dlogits^T t3, dbias += colsum, dt3 = dlogits E.
    cpu::LinearBackward(ctx, dt_.data(), false, G(p_.wte), G(p_.hbias), dlogits, t3_.data(),
                        P(p_.wte), R, H, V_);
    // LN, GELU (in place), dense.
    cpu::LayerNormBackward(ctx, dsel_.data(), false, G(p_.hln_w), G(p_.hln_b), dt_.data(), t2_.data(),
                           P(p_.hln_w), tmean_.data(), trstd_.data(), R, H);
    cpu::GeluBackward(ctx, dsel_.data(), t1_.data(), dsel_.data(), static_cast<int64_t>(R) * H);
    cpu::LinearBackward(ctx, dt_.data(), false, G(p_.hd_w), G(p_.hd_b), dsel_.data(), sel_.data(),
                        P(p_.hd_w), R, H, H);
    if (extra_dh != nullptr)
      for (int64_t i = 0; i < static_cast<int64_t>(extra_rows) * H; ++i) dt_[i] += extra_dh[i];
  }
  // Scatter the gathered rows' gradient into dhidden (rows are distinct).
  std::fill(dcur_.begin(), dcur_.begin() + N * H, 0.0f);
  for (int r = 0; r < R; ++r) {
    float* d = dcur_.data() + static_cast<size_t>(rows_[r]) * H;
    const float* s = dt_.data() + static_cast<size_t>(r) * H;
    for (int j = 0; j < H; ++j) d[j] += s[j];
  }
}

void Bert::LayerBackward(const cpu::Context& ctx, int l, const float* x, float* dcur) {
  Layer& ly = layers_[l];
  const int N = B_ * L_, H = H_, F = F_;
  float* dtmp = dtmp_.data();
  // out = LN2(r2): dcur -> dtmp = d r2 (= d f2 = the residual part of d h1).
  cpu::LayerNormBackward(ctx, dtmp, false, G(ly.ln2_w), G(ly.ln2_b), dcur, ly.r2.data(),
                         P(ly.ln2_w), ly.mean2.data(), ly.rstd2.data(), N, H);
  // r2 = drop(g W2^T + b2) + h1: the projection gets d r2 through the mask
  // (in dctx_, free until the attention), the residual d r2 itself.
  const float* dr2 = dtmp;
  if (drop_.hidden_on()) {
    DropHidden(ctx, dctx_.data(), dtmp, nullptr, l, kDropFfnOut);
    dr2 = dctx_.data();
  }
  cpu::LinearBackward(ctx, dg_.data(), false, G(ly.fc2_w), G(ly.fc2_b), dr2, ly.g.data(),
                      P(ly.fc2_w), N, F, H);
  cpu::GeluBackward(ctx, dg_.data(), ly.f1.data(), dg_.data(), static_cast<int64_t>(N) * F);
  // f1 = h1 W1^T + b1: d h1 = d r2 + d f1 W1 (accumulated into dtmp).
  cpu::LinearBackward(ctx, dtmp, true, G(ly.fc1_w), G(ly.fc1_b), dg_.data(), ly.h1.data(),
                      P(ly.fc1_w), N, H, F);
  // h1 = LN1(r1): dtmp -> dcur = d r1 (= d attention output = residual part of d x).
  cpu::LayerNormBackward(ctx, dcur, false, G(ly.ln1_w), G(ly.ln1_b), dtmp, ly.r1.data(),
                         P(ly.ln1_w), ly.mean1.data(), ly.rstd1.data(), N, H);
  // r1 = drop(ctx Wo^T + bo) + x (the masked d r1 in dtmp, free again).
  const float* dr1 = dcur;
  if (drop_.hidden_on()) {
    DropHidden(ctx, dtmp, dcur, nullptr, l, kDropAttnOut);
    dr1 = dtmp;
  }
  cpu::LinearBackward(ctx, dctx_.data(), false, G(ly.ao_w), G(ly.ao_b), dr1, ly.ctx.data(),
                      P(ly.ao_w), N, H, H);
  cpu::AttentionBackward(ctx, dqkv_.data(), dctx_.data(), ly.qkv.data(), ly.probs.data(), B_, L_,
                         H, nh_, AttentionDrop(l));
  // qkv = x Wqkv^T + bqkv: d x += dqkv Wqkv.
  cpu::LinearBackward(ctx, dcur, true, G(ly.qkv_w), G(ly.qkv_b), dqkv_.data(), x, P(ly.qkv_w), N,
                      H, 3 * H);
}

void Bert::EmbedBackward(const cpu::Context& ctx, float* dprompt) {
  const int N = B_ * L_, H = H_;
  float* demb = dtmp_.data();
  if (drop_.hidden_on())  // d(LN output) = d emb_out * mask
    DropHidden(ctx, dcur_.data(), dcur_.data(), nullptr, -1, kDropHidden);
  cpu::LayerNormBackward(ctx, demb, false, G(p_.eln_w), G(p_.eln_b), dcur_.data(), emb_in_.data(),
                         P(p_.eln_w), emb_mean_.data(), emb_rstd_.data(), N, H);
  cpu::EmbeddingBackward(ctx, G(p_.pos), pos_ids_.data(), demb, N, H);
  cpu::EmbeddingBackward(ctx, G(p_.type), types_, demb, N, H);
  cpu::EmbeddingBackward(ctx, G(p_.wte), word_ids_.data(), demb, N, H);
  if (used_prompt_ && dprompt != nullptr)
    cpu::EmbeddingBackward(ctx, dprompt, prompt_ids_.data(), demb, N, H);
}

}  // namespace dgca
