// ParamDeclarer / ParamFinder: the Status each failure gives, naming the
// module and the parameter. ParamStore's layout (params.h): aligned
// tensors, equal-shape runs kept adjacent (the fused QKV GEMM), the gaps
// zero.
#include "model/nn/params.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/nn/model.h"

namespace dgca {
namespace {

TEST(ParamDeclarerAndFinder, NameTheModuleTheParameterAndTheShapes) {
  ParamStore store;
  const ParamDeclarer declare(&store, "Heads::Declare");
  int w = -1, b = -1, again = -1;
  ASSERT_TRUE(declare("head.weight", {4, 3}, true, &w).ok());
  ASSERT_TRUE(declare("head.bias", {4}, false, &b).ok());
  EXPECT_EQ(w, 0);
  EXPECT_EQ(b, 1);
  EXPECT_FALSE(store.info(b).weight_decay);
  Status twice = declare("head.bias", {4}, false, &again);
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.message(), "Heads::Declare: parameter head.bias is declared twice");
  EXPECT_EQ(again, -1);
  store.Finalize();
  Status late = declare("head.extra", {1}, true, &again);
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(late.message(), "Heads::Declare: the ParamStore is already finalized (declaring head.extra)");

  const ParamFinder find(store, "Heads::Bind");
  int found = -1;
  ASSERT_TRUE(find("head.bias", {4}, false, &found).ok());
  EXPECT_EQ(found, b);
  Status missing = find("head.gain", {4}, true, &found);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.message(), "Heads::Bind: parameter head.gain was not declared");
  Status shape = find("head.weight", {3, 4}, true, &found);
  EXPECT_EQ(shape.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(shape.message(), "Heads::Bind: parameter head.weight has shape [4, 3], expected [3, 4]");
  EXPECT_EQ(ShapeString({}), "[]");
}

TEST(ParamStoreTest, TensorsStartAlignedUnlessTheyFollowThePrevious) {
  ParamStore ps;
  const int a = ps.Declare("a", {3}, true);                    // 0..3
  const int b = ps.Declare("b", {2, 5}, true);                 // aligned: 8..18
  const int q = ps.Declare("q", {3, 3}, true);                 // aligned: 24..33
  const int k = ps.Declare("k", {3, 3}, true, /*follows=*/true);  // 33..42
  const int v = ps.Declare("v", {3, 3}, true, /*follows=*/true);  // 42..51
  const int w = ps.Declare("w", {3, 3}, true);                 // same shape, not following: 56..65
  const int c = ps.Declare("c", {1}, false);                   // aligned: 72
  ps.Finalize();
  EXPECT_EQ(ps.info(a).offset, 0);
  EXPECT_EQ(ps.info(b).offset, 8);
  EXPECT_EQ(ps.info(q).offset, 24);
  EXPECT_EQ(ps.info(k).offset, ps.info(q).offset + 9);
  EXPECT_EQ(ps.info(v).offset, ps.info(k).offset + 9);
  EXPECT_EQ(ps.info(w).offset, 56);
  EXPECT_EQ(ps.info(c).offset, 72);
  EXPECT_EQ(ps.total_numel(), 73);
  EXPECT_EQ(ps.parameter_count(), 3 + 10 + 36 + 1);
  for (int64_t i = 0; i < ps.total_numel(); ++i) {
    EXPECT_EQ(ps.values()[i], 0.0f);
    EXPECT_EQ(ps.grads()[i], 0.0f);
  }
}

// The whole model: only BERT's key and value tensors follow the query's
// (the fused QKV GEMM); every other tensor starts 32-byte aligned (16 bytes
// of its 16-bit copy), the candidate head's after the detector's 1-float
// bias too. bert-base (H = 768: even key and value stay aligned) and a
// hidden size of 12, which is not a multiple of 8.
TEST(ParamStoreTest, OnlyKeyAndValueFollowTheQuery) {
  for (const int H : {768, 12}) {
    SCOPED_TRACE(H);
    ModelConfig cfg = ApplyPreset("bert-base", ModelConfig()).value();
    cfg.vocab_size = 21128;
    if (H == 12) cfg.hidden = 12, cfg.heads = 3, cfg.ffn = 20, cfg.layers = 2;
    auto m = DgcaModel::Create(cfg, 1, 16, 1, 1);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const ParamStore& ps = (*m)->params();
    EXPECT_EQ(ps.parameter_count(), CountParameters(cfg));
    for (int i = 0; i < ps.size(); ++i) {
      const ParamInfo& p = ps.info(i);
      const bool kv = p.name.find("attention.self.key.") != std::string::npos ||
                      p.name.find("attention.self.value.") != std::string::npos;
      if (kv) {
        EXPECT_EQ(ps.info(i - 1).offset + ps.info(i - 1).numel, p.offset) << p.name;
      } else {
        EXPECT_EQ(p.offset % ParamStore::kAlignFloats, 0) << p.name;
      }
    }
  }
}

}  // namespace
}  // namespace dgca
