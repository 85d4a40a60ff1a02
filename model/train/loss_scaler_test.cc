#include "model/train/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace dgca {
namespace {

TEST(LossScalerTest, DefaultsAreGradScalers) {
  auto s = LossScaler::Create(LossScalerOptions());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->scale(), 65536.0);
  EXPECT_EQ(s->options().growth_interval, 2000);
  EXPECT_EQ(s->options().growth_factor, 2.0);
  EXPECT_EQ(s->options().backoff_factor, 0.5);
}

// The sequence torch.cuda.amp.GradScaler produces for the same flags.
TEST(LossScalerTest, BacksOffOnOverflowAndGrowsAfterCleanRuns) {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  auto s = LossScaler::Create(o);
  ASSERT_TRUE(s.ok());
  const bool overflow[] = {false, false, true, false, false, false, false, true, true, false};
  const double want_scale[] = {1024, 1024, 512, 512, 512, 1024, 1024, 512, 256, 256};
  const int64_t want_tracker[] = {1, 2, 0, 1, 2, 0, 1, 0, 0, 1};
  for (int i = 0; i < 10; ++i) {
    s->Update(overflow[i]);
    EXPECT_EQ(s->scale(), want_scale[i]) << "after step " << i + 1;
    EXPECT_EQ(s->growth_tracker(), want_tracker[i]) << "after step " << i + 1;
  }
}

TEST(LossScalerTest, RejectsBadOptionsNamingTheField) {
  LossScalerOptions o;
  o.backoff_factor = 1.5;
  auto s = LossScaler::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("backoff_factor"), std::string::npos) << s.status().ToString();
  o = LossScalerOptions();
  o.init_scale = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(LossScaler::Create(o).ok());
  o = LossScalerOptions();
  o.growth_factor = 1.0;
  EXPECT_FALSE(LossScaler::Create(o).ok());
  o = LossScalerOptions();
  o.growth_interval = 0;
  EXPECT_FALSE(LossScaler::Create(o).ok());
}

TEST(LossScalerTest, RestoreValidatesAndKeepsStateOnError) {
  auto s = LossScaler::Create(LossScalerOptions());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->Restore(128.0, 7).ok());
  EXPECT_EQ(s->scale(), 128.0);
  EXPECT_EQ(s->growth_tracker(), 7);
  EXPECT_FALSE(s->Restore(0.0, 1).ok());
  EXPECT_FALSE(s->Restore(std::nan(""), 1).ok());
  EXPECT_FALSE(s->Restore(64.0, -1).ok());
  EXPECT_EQ(s->scale(), 128.0);
  EXPECT_EQ(s->growth_tracker(), 7);
}

}  // namespace
}  // namespace dgca
