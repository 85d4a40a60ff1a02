// The heartbeat's phase from the trainer's, and the test-only data-stall
// hook's parsing.
#include "worker/rank/rank_phase_report.h"

#include <gtest/gtest.h>

namespace dgca {
namespace {

TEST(RankPhaseReportTest, EveryTrainPhaseHasItsKind) {
  PhaseSnapshot s;
  EXPECT_EQ(RankPhaseOf(s).kind(), v1::RANK_PHASE_UNSPECIFIED);
  s.phase = TrainPhase::kAllReduce;
  s.step = 7;
  s.index = 2;
  s.count = 5;
  s.bytes = 4096;
  s.seconds = 1.5;
  s.progress = 99;
  v1::RankPhase p = RankPhaseOf(s);
  EXPECT_EQ(p.kind(), v1::RANK_PHASE_ALL_REDUCE);
  EXPECT_EQ(p.step(), 7);
  EXPECT_EQ(p.index(), 2);
  EXPECT_EQ(p.count(), 5);
  EXPECT_EQ(p.bytes(), 4096);
  EXPECT_DOUBLE_EQ(p.seconds(), 1.5);
  EXPECT_EQ(p.progress(), 99);
  // The names agree from one end to the other (the enum values are kept
  // in the same order, but the mapping does not rely on it).
  for (int k = static_cast<int>(TrainPhase::kStarting); k <= static_cast<int>(TrainPhase::kFinishing);
       ++k) {
    s.phase = static_cast<TrainPhase>(k);
    EXPECT_EQ(static_cast<int>(RankPhaseOf(s).kind()), k) << TrainPhaseName(s.phase);
  }
}

TEST(RankPhaseReportTest, DataStallHook) {
  auto none = ParseDataStallHook("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->rank, -1);
  auto h = ParseDataStallHook("1:3:30");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->rank, 1);
  EXPECT_EQ(h->step, 3);
  EXPECT_DOUBLE_EQ(h->seconds, 30);
  for (const char* bad : {"1:3", "x:3:30", "1:0:30", "1:3:0", "-1:3:30", "1:3:30:4"}) {
    auto b = ParseDataStallHook(bad);
    EXPECT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("DGCA_TEST_DATA_STALL: expected RANK:STEP:SECONDS"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace dgca
