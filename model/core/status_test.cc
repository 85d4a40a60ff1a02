#include "model/core/status.h"

#include <gtest/gtest.h>

namespace dgca {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Status UseHalf(int x, int* out) {
  DGCA_ASSIGN_OR_RETURN(*out, Half(x));
  return OkStatus();
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(OkStatus().ok());
  Status s = NotFoundError("vocab.txt");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "NOT_FOUND: vocab.txt");
  EXPECT_EQ(s.WithPrefix("loading").message(), "loading: vocab.txt");
}

TEST(StatusTest, AssignOrReturnPropagates) {
  int v = 0;
  EXPECT_TRUE(UseHalf(8, &v).ok());
  EXPECT_EQ(v, 4);
  Status s = UseHalf(3, &v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
}

}  // namespace
}  // namespace dgca
