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

TEST(ParamStoreTest, TensorsStartAlignedExceptEqualShapeRuns) {
  ParamStore ps;
  const int a = ps.Declare("a", {3}, true);          // 0..3
  const int b = ps.Declare("b", {2, 5}, true);       // aligned: 8..18
  const int q = ps.Declare("q", {3, 3}, true);       // aligned: 24..33
  const int k = ps.Declare("k", {3, 3}, true);       // same shape: 33..42, adjacent
  const int v = ps.Declare("v", {3, 3}, true);       // 42..51
  const int c = ps.Declare("c", {1}, false);         // aligned: 56
  ps.Finalize();
  EXPECT_EQ(ps.info(a).offset, 0);
  EXPECT_EQ(ps.info(b).offset, 8);
  EXPECT_EQ(ps.info(q).offset, 24);
  EXPECT_EQ(ps.info(k).offset, ps.info(q).offset + 9);
  EXPECT_EQ(ps.info(v).offset, ps.info(k).offset + 9);
  EXPECT_EQ(ps.info(c).offset, 56);
  EXPECT_EQ(ps.total_numel(), 57);
  EXPECT_EQ(ps.parameter_count(), 3 + 10 + 27 + 1);
  for (int64_t i = 0; i < ps.total_numel(); ++i) {
    EXPECT_EQ(ps.values()[i], 0.0f);
    EXPECT_EQ(ps.grads()[i], 0.0f);
  }
}

// The whole model: every tensor of bert-base DGCA-ReLM (whose detector and
// gate biases are single floats) starts 32-byte aligned (16 bytes of its
// 16-bit copy) unless it continues q/k/v; the count is CountParameters'.
TEST(ParamStoreTest, TheModelsTensorsAreAligned) {
  ModelConfig cfg = ApplyPreset("bert-base", ModelConfig()).value();
  cfg.vocab_size = 21128;
  auto m = DgcaModel::Create(cfg, 1, 16, 1, 1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ParamStore& ps = (*m)->params();
  EXPECT_EQ(ps.parameter_count(), CountParameters(cfg));
  std::vector<std::string> continued;  // the tensors not aligned
  for (int i = 0; i < ps.size(); ++i) {
    const ParamInfo& p = ps.info(i);
    if (p.offset % ParamStore::kAlignFloats == 0) continue;
    continued.push_back(p.name);
    ASSERT_GT(i, 0);
    EXPECT_EQ(ps.info(i - 1).shape, p.shape) << p.name;
    EXPECT_EQ(ps.info(i - 1).offset + ps.info(i - 1).numel, p.offset) << p.name;
  }
  // H = 768 keeps q/k/v aligned; only the gate's bias continues its [1]
  // det_scale.
  EXPECT_EQ(continued, std::vector<std::string>({"fusion.gate.bias"}));
  const int cand = ps.Find("candidate.dense.weight");
  ASSERT_GE(cand, 0);
  EXPECT_EQ(ps.info(cand).offset % ParamStore::kAlignFloats, 0);  // after the detector's 1-float bias
}

}  // namespace
}  // namespace dgca
