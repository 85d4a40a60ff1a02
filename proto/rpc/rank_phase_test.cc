// RankPhase in words: the status column and the hang message's phrases.
#include "proto/rpc/rank_phase.h"

#include <gtest/gtest.h>

namespace dgca {
namespace {

v1::RankPhase Phase(v1::RankPhaseKind k, int64_t step, double seconds, int index = 0,
                    int count = 0, int64_t bytes = 0) {
  v1::RankPhase p;
  p.set_kind(k);
  p.set_step(step);
  p.set_seconds(seconds);
  p.set_index(index);
  p.set_count(count);
  p.set_bytes(bytes);
  return p;
}

TEST(RankPhaseTest, Column) {
  EXPECT_EQ(RankPhaseColumn(Phase(v1::RANK_PHASE_BACKWARD, 3, 0.23)), "backward 0.2 s");
  EXPECT_EQ(RankPhaseColumn(Phase(v1::RANK_PHASE_ALL_REDUCE, 3, 12.4, 3, 4, 4 << 20)),
            "all-reduce 3/4 12 s");
  EXPECT_EQ(RankPhaseColumn(Phase(v1::RANK_PHASE_EVAL, 100, 1.0, 2, 10)), "eval 2/10 1.0 s");
  EXPECT_EQ(RankPhaseColumn(Phase(v1::RANK_PHASE_DATA, 5, 40)), "data 40 s");
  EXPECT_EQ(RankPhaseColumn(Phase(v1::RANK_PHASE_CHECKPOINT_BARRIER, 5, 700)),
            "checkpoint barrier 11m40s");
  EXPECT_EQ(RankPhaseColumn(v1::RankPhase()), "-");
  EXPECT_EQ(RankPhaseLabel(v1::RankPhase()), "");
}

TEST(RankPhaseTest, Descriptions) {
  EXPECT_EQ(RankPhaseDescription(Phase(v1::RANK_PHASE_ALL_REDUCE, 4412, 62, 7, 25, 98000000)),
            "in all-reduce 7/25 of step 4412 (98 MB)");
  EXPECT_EQ(RankPhaseDescription(Phase(v1::RANK_PHASE_DATA, 3, 40)),
            "waiting for data (loader) in step 3");
  EXPECT_EQ(RankPhaseDescription(Phase(v1::RANK_PHASE_FORWARD, 12, 1)), "in forward of step 12");
  EXPECT_EQ(RankPhaseDescription(Phase(v1::RANK_PHASE_CHECKPOINT, 500, 1)),
            "writing the checkpoint of step 500");
  EXPECT_EQ(RankPhaseDescription(Phase(v1::RANK_PHASE_EVAL, 100, 1, 3, 10)),
            "in eval batch 3/10 at step 100");
  EXPECT_EQ(RankPhaseDescription(Phase(v1::RANK_PHASE_RENDEZVOUS, 0, 1)),
            "in the rendezvous (building the communicator)");
  EXPECT_EQ(RankPhaseDescription(Phase(v1::RANK_PHASE_STARTING, 0, 1)),
            "starting (reading data, building the model)");
}

TEST(RankPhaseTest, WaitsSamePlaceAndUnits) {
  EXPECT_TRUE(RankPhaseWaits(v1::RANK_PHASE_ALL_REDUCE));
  EXPECT_TRUE(RankPhaseWaits(v1::RANK_PHASE_FINISHING));
  EXPECT_FALSE(RankPhaseWaits(v1::RANK_PHASE_DATA));
  EXPECT_FALSE(RankPhaseWaits(v1::RANK_PHASE_UNSPECIFIED));
  auto a = Phase(v1::RANK_PHASE_ALL_REDUCE, 4, 1, 2, 4, 100);
  auto b = Phase(v1::RANK_PHASE_ALL_REDUCE, 4, 9, 2, 4, 100);
  EXPECT_TRUE(RankPhaseSamePlace(a, b));  // seconds do not matter
  b.set_index(3);
  EXPECT_FALSE(RankPhaseSamePlace(a, b));
  EXPECT_EQ(FormatPhaseBytes(98000000), "98 MB");
  EXPECT_EQ(FormatPhaseBytes(1500000), "1.5 MB");
  EXPECT_EQ(FormatPhaseBytes(512000), "512 KB");
  EXPECT_EQ(FormatPhaseBytes(64), "64 B");
  EXPECT_EQ(FormatPhaseBytes(2500000000LL), "2.5 GB");
  EXPECT_EQ(FormatPhaseSeconds(0.04), "0.0 s");
  EXPECT_EQ(FormatPhaseSeconds(9.5), "9.5 s");
  EXPECT_EQ(FormatPhaseSeconds(9.97), "10 s");
  EXPECT_EQ(FormatPhaseSeconds(62.4), "62 s");
  EXPECT_EQ(FormatPhaseSeconds(245), "245 s");
  EXPECT_EQ(FormatPhaseSeconds(7200), "2h00m");
  EXPECT_EQ(FormatPhaseSeconds(-3), "0.0 s");
}

}  // namespace
}  // namespace dgca
