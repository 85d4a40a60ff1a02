// ParamDeclarer / ParamFinder: the Status each failure gives, naming the
// module and the parameter.
#include "model/nn/params.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace dgca
