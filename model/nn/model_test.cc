// Whole-model tests of DgcaModel on the CPU (the HF comparison of the plain
// ReLM configuration is golden_test.cc): finite-difference checks of every
// parameter tensor through the full DGCA configuration (prompt encoder, MFT
// term, detector, candidate head, gated fusion), the GradReadyFn contract,
// reproducibility, and clear errors for bad batches.
#include "model/nn/model.h"
#include "model/nn/synthetic_batch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dgca {
namespace {

ModelConfig TinyConfig(PromptEncoderKind prompt, bool heads) {
  ModelConfig c;
  c.vocab_size = 30;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 2;
  c.ffn = 24;
  c.max_position = 32;
  c.prompt_length = 1;
  c.prompt_encoder = prompt;
  c.detector = heads;
  c.candidate = heads;
  c.candidate_top_k = 3;
  c.fusion = heads ? FusionKind::kGated : FusionKind::kNone;
  c.lambda_detector = 0.7f;
  c.lambda_candidate = 0.4f;
  return c;
}


std::unique_ptr<DgcaModel> MakeModel(const ModelConfig& c, int B, int L, int threads,
                                     uint64_t seed = 11) {
  auto m = DgcaModel::Create(c, B, L, seed, threads);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

// For every parameter tensor: the directional derivative along a random
// direction by central differences (float32 model, loss accumulated in
// double) against grad . direction.
// With dropout on, the loss of the differences is ForwardBackward's (the
// masks are a function of the batch's keys, so every evaluation drops the
// same elements); Forward never drops.
void CheckAllTensorsByFiniteDifferences(const ModelConfig& c, bool mft) {
  const bool dropout = c.hidden_dropout > 0.0f || c.attention_dropout > 0.0f;
  const int L = 16;
  Batch b = SyntheticBatch(c, L, {4, 6}, mft, 5);
  auto m = MakeModel(c, 2, L, 1);
  ASSERT_NE(m, nullptr);
  ParamStore& s = m->params();
  // Larger weights than the N(0, 0.02) init, so every path carries signal.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int t = 0; t < s.size(); ++t)  // the tensors (the alignment gaps stay zero)
    for (int64_t i = 0; i < s.info(t).numel; ++i) s.value(t)[i] += 0.2f * nd(rng);
  s.ZeroGrads();
  auto lb = m->ForwardBackward(b, 1.0f, GradReadyFn());
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  if (mft) EXPECT_GT(lb->mft, 0.0);
  if (c.detector) EXPECT_GT(lb->detector, 0.0);
  if (c.candidate) EXPECT_GT(lb->candidate, 0.0);
  EXPECT_NEAR(lb->total,
              lb->fusion + lb->mft + c.lambda_detector * lb->detector * (c.detector ? 1 : 0) +
                  c.lambda_candidate * lb->candidate * (c.candidate ? 1 : 0),
              1e-9 * std::abs(lb->total));
  std::vector<float> grad(s.grads(), s.grads() + s.total_numel());
  for (int i = 0; i < s.size(); ++i) {
    const ParamInfo& p = s.info(i);
    std::vector<float> dir(p.numel);
    double an = 0;
    for (int64_t k = 0; k < p.numel; ++k) {
      dir[k] = nd(rng);
      an += static_cast<double>(grad[p.offset + k]) * dir[k];
    }
    std::vector<float> saved(s.value(i), s.value(i) + p.numel);
    auto loss_at = [&](float step) {
      for (int64_t k = 0; k < p.numel; ++k) s.value(i)[k] = saved[k] + step * dir[k];
      auto r = dropout ? m->ForwardBackward(b, 1.0f, GradReadyFn()) : m->Forward(b);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      return r.ok() ? r->total : 0.0;
    };
    // Two step sizes: float32 rounding favours the larger, the ReLU kinks of
    // the prompt MLP the smaller; a correct gradient matches at least one,
    // a wrong one (a missing term, a wrong factor) neither.
    const double fd1 = (loss_at(1e-3f) - loss_at(-1e-3f)) / 2e-3;
    const double fd2 = (loss_at(3e-4f) - loss_at(-3e-4f)) / 6e-4;
    std::memcpy(s.value(i), saved.data(), sizeof(float) * p.numel);
    const double tol = 2e-2 * std::abs(an) + 2e-3;
    EXPECT_LE(std::min(std::abs(fd1 - an), std::abs(fd2 - an)), tol)
        << p.name << ": finite differences " << fd1 << " (step 1e-3), " << fd2
        << " (step 3e-4), analytic " << an;
  }
}

TEST(DgcaModelGrad, FullDgcaWithLstmPromptAndMftMatchesFiniteDifferences) {
  CheckAllTensorsByFiniteDifferences(TinyConfig(PromptEncoderKind::kLstm, true), true);
}

TEST(DgcaModelGrad, ReLMWithMlpPromptMatchesFiniteDifferences) {
  CheckAllTensorsByFiniteDifferences(TinyConfig(PromptEncoderKind::kMlp, false), true);
}

// A hidden size that is not a multiple of 8: the layout has alignment gaps
// between tensors, and key/value still follow the query (ParamStore).
TEST(DgcaModelGrad, HiddenNotAMultipleOfEightMatchesFiniteDifferences) {
  ModelConfig c = TinyConfig(PromptEncoderKind::kLstm, true);
  c.hidden = 12;
  c.heads = 2;
  c.ffn = 20;
  CheckAllTensorsByFiniteDifferences(c, true);
}

TEST(DgcaModelGrad, DropoutMatchesFiniteDifferences) {
  ModelConfig c = TinyConfig(PromptEncoderKind::kLstm, true);
  c.hidden_dropout = 0.2f;
  c.attention_dropout = 0.3f;
  CheckAllTensorsByFiniteDifferences(c, true);
}

// Dropout acts in training only, changes the training loss, and drops the
// same elements for the same keys.
TEST(DgcaModel, DropoutOnlyInTrainingAndKeyedByTheBatch) {
  const int L = 16;
  ModelConfig plain = TinyConfig(PromptEncoderKind::kLstm, true);
  ModelConfig drop = plain;
  drop.hidden_dropout = 0.1f;
  drop.attention_dropout = 0.1f;
  Batch b = SyntheticBatch(plain, L, {4, 6}, true, 5);
  auto m0 = MakeModel(plain, 2, L, 1), m1 = MakeModel(drop, 2, L, 1);
  ASSERT_NE(m0, nullptr);
  ASSERT_NE(m1, nullptr);
  auto e0 = m0->Forward(b), e1 = m1->Forward(b);
  ASSERT_TRUE(e0.ok() && e1.ok());
  EXPECT_EQ(e0->total, e1->total) << "evaluation must not drop";
  auto t0 = m0->ForwardBackward(b, 1.0f, GradReadyFn());
  auto t1 = m1->ForwardBackward(b, 1.0f, GradReadyFn());
  auto t2 = m1->ForwardBackward(b, 1.0f, GradReadyFn());
  ASSERT_TRUE(t0.ok() && t1.ok() && t2.ok());
  EXPECT_EQ(t0->total, e0->total);
  EXPECT_NE(t1->total, t0->total) << "training with dropout 0.1 gave the loss of no dropout";
  EXPECT_EQ(t1->total, t2->total) << "the same keys must drop the same elements";
  Batch other = b;
  for (uint64_t& k : other.dropout_keys) k ^= 0x5555;
  auto t3 = m1->ForwardBackward(other, 1.0f, GradReadyFn());
  ASSERT_TRUE(t3.ok());
  EXPECT_NE(t3->total, t1->total) << "other keys must drop other elements";
  Batch keyless = b;
  keyless.dropout_keys.clear();
  auto bad = m1->ForwardBackward(keyless, 1.0f, GradReadyFn());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dropout_keys"), std::string::npos) << bad.status().ToString();
}

// model/core's ListParameters / CountParameters (what the planner and the
// memory model count) against what the model really declares, for every
// combination of prompt encoder, heads and fusion.
TEST(DgcaModel, DeclaresExactlyListParameters) {
  for (PromptEncoderKind prompt : {PromptEncoderKind::kLstm, PromptEncoderKind::kMlp, PromptEncoderKind::kNone})
    for (bool detector : {true, false})
      for (bool candidate : {true, false})
        for (FusionKind fusion : {FusionKind::kGated, FusionKind::kNone}) {
          ModelConfig c = TinyConfig(prompt, true);
          c.detector = detector;
          c.candidate = candidate;
          c.fusion = fusion;
          const std::string what = std::string("prompt ") + (prompt == PromptEncoderKind::kLstm ? "lstm"
                                                             : prompt == PromptEncoderKind::kMlp ? "mlp"
                                                                                                 : "none") +
                                   (detector ? ", detector" : "") + (candidate ? ", candidate" : "") +
                                   (fusion == FusionKind::kGated ? ", gated" : ", no fusion");
          auto m = MakeModel(c, 1, 16, 1);
          ASSERT_NE(m, nullptr) << what;
          const ParamStore& s = m->params();
          std::set<std::pair<std::string, std::vector<int64_t>>> declared, listed;
          for (int i = 0; i < s.size(); ++i) declared.emplace(s.info(i).name, s.info(i).shape);
          for (const ParamSpec& p : ListParameters(c)) listed.emplace(p.name, p.shape);
          for (const auto& d : declared) EXPECT_TRUE(listed.count(d)) << what << ": declared, not listed: " << d.first;
          for (const auto& l : listed) EXPECT_TRUE(declared.count(l)) << what << ": listed, not declared: " << l.first;
          EXPECT_EQ(s.parameter_count(), CountParameters(c)) << what;
          EXPECT_GE(s.total_numel(), s.parameter_count()) << what;
        }
}

TEST(DgcaModel, DeclarationOrderAndGradReadyContract) {
  const ModelConfig c = TinyConfig(PromptEncoderKind::kLstm, true);
  const int L = 16;
  auto m = MakeModel(c, 2, L, 2);
  ASSERT_NE(m, nullptr);
  ParamStore& s = m->params();
  EXPECT_EQ(s.info(0).name, "bert.embeddings.word_embeddings.weight");
  EXPECT_EQ(s.info(1).name, "prompt.embedding.weight");
  Batch b = SyntheticBatch(c, L, {4, 6}, true, 9);
  // Two micro-steps, as in accumulation: at each callback, the tensors
  // [first, size) must already hold their final value for this call.
  s.ZeroGrads();
  ASSERT_TRUE(m->ForwardBackward(b, 0.5f, GradReadyFn()).ok());
  std::vector<std::pair<int, std::vector<float>>> snaps;
  auto lb = m->ForwardBackward(b, 0.5f, [&](int first) {
    snaps.emplace_back(first, std::vector<float>(s.grads(), s.grads() + s.total_numel()));
  });
  ASSERT_TRUE(lb.ok());
  ASSERT_EQ(snaps.size(), static_cast<size_t>(c.layers + 3));
  EXPECT_EQ(s.info(snaps[0].first).name, "cls.predictions.transform.dense.weight");
  EXPECT_EQ(snaps.back().first, 0);
  for (size_t k = 0; k < snaps.size(); ++k) {
    if (k > 0) EXPECT_LT(snaps[k].first, snaps[k - 1].first);
    const int64_t off = s.info(snaps[k].first).offset;
    EXPECT_EQ(0, std::memcmp(snaps[k].second.data() + off, s.grads() + off,
                             sizeof(float) * (s.total_numel() - off)))
        << "gradients from " << s.info(snaps[k].first).name << " changed after its callback";
  }
}

TEST(DgcaModel, ReproducibleAndAccumulates) {
  const ModelConfig c = TinyConfig(PromptEncoderKind::kLstm, true);
  const int L = 16;
  Batch b = SyntheticBatch(c, L, {4, 6}, true, 13);
  auto a = MakeModel(c, 2, L, 2, 99);
  auto z = MakeModel(c, 2, L, 2, 99);
  ASSERT_TRUE(a && z);
  const int64_t n = a->params().total_numel();
  EXPECT_EQ(0, std::memcmp(a->params().values(), z->params().values(), sizeof(float) * n));
  auto la = a->ForwardBackward(b, 1.0f, GradReadyFn());
  auto lz = z->ForwardBackward(b, 1.0f, GradReadyFn());
  ASSERT_TRUE(la.ok() && lz.ok());
  EXPECT_EQ(la->total, lz->total);
  EXPECT_EQ(0, std::memcmp(a->params().grads(), z->params().grads(), sizeof(float) * n));
  // Another seed gives other weights.
  auto other = MakeModel(c, 2, L, 2, 100);
  EXPECT_NE(0, std::memcmp(a->params().values(), other->params().values(), sizeof(float) * n));
  // Accumulation with grad_scale: g(1.0) + g(0.25) == 1.25 g.
  std::vector<float> g(a->params().grads(), a->params().grads() + n);
  ASSERT_TRUE(a->ForwardBackward(b, 0.25f, GradReadyFn()).ok());
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = a->params().grads()[i] - 1.25 * g[i];
    num += d * d;
    den += 1.5625 * g[i] * g[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-6);
  // A smaller batch than max_batch works; Predict gives one id per slot.
  Batch small = SyntheticBatch(c, L, {5}, false, 17);
  auto p = a->Predict(small);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->size(), small.slot_index.size());
  for (int32_t id : *p) EXPECT_TRUE(id >= 0 && id < c.vocab_size);
}

TEST(DgcaModel, EmptyBatchAndUnlabelledForward) {
  const ModelConfig c = TinyConfig(PromptEncoderKind::kLstm, true);
  const int L = 16;
  auto m = MakeModel(c, 2, L, 2);
  ASSERT_NE(m, nullptr);
  Batch empty;
  empty.batch_size = 0;
  empty.seq_len = L;
  empty.top_k = c.candidate_top_k;
  m->params().ZeroGrads();
  int calls = 0;
  auto lb = m->ForwardBackward(empty, 1.0f, [&](int) { ++calls; });
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_EQ(lb->total, 0.0);
  EXPECT_EQ(calls, c.layers + 3);
  for (int64_t i = 0; i < m->params().total_numel(); ++i) ASSERT_EQ(m->params().grads()[i], 0.0f);
  auto p = m->Predict(empty);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->empty());
  // Without labels Forward runs and reports no loss; ForwardBackward refuses.
  Batch b = SyntheticBatch(c, L, {4, 6}, false, 23);
  b.labels.clear();
  b.slot_target_id.clear();
  auto f = m->Forward(b);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->total, 0.0);
  EXPECT_EQ(f->target_slots, 10);
  EXPECT_FALSE(m->ForwardBackward(b, 1.0f, GradReadyFn()).ok());
  EXPECT_TRUE(m->Predict(b).ok());
}

// The same rows padded to a longer L give the same loss, gradients and
// predictions (the model drops the all-padding columns and remaps rows).
TEST(DgcaModel, ExtraTrailingPaddingChangesNothing) {
  ModelConfig c = TinyConfig(PromptEncoderKind::kLstm, true);
  const int L = 16, L2 = 24;
  auto m = MakeModel(c, 2, L2, 2);
  ASSERT_NE(m, nullptr);
  const Batch a = SyntheticBatch(c, L, {3, 5}, true, 29);
  Batch p = a;
  p.seq_len = L2;
  auto widen = [&](const std::vector<int32_t>& v, int32_t fill) {
    std::vector<int32_t> w(2 * L2, fill);
    for (int r = 0; r < 2; ++r)
      for (int j = 0; j < L; ++j) w[r * L2 + j] = v[r * L + j];
    return w;
  };
  p.input_ids = widen(a.input_ids, kSyntheticPad);
  p.attention_mask = widen(a.attention_mask, 0);
  p.token_type_ids = widen(a.token_type_ids, 0);
  p.prompt_slot = widen(a.prompt_slot, -1);
  p.labels = widen(a.labels, -100);
  p.mft_labels = widen(a.mft_labels, -100);
  for (auto& r : p.slot_index) r = (r / L) * L2 + r % L;
  ParamStore& s = m->params();
  const int64_t n = s.total_numel();
  s.ZeroGrads();
  auto la = m->ForwardBackward(a, 1.0f, GradReadyFn());
  ASSERT_TRUE(la.ok()) << la.status().ToString();
  EXPECT_GT(la->mft, 0.0);
  std::vector<float> ga(s.grads(), s.grads() + n);
  s.ZeroGrads();
  auto lp = m->ForwardBackward(p, 1.0f, GradReadyFn());
  ASSERT_TRUE(lp.ok()) << lp.status().ToString();
  EXPECT_EQ(la->total, lp->total);
  EXPECT_EQ(0, std::memcmp(ga.data(), s.grads(), sizeof(float) * n));
  auto pa = m->Predict(a), pp = m->Predict(p);
  ASSERT_TRUE(pa.ok() && pp.ok());
  EXPECT_EQ(*pa, *pp);
}

TEST(DgcaModel, BadInputsGiveClearErrors) {
  const ModelConfig c = TinyConfig(PromptEncoderKind::kNone, false);
  const int L = 16;
  auto m = MakeModel(c, 2, L, 1);
  ASSERT_NE(m, nullptr);
  auto expect_err = [&](Batch b, const std::string& needle) {
    auto r = m->ForwardBackward(b, 1.0f, GradReadyFn());
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
  };
  const Batch good = SyntheticBatch(c, L, {4, 6}, false, 21);
  ASSERT_TRUE(m->ForwardBackward(good, 1.0f, GradReadyFn()).ok());
  Batch b = good;
  b.input_ids[L + 3] = 30;
  expect_err(b, "input_ids[19] (row 1, position 3)");
  b = good;
  b.attention_mask.pop_back();
  expect_err(b, "attention_mask");
  b = SyntheticBatch(c, L, {4, 6, 5}, false, 22);
  expect_err(b, "max_batch");
  b = good;
  b.slot_index[0] = 999;
  expect_err(b, "slot_index[0]");
  b = good;
  b.slot_target_id[2] = -5;
  expect_err(b, "target of slot 2");
  b = good;
  b.prompt_slot[1] = 7;
  expect_err(b, "prompt_slot[1]");
  ModelConfig bad = c;
  bad.heads = 3;
  auto r = DgcaModel::Create(bad, 2, L, 1, 1);
  EXPECT_FALSE(r.ok());
  r = DgcaModel::Create(c, 2, 64, 1, 1);  // seq_len > max_position
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace dgca
