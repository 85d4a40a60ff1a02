// `dgca cancel` stops every rank process of a running job within 5 s and the
// job ends CANCELLED (docs/operations.md). Real programs on loopback.
#include <gtest/gtest.h>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

TEST(CancelJobTest, CancelStopsEveryRankWithin5s) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("cancel");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start());
  std::string spec = WriteTinySpec(dir, "long-job", 1000000);
  Result sub = Dgca(coord, {"submit", spec});
  ASSERT_EQ(sub.code, 0) << sub.err << coord.Log();
  std::string job = Trim(sub.out);

  // Running, both ranks past their first step.
  JobView v;
  bool running = WaitUntil(
      [&] {
        v = Status(coord, job);
        if (!v.ok || v.state != "RUNNING" || v.pids.size() != 2) return false;
        for (int64_t s : v.rank_steps) {
          if (s < 1) return false;
        }
        return true;
      },
      45s);
  ASSERT_TRUE(running) << v.raw << "\n" << coord.Log();
  for (pid_t p : v.pids) ASSERT_TRUE(ProcessAlive(p)) << p;

  auto t0 = Clock::now();
  Result cancel = Dgca(coord, {"cancel", job});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  bool gone = WaitUntil(
      [&] {
        for (pid_t p : v.pids) {
          if (ProcessAlive(p)) return false;
        }
        return true;
      },
      5s);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_TRUE(gone) << "rank processes still alive " << secs << " s after cancel";
  std::fprintf(stderr, "cancel: every rank gone %.2f s after `dgca cancel`\n", secs);
  for (pid_t p : v.pids) {
    if (ProcessAlive(p)) kill(p, SIGKILL);  // never leave them behind
  }
  JobView after;
  EXPECT_TRUE(WaitUntil(
      [&] {
        after = Status(coord, job);
        return after.state == "CANCELLED";
      },
      10s))
      << after.raw;
  // Its ranks ended on the cancel's stop: they read "cancelled", not
  // "failed" (they exit 5 or take SIGTERM).
  EXPECT_EQ(after.rank_states, std::vector<std::string>({"cancelled", "cancelled"})) << after.raw;
  // Cancelling again is harmless and no error for a script: exit 0, saying
  // the job had already ended; it stays CANCELLED.
  Result again = Dgca(coord, {"cancel", job});
  EXPECT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("had already ended: CANCELLED (nothing to cancel)"), std::string::npos)
      << again.out;
  EXPECT_EQ(Status(coord, job).state, "CANCELLED");
  // `dgca submit --wait` semantics for a cancelled job: watch exits 1.
  Result watch = Dgca(coord, {"watch", job}, 30s);
  EXPECT_EQ(watch.code, 1) << watch.out << watch.err;
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
