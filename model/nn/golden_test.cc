// Golden test: the C++ DGCA-ReLM model (prompt encoder none, heads off,
// fusion none = plain ReLM) against Hugging Face BertForMaskedLM, from the
// files tests/golden/make_golden.py writes (model.safetensors, weights by HF
// name; golden.safetensors, the batch, logits, losses and every gradient).
//
// Error measure: per tensor, the norm-based relative error
//   ||ours - hf||_2 / ||hf||_2
// Bounds (fp32): logits and losses 1e-4, gradients 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "model/core/safetensors.h"
#include "model/nn/bert.h"
#include "model/nn/model.h"

namespace dgca {
namespace {

std::string GoldenDir() {
  const char* d = std::getenv("DGCA_SOURCE_DIR");
  return std::string(d != nullptr ? d : ".") + "/tests/golden";
}

double RelErr(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto w = ReadSafetensors(GoldenDir() + "/model.safetensors");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    weights_ = std::move(w).value();
    auto g = ReadSafetensors(GoldenDir() + "/golden.safetensors");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    gold_ = std::move(g).value();
    const auto& s = T("sizes").data;
    ASSERT_EQ(s.size(), 9u);
    cfg_.vocab_size = static_cast<int>(s[0]);
    cfg_.hidden = static_cast<int>(s[1]);
    cfg_.layers = static_cast<int>(s[2]);
    cfg_.heads = static_cast<int>(s[3]);
    cfg_.ffn = static_cast<int>(s[4]);
    cfg_.max_position = static_cast<int>(s[5]);
    B_ = static_cast<int>(s[6]);
    L_ = static_cast<int>(s[7]);
    cfg_.prompt_length = static_cast<int>(s[8]);
    cfg_.type_vocab = 2;
    cfg_.layer_norm_eps = 1e-12f;
    cfg_.prompt_encoder = PromptEncoderKind::kNone;
    cfg_.detector = false;
    cfg_.candidate = false;
    cfg_.fusion = FusionKind::kNone;

    auto ints = [&](const char* name) {
      std::vector<int32_t> v;
      for (float f : T(name).data) v.push_back(static_cast<int32_t>(std::lround(f)));
      return v;
    };
    batch_.batch_size = B_;
    batch_.seq_len = L_;
    batch_.input_ids = ints("input_ids");
    batch_.attention_mask = ints("attention_mask");
    batch_.token_type_ids = ints("token_type_ids");
    batch_.prompt_slot = ints("prompt_slot");
    batch_.labels = ints("labels");
    batch_.mft_labels = ints("mft_labels");
    batch_.slot_index = ints("slot_index");
    batch_.slot_source_id = ints("slot_source_id");
    batch_.slot_target_id = ints("slot_target_id");
  }

  const Tensor& T(const std::string& name) {
    static const Tensor kEmpty;
    auto it = gold_.tensors.find(name);
    EXPECT_NE(it, gold_.tensors.end()) << "golden.safetensors lacks " << name;
    return it == gold_.tensors.end() ? kEmpty : it->second;
  }

  // Copies every HF tensor into `store` by name; every parameter must be
  // covered and every file tensor used, with equal shapes.
  void LoadWeights(ParamStore* store) {
    ASSERT_EQ(static_cast<size_t>(store->size()), weights_.tensors.size());
    for (int i = 0; i < store->size(); ++i) {
      const ParamInfo& p = store->info(i);
      auto it = weights_.tensors.find(p.name);
      ASSERT_NE(it, weights_.tensors.end()) << "model.safetensors lacks " << p.name;
      ASSERT_EQ(it->second.shape, p.shape) << p.name;
      std::memcpy(store->value(i), it->second.data.data(), sizeof(float) * p.numel);
    }
  }

  ModelConfig cfg_;
  int B_ = 0, L_ = 0;
  SafetensorsFile weights_, gold_;
  Batch batch_;
};

TEST_F(GoldenTest, LogitsMatchHuggingFace) {
  // The Bert module directly: logits on the gathered rows (target slots,
  // then MFT positions), as the golden file stores them.
  std::vector<int32_t> rows = batch_.slot_index;
  for (int i = 0; i < B_ * L_; ++i)
    if (batch_.mft_labels[i] != -100) rows.push_back(i);
  const Tensor& ref = T("logits");
  ASSERT_EQ(ref.data.size(), rows.size() * cfg_.vocab_size);
  for (int threads : {1, 2}) {
    ParamStore store;
    Bert bert(cfg_, B_, L_, B_ * L_);
    ASSERT_TRUE(bert.DeclareWordEmbeddings(&store).ok());
    ASSERT_TRUE(bert.DeclareBody(&store).ok());
    ASSERT_TRUE(bert.DeclareMlmHead(&store).ok());
    store.Finalize();
    ASSERT_TRUE(bert.Bind(&store).ok());
    LoadWeights(&store);
    cpu::ThreadPool pool(threads);
    cpu::Context ctx{&pool};
    bert.EmbedForward(ctx, batch_.input_ids.data(), batch_.token_type_ids.data(),
                      batch_.prompt_slot.data(), nullptr, B_, L_);
    bert.EncoderForward(ctx, batch_.attention_mask.data(), B_, L_);
    const float* z = bert.MlmHeadForward(ctx, rows.data(), static_cast<int>(rows.size()));
    const double err = RelErr(z, ref.data.data(), ref.data.size());
    std::printf("threads %d: logits relative error %.3g\n", threads, err);
    EXPECT_LT(err, 1e-4);
  }
}

TEST_F(GoldenTest, LossAndEveryGradientMatchHuggingFace) {
  auto m = DgcaModel::Create(cfg_, B_, L_, /*seed=*/7, /*threads=*/2);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  DgcaModel& model = **m;
  ParamStore& store = model.params();
  LoadWeights(&store);
  store.ZeroGrads();
  std::vector<int> ready;
  auto lb = model.ForwardBackward(batch_, 1.0f, [&](int first) { ready.push_back(first); });
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  const auto& loss = T("loss").data;  // total, fusion, mft
  std::printf("loss total %.7f (hf %.7f) fusion %.7f (hf %.7f) mft %.7f (hf %.7f)\n", lb->total,
              loss[0], lb->fusion, loss[1], lb->mft, loss[2]);
  EXPECT_LT(std::abs(lb->total - loss[0]) / std::abs(loss[0]), 1e-4);
  EXPECT_LT(std::abs(lb->fusion - loss[1]) / std::abs(loss[1]), 1e-4);
  EXPECT_LT(std::abs(lb->mft - loss[2]) / std::abs(loss[2]), 1e-4);
  EXPECT_EQ(lb->target_slots, static_cast<int64_t>(batch_.slot_index.size()));

  // The attention key bias has an exactly zero gradient in exact arithmetic
  // (softmax is invariant to the per-row shift q.b_k), so its HF "gradient"
  // is rounding noise; for such tensors (norm below 1e-6 of the whole
  // gradient's norm) ours must be noise of the same size instead.
  double all = 0;
  for (int i = 0; i < store.size(); ++i)
    for (float v : T("grad." + store.info(i).name).data) all += static_cast<double>(v) * v;
  all = std::sqrt(all);
  double worst = 0;
  std::string worst_name;
  int zero_tensors = 0;
  for (int i = 0; i < store.size(); ++i) {
    const ParamInfo& p = store.info(i);
    const Tensor& ref = T("grad." + p.name);
    ASSERT_EQ(ref.data.size(), static_cast<size_t>(p.numel)) << p.name;
    std::vector<float> zeros(ref.data.size(), 0.0f);
    if (RelErr(ref.data.data(), zeros.data(), zeros.size()) < 1e-6 * all) {
      ++zero_tensors;
      EXPECT_LT(RelErr(store.grad(i), zeros.data(), zeros.size()), 1e-6 * all) << p.name;
      continue;
    }
    const double err = RelErr(store.grad(i), ref.data.data(), ref.data.size());
    EXPECT_LT(err, 1e-3) << p.name;
    if (err > worst) worst = err, worst_name = p.name;
  }
  EXPECT_EQ(zero_tensors, cfg_.layers);  // exactly the key biases
  std::printf("worst gradient relative error %.3g (%s) over %d tensors (%d analytically zero)\n",
              worst, worst_name.c_str(), store.size(), zero_tensors);

  // on_grad_ready: strictly decreasing, ending at 0, one call per stage.
  ASSERT_EQ(ready.size(), static_cast<size_t>(cfg_.layers + 3));
  EXPECT_EQ(store.info(ready.front()).name, "cls.predictions.transform.dense.weight");
  for (size_t k = 1; k < ready.size(); ++k) EXPECT_LT(ready[k], ready[k - 1]);
  EXPECT_EQ(ready.back(), 0);
  EXPECT_EQ(store.info(0).name, "bert.embeddings.word_embeddings.weight");

  // Gradients accumulate: a second call with grad_scale 0.5 gives 1.5x.
  std::vector<float> g1(store.grads(), store.grads() + store.total_numel());
  auto lb2 = model.ForwardBackward(batch_, 0.5f, GradReadyFn());
  ASSERT_TRUE(lb2.ok());
  EXPECT_EQ(lb2->total, lb->total);
  for (auto& v : g1) v *= 1.5f;
  EXPECT_LT(RelErr(store.grads(), g1.data(), g1.size()), 1e-6);

  // Predict = argmax of the HF logits on the target slots.
  auto pred = model.Predict(batch_);
  ASSERT_TRUE(pred.ok());
  const Tensor& z = T("logits");
  const int V = cfg_.vocab_size;
  for (size_t t = 0; t < batch_.slot_index.size(); ++t) {
    int best = 0;
    for (int v = 1; v < V; ++v)
      if (z.data[t * V + v] > z.data[t * V + best]) best = v;
    EXPECT_EQ((*pred)[t], best) << "slot " << t;
  }
}

}  // namespace
}  // namespace dgca
