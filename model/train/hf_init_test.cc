// LoadHfInit against a real Hugging Face BertForMaskedLM file: the golden
// model under tests/golden/ (written by tests/golden/make_golden.py with
// transformers), loaded into a DgcaModel of the same sizes.
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "model/core/core_test_util.h"
#include "model/core/safetensors.h"
#include "model/nn/model.h"
#include "model/train/checkpoint.h"

namespace dgca {
namespace {

std::string SourceDir() {
  const char* d = getenv("DGCA_SOURCE_DIR");
  return d ? d : ".";
}

TEST(HfInitRealModelTest, GoldenBertForMaskedLMLoadsIntoDgcaModel) {
  const std::string weights = SourceDir() + "/tests/golden/model.safetensors";
  const std::string golden = SourceDir() + "/tests/golden/golden.safetensors";
  if (!std::filesystem::exists(weights) || !std::filesystem::exists(golden)) {
    GTEST_SKIP() << "no " << weights << " (run from the repository root or set DGCA_SOURCE_DIR)";
  }
  auto g = ReadSafetensors(golden);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::vector<float>& sz = g->tensors.at("sizes").data;  // V H LAYERS HEADS FFN MAXPOS ...
  ModelConfig cfg;
  cfg.vocab_size = static_cast<int>(sz[0]);
  cfg.hidden = static_cast<int>(sz[1]);
  cfg.layers = static_cast<int>(sz[2]);
  cfg.heads = static_cast<int>(sz[3]);
  cfg.ffn = static_cast<int>(sz[4]);
  cfg.max_position = static_cast<int>(sz[5]);
  auto model = DgcaModel::Create(cfg, 2, std::min(cfg.max_position, 32), 1, 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ParamStore& ps = (*model)->params();

  // Make it look like a full HF checkpoint: add the extras HF files carry.
  auto hf = ReadSafetensors(weights);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  std::vector<TensorView> views;
  for (const auto& kv : hf->tensors) views.push_back({kv.first, kv.second.shape, kv.second.data.data()});
  const Tensor& wte = hf->tensors.at("bert.embeddings.word_embeddings.weight");
  const Tensor& bias = hf->tensors.at("cls.predictions.bias");
  std::vector<float> pos_ids(cfg.max_position), pool_w(cfg.hidden * cfg.hidden), pool_b(cfg.hidden);
  views.push_back({"cls.predictions.decoder.weight", wte.shape, wte.data.data()});
  views.push_back({"cls.predictions.decoder.bias", bias.shape, bias.data.data()});
  views.push_back({"bert.embeddings.position_ids", {1, cfg.max_position}, pos_ids.data()});
  views.push_back({"bert.pooler.dense.weight", {cfg.hidden, cfg.hidden}, pool_w.data()});
  views.push_back({"bert.pooler.dense.bias", {cfg.hidden}, pool_b.data()});
  const std::string dir = testutil::MakeTempDir("hf_init_test");
  ASSERT_FALSE(dir.empty());
  const std::string full = dir + "/hf.safetensors";
  ASSERT_TRUE(WriteSafetensors(full, views).ok());

  auto r = LoadHfInit(full, &ps);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  printf("%s\n", r->Summary().c_str());
  EXPECT_EQ(r->loaded, static_cast<int>(hf->tensors.size()));  // every HF parameter found a home
  EXPECT_TRUE(r->unexpected.empty());
  EXPECT_EQ(r->ignored.size(), 5u);
  for (const std::string& m : r->missing) {
    const bool ours = m.rfind("prompt.", 0) == 0 || m.rfind("detector.", 0) == 0 ||
                      m.rfind("candidate.", 0) == 0 || m.rfind("fusion.", 0) == 0;
    EXPECT_TRUE(ours) << "BERT tensor not loaded: " << m;
  }
  for (const auto& kv : hf->tensors) {
    const int i = ps.Find(kv.first);
    ASSERT_GE(i, 0) << kv.first;
    for (size_t j = 0; j < kv.second.data.size(); ++j) {
      ASSERT_EQ(ps.value(i)[j], kv.second.data[j]) << kv.first << "[" << j << "]";
    }
  }
}

}  // namespace
}  // namespace dgca
