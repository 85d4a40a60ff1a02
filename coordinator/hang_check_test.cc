// The progress timeout's decision and message (coordinator/hang_check.h):
// whom it blames, when it fires, what it says of the others; and the views
// it builds from a job's ranks (ageing, silence).
#include "coordinator/hang_check.h"

#include <gtest/gtest.h>

namespace dgca {
namespace {

RankHangView View(int rank, v1::RankPhaseKind kind, int64_t step, double seconds, int index = 0,
                  int count = 0, int64_t bytes = 0, double hb_age = 0.5) {
  RankHangView v;
  v.rank = rank;
  v.node = "a";
  v.has_phase = true;
  v.phase.set_kind(kind);
  v.phase.set_step(step);
  v.phase.set_seconds(seconds);
  v.phase.set_index(index);
  v.phase.set_count(count);
  v.phase.set_bytes(bytes);
  v.heartbeat_age_s = hb_age;
  v.silent = hb_age > SilentAfterSeconds(2);
  return v;
}

TEST(HangCheckTest, HealthyRanksAndNoTimeoutSayNothing) {
  std::vector<RankHangView> v = {View(0, v1::RANK_PHASE_FORWARD, 31, 0.3),
                                 View(1, v1::RANK_PHASE_ALL_REDUCE, 31, 1.2, 1, 4, 1200000)};
  EXPECT_EQ(DescribeHang(v, 8), "");
  EXPECT_EQ(DescribeHang(v, 0), "");
  EXPECT_EQ(DescribeHang({}, 8), "");
  RankHangView none;
  none.rank = 0;
  EXPECT_EQ(DescribeHang({none}, 8), "");  // nothing reported yet
}

TEST(HangCheckTest, ADataStallBlamesTheLoaderNotTheRankWaitingInTheAllReduce) {
  std::vector<RankHangView> v = {View(0, v1::RANK_PHASE_ALL_REDUCE, 3, 8.4, 1, 4, 1200000),
                                 View(1, v1::RANK_PHASE_DATA, 3, 8.5)};
  EXPECT_EQ(DescribeHang(v, 8),
            "rank 1 (node a) stuck 8.5 s waiting for data (loader) in step 3; rank 0 (node a) "
            "waiting 8.4 s in all-reduce 1/4 of step 3 (1.2 MB) (no progress within "
            "train.progress_timeout_s, 8 s)");
  // Not before the blamed rank reaches the timeout, though the waiting one has.
  v[0].phase.set_seconds(8.1);
  v[1].phase.set_seconds(7.9);
  EXPECT_EQ(DescribeHang(v, 8), "");
}

TEST(HangCheckTest, ASilentRankIsBlamedWithItsLastPhase) {
  // SIGSTOP: rank 1's last heartbeat said forward; rank 0 waits in the
  // all-reduce that rank 1 never reached.
  std::vector<RankHangView> v = {
      View(0, v1::RANK_PHASE_ALL_REDUCE, 31, 8.7, 2, 4, 1200000),
      View(1, v1::RANK_PHASE_FORWARD, 31, 9.2, 0, 0, 0, /*hb_age=*/9.0)};
  EXPECT_TRUE(v[1].silent);
  EXPECT_EQ(DescribeHang(v, 8),
            "rank 1 (node a) stuck: no heartbeat for 9.0 s, last in forward of step 31 (no "
            "progress for 9.2 s); rank 0 (node a) waiting 8.7 s in all-reduce 2/4 of step 31 "
            "(1.2 MB) (no progress within train.progress_timeout_s, 8 s)");
  // Stopped inside the same all-reduce: only the silence tells them apart.
  v[1] = View(1, v1::RANK_PHASE_ALL_REDUCE, 31, 9.2, 2, 4, 1200000, /*hb_age=*/9.0);
  const std::string m = DescribeHang(v, 8);
  EXPECT_EQ(m.rfind("rank 1 (node a) stuck: no heartbeat for 9.0 s, last in all-reduce 2/4 of "
                    "step 31 (1.2 MB)", 0), 0u) << m;
  EXPECT_NE(m.find("; rank 0 (node a) waiting in the same all-reduce (8.7 s)"), std::string::npos)
      << m;
}

TEST(HangCheckTest, EveryRankInTheSameCollectiveBlamesTheCollective) {
  std::vector<RankHangView> v = {View(0, v1::RANK_PHASE_ALL_REDUCE, 31, 9.1, 2, 4, 98000000),
                                 View(1, v1::RANK_PHASE_ALL_REDUCE, 31, 9.0, 2, 4, 98000000)};
  v[1].node = "b";
  EXPECT_EQ(DescribeHang(v, 8),
            "ranks 0 (node a), 1 (node b) stuck 9.1 s in all-reduce 2/4 of step 31 (98 MB): "
            "every rank is in it, so the collective itself does not complete (no progress "
            "within train.progress_timeout_s, 8 s)");
}

TEST(HangCheckTest, InDifferentCollectivesTheRankBehindIsBlamed) {
  // Rank 2 is still in step 30's checkpoint barrier; 0 and 1 have moved on.
  std::vector<RankHangView> v = {View(0, v1::RANK_PHASE_ALL_REDUCE, 31, 9.5, 1, 4, 1200000),
                                 View(1, v1::RANK_PHASE_ALL_REDUCE, 31, 9.4, 1, 4, 1200000),
                                 View(2, v1::RANK_PHASE_CHECKPOINT_BARRIER, 30, 12)};
  EXPECT_EQ(DescribeHang(v, 8),
            "rank 2 (node a) stuck 12 s in the checkpoint barrier of step 30; ranks 0 (node a), "
            "1 (node a) waiting 9.5 s in all-reduce 1/4 of step 31 (1.2 MB) (no progress within "
            "train.progress_timeout_s, 8 s)");
}

TEST(HangCheckTest, ABlameThatNeverFiresIsOverruledAtTwiceTheTimeout) {
  // Rank 1 keeps moving (a fresh phase each report) while rank 0 waits:
  // at twice the timeout the hang is reported anyway.
  std::vector<RankHangView> v = {View(0, v1::RANK_PHASE_ALL_REDUCE, 3, 15, 1, 4, 1000),
                                 View(1, v1::RANK_PHASE_FORWARD, 9, 0.2)};
  EXPECT_EQ(DescribeHang(v, 8), "");
  v[0].phase.set_seconds(16.5);
  const std::string m = DescribeHang(v, 8);
  EXPECT_EQ(m.rfind("rank 1 (node a) stuck 0.2 s in forward of step 9; rank 0 (node a) waiting "
                    "16 s in all-reduce 1/4 of step 3", 0), 0u) << m;
}

TEST(HangCheckTest, RanksThatReportedNoPhaseAreListed) {
  RankHangView quiet;
  quiet.rank = 1;
  quiet.node = "b";
  quiet.heartbeat_age_s = 1.5;
  std::vector<RankHangView> v = {View(0, v1::RANK_PHASE_RENDEZVOUS, 0, 9), quiet};
  // Rank 0 waits in the rendezvous for rank 1, which has not said where it is.
  EXPECT_EQ(DescribeHang(v, 8),
            "rank 1 (node b) has reported no phase (last heard from 1.5 s ago); rank 0 (node a) "
            "waiting 9.0 s in the rendezvous (building the communicator) (no progress within "
            "train.progress_timeout_s, 8 s)");
  // A rank out of a collective is blamed before one that said nothing.
  v[0] = View(0, v1::RANK_PHASE_DATA, 2, 9);
  EXPECT_EQ(DescribeHang(v, 8),
            "rank 0 (node a) stuck 9.0 s waiting for data (loader) in step 2; rank 1 (node b) has "
            "reported no phase (last heard from 1.5 s ago) (no progress within "
            "train.progress_timeout_s, 8 s)");
}

TEST(HangCheckTest, SilenceNeedsAboutTwoMissedHeartbeats) {
  EXPECT_DOUBLE_EQ(SilentAfterSeconds(2), 5);
  EXPECT_DOUBLE_EQ(SilentAfterSeconds(0), 5);  // the ranks' default
  EXPECT_DOUBLE_EQ(SilentAfterSeconds(0.5), 3.5);
  EXPECT_DOUBLE_EQ(SilentAfterSeconds(10), 25);
}

TEST(HangCheckTest, ViewsAgeTheReportedPhaseAndSkipEndedRanks) {
  FakeClock clock;
  JobRt rt;
  rt.ranks.resize(3);
  const auto t0 = clock.Now();
  for (int r = 0; r < 3; ++r) {
    rt.ranks[r].node = "n";
    rt.ranks[r].last_progress = t0;
  }
  rt.ranks[0].phase.set_kind(v1::RANK_PHASE_ALL_REDUCE);
  rt.ranks[0].phase.set_step(4);
  rt.ranks[0].phase.set_seconds(1.0);
  rt.ranks[0].phase_at = t0;
  rt.ranks[0].heartbeat_interval_s = 2;
  rt.ranks[1].phase.set_kind(v1::RANK_PHASE_BACKWARD);
  rt.ranks[1].phase.set_step(4);
  rt.ranks[1].phase.set_seconds(0.5);
  rt.ranks[1].phase_at = t0;
  rt.ranks[2].exited = true;
  clock.Advance(6);
  auto views = HangViewsOf(rt, clock.Now());
  ASSERT_EQ(views.size(), 2u);
  EXPECT_DOUBLE_EQ(views[0].phase.seconds(), 7.0);
  EXPECT_DOUBLE_EQ(views[0].heartbeat_age_s, 6.0);
  EXPECT_TRUE(views[0].silent);
  EXPECT_DOUBLE_EQ(views[1].phase.seconds(), 6.5);
  EXPECT_EQ(ProgressStallOf(rt, clock.Now(), 30), "");
  EXPECT_EQ(ProgressStallOf(rt, clock.Now(), 0), "");
  const std::string m = ProgressStallOf(rt, clock.Now(), 6);
  // Both silent (no heartbeat for 6 s): both blamed, rank 0 first.
  EXPECT_EQ(m.rfind("rank 0 (node n) stuck: no heartbeat for 6.0 s, last in all-reduce of step 4 "
                    "(no progress for 7.0 s); rank 1 (node n) stuck: no heartbeat for 6.0 s, last "
                    "in backward of step 4 (no progress for 6.5 s)", 0), 0u) << m;
  EXPECT_EQ(LastPhaseOf(rt, 1, clock.Now()), ", last in backward of step 4 (no progress for 6.5 s)");
  EXPECT_EQ(LastPhaseOf(rt, 2, clock.Now()), "");

  // Rank 1 went on to finish steps 4 to 9 after that report (its step
  // metrics stream every step), then froze: its news is step 9's.
  rt.ranks[1].progress.set_step(9);
  rt.ranks[1].last_step_at = t0 + Seconds(1.5);
  views = HangViewsOf(rt, clock.Now());
  EXPECT_EQ(views[1].finished_step, 9);
  EXPECT_DOUBLE_EQ(views[1].phase.seconds(), 4.5);
  EXPECT_EQ(views[0].finished_step, 0);
  const std::string m2 = ProgressStallOf(rt, clock.Now(), 4);
  EXPECT_NE(m2.find("; rank 1 (node n) stuck: no heartbeat for 6.0 s, last heard of when it "
                    "finished step 9 (no progress for 4.5 s; its last heartbeat said it was in backward "
                    "of step 4)"),
            std::string::npos)
      << m2;
}

// The coordinator's own pause (SIGSTOP, a paused VM) is excused by moving
// every time a rank was last heard of (RankRt::Excuse, called by
// Scheduler::ExcuseOwnPause): a pause longer than the progress timeout
// does not fail healthy ranks as stuck. Moving only the heartbeat time
// (before 58a5630) left the phase to age through the pause.
TEST(HangCheckTest, TheCoordinatorsOwnPauseIsNotARanksHang) {
  FakeClock clock;
  JobRt rt;
  rt.ranks.resize(2);
  const auto t0 = clock.Now();
  for (int r = 0; r < 2; ++r) {
    RankRt& rr = rt.ranks[r];
    rr.node = "n";
    rr.last_progress = t0;
    rr.heartbeat_interval_s = 2;
    rr.phase.set_kind(r == 0 ? v1::RANK_PHASE_FORWARD : v1::RANK_PHASE_ALL_REDUCE);
    rr.phase.set_step(12);
    rr.phase.set_seconds(0.2);
    rr.phase_at = t0;
    rr.progress.set_step(11);
    rr.last_step_at = t0;
  }
  clock.Advance(45);  // the coordinator did not run for 45 s
  const JobRt paused = rt;
  for (RankRt& rr : rt.ranks) rr.Excuse(Seconds(45));
  clock.Advance(1);  // its first tick after the pause
  EXPECT_EQ(ProgressStallOf(rt, clock.Now(), 30), "");
  for (const RankHangView& v : HangViewsOf(rt, clock.Now())) {
    EXPECT_FALSE(v.silent) << v.rank;
    EXPECT_DOUBLE_EQ(v.phase.seconds(), 1.2) << v.rank;
  }
  // Unexcused, the same ranks read as frozen for 46 s.
  EXPECT_NE(ProgressStallOf(paused, clock.Now(), 30), "");
}

}  // namespace
}  // namespace dgca
