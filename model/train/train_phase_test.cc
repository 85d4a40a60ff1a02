// PhaseTracker: what Enter/Progress record, the clock, and that a reader on
// another thread never sees a mix of two writes.
#include "model/train/train_phase.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace dgca {
namespace {

TEST(TrainPhaseTest, NamesAndWhichPhasesWait) {
  EXPECT_STREQ(TrainPhaseName(TrainPhase::kAllReduce), "all-reduce");
  EXPECT_STREQ(TrainPhaseName(TrainPhase::kData), "data");
  EXPECT_STREQ(TrainPhaseName(TrainPhase::kCheckpointBarrier), "checkpoint barrier");
  EXPECT_TRUE(TrainPhaseWaits(TrainPhase::kAllReduce));
  EXPECT_TRUE(TrainPhaseWaits(TrainPhase::kRendezvous));
  EXPECT_TRUE(TrainPhaseWaits(TrainPhase::kCheckpointBarrier));
  EXPECT_FALSE(TrainPhaseWaits(TrainPhase::kData));
  EXPECT_FALSE(TrainPhaseWaits(TrainPhase::kBackward));
  EXPECT_FALSE(TrainPhaseWaits(TrainPhase::kCheckpoint));
}

TEST(TrainPhaseTest, EnterRecordsThePhaseAndRestartsTheClock) {
  PhaseTracker t;
  PhaseSnapshot s0 = t.Read();
  EXPECT_EQ(s0.phase, TrainPhase::kUnknown);
  EXPECT_EQ(s0.progress, 0);
  t.Enter(TrainPhase::kAllReduce, 12, 3, 4, 1 << 20);
  const auto entered = PhaseTracker::Clock::now();
  PhaseSnapshot s = t.ReadAt(entered + std::chrono::milliseconds(2500));
  EXPECT_EQ(s.phase, TrainPhase::kAllReduce);
  EXPECT_EQ(s.step, 12);
  EXPECT_EQ(s.index, 3);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.bytes, 1 << 20);
  EXPECT_EQ(s.progress, 1);
  EXPECT_NEAR(s.seconds, 2.5, 0.1);
  // A new phase clears the all-reduce's details.
  t.Enter(TrainPhase::kOptimizer, 12);
  s = t.Read();
  EXPECT_EQ(s.phase, TrainPhase::kOptimizer);
  EXPECT_EQ(s.index, 0);
  EXPECT_EQ(s.count, 0);
  EXPECT_EQ(s.bytes, 0);
  EXPECT_EQ(s.progress, 2);
  EXPECT_LT(s.seconds, 1.0);
}

TEST(TrainPhaseTest, ProgressKeepsThePhaseAndRestartsTheClock) {
  PhaseTracker t;
  t.Enter(TrainPhase::kEval, 100, 1, 10);
  const auto before = PhaseTracker::Clock::now();
  t.Progress(7);
  PhaseSnapshot s = t.ReadAt(before + std::chrono::seconds(1));
  EXPECT_EQ(s.phase, TrainPhase::kEval);
  EXPECT_EQ(s.step, 100);
  EXPECT_EQ(s.index, 7);
  EXPECT_EQ(s.count, 10);
  EXPECT_EQ(s.progress, 2);
  EXPECT_LT(s.seconds, 1.5);
  // A read "before" the last progress is not negative.
  EXPECT_EQ(t.ReadAt(before - std::chrono::seconds(5)).seconds, 0);
}

// The writer keeps step, index, count and bytes equal; a reader must never
// see them differ (a torn snapshot).
TEST(TrainPhaseTest, ReadersNeverSeeHalfAWrite) {
  PhaseTracker t;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int32_t i = 1; i <= 200000; ++i) {
      t.Enter(i % 2 ? TrainPhase::kForward : TrainPhase::kBackward, i, i, i, i);
    }
    done = true;
  });
  int64_t reads = 0, torn = 0, last_progress = 0, backwards = 0;
  while (!done.load()) {
    PhaseSnapshot s = t.Read();
    ++reads;
    if (s.progress == 0) continue;
    if (s.step != s.index || s.step != s.count || s.step != s.bytes) ++torn;
    if (s.progress < last_progress) ++backwards;
    last_progress = s.progress;
  }
  writer.join();
  EXPECT_GT(reads, 0);
  EXPECT_EQ(torn, 0);
  EXPECT_EQ(backwards, 0);
  EXPECT_EQ(t.Read().progress, 200000);
}

}  // namespace
}  // namespace dgca
