// kill -9 of the coordinator while a job runs, then a restart on the same
// state dir: every job is still listed once, with its history; the running
// job is re-adopted or FAILED "coordinator restarted" -- never lost, never
// duplicated (issue 2, must show 4). Real programs on loopback.
#include <gtest/gtest.h>

#include <map>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

int CountOccurrences(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

TEST(CoordinatorRestartTest, Kill9ThenRestartKeepsEveryJob) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("restart");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start());

  // One finished job and one running job before the crash.
  Result done = Dgca(coord, {"submit", WriteTinySpec(dir, "finished", 2, 1), "--wait"}, 90s);
  ASSERT_EQ(done.code, 0) << done.out << done.err << coord.Log();
  std::string done_id = done.out.substr(0, done.out.find('\n'));
  Result sub = Dgca(coord, {"submit", WriteTinySpec(dir, "running", 1000000)});
  ASSERT_EQ(sub.code, 0) << sub.err;
  std::string run_id = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitUntil(
      [&] {
        v = Status(coord, run_id);
        return v.state == "RUNNING" && v.pids.size() == 2 && v.step >= 1;
      },
      45s))
      << v.raw << coord.Log();
  const int events_before = v.events;
  std::string address = coord.address();

  coord.Kill9();
  // Same address, as a real restart would (ranks may call back).
  ASSERT_TRUE(coord.Start(address));

  // Listed exactly once each.
  Result list = Dgca(coord, {"list", "--json"});
  ASSERT_EQ(list.code, 0) << list.err << coord.Log();
  EXPECT_EQ(CountOccurrences(list.out, "\"id\": \"" + run_id + "\""), 1) << list.out;
  EXPECT_EQ(CountOccurrences(list.out, "\"id\": \"" + done_id + "\""), 1) << list.out;
  EXPECT_EQ(Status(coord, done_id).state, "SUCCEEDED");

  // The running job: re-adopted (still RUNNING, or it went on to end) or
  // FAILED "coordinator restarted"; its history kept and extended.
  JobView after;
  ASSERT_TRUE(WaitUntil(
      [&] {
        after = Status(coord, run_id);
        return after.ok && (after.state == "FAILED" || after.state == "RUNNING");
      },
      30s))
      << after.raw << coord.Log();
  std::fprintf(stderr, "after restart: job %s %s: %s\n", run_id.c_str(), after.state.c_str(),
               after.message.c_str());
  if (after.state == "FAILED") {
    EXPECT_NE(after.message.find("coordinator restarted"), std::string::npos) << after.raw;
  }
  EXPECT_GE(after.events, events_before) << after.raw;

  // Clean up: cancel if re-adopted, then no rank of either coordinator may
  // outlive the test.
  if (after.state == "RUNNING") Dgca(coord, {"cancel", run_id});
  coord.Stop();
  bool gone = WaitUntil(
      [&] {
        for (pid_t p : v.pids) {
          if (ProcessAlive(p)) return false;
        }
        return true;
      },
      40s);
  EXPECT_TRUE(gone) << "ranks of the killed coordinator outlived the job";
  for (pid_t p : v.pids) {
    if (ProcessAlive(p)) kill(p, SIGKILL);
  }
  if (!::testing::Test::HasFailure()) std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace itest
}  // namespace dgca
