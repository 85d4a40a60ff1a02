// A rank killed with SIGKILL mid-run: the job restarts from its last
// checkpoint (max_restarts: 1), every rank resumes, and it still SUCCEEDS
// (docs/operations.md). Real programs on loopback.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

TEST(RankRestartTest, KilledRankRestartsFromCheckpoint) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("rank-restart");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start());
  std::string spec = dir + "/restart.yaml";
  WriteFile(spec,
            "name: restart\n"
            "model: {preset: tiny}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  eval: " + SharedData() + "/ecspell/test_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: 150, global_batch: 8, eval_every: 0, checkpoint_every: 10,\n"
            "        max_restarts: 1, optimizer: {lr: 1.0e-3}}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n");
  Result sub = Dgca(coord, {"submit", spec});
  ASSERT_EQ(sub.code, 0) << sub.err;
  std::string job = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitRunning(coord, job, 2, 15, 60s, &v)) << v.raw << coord.Log();
  ASSERT_LT(v.step, 150) << "the job finished before the kill; make it longer";
  pid_t victim = v.pids[1];
  ASSERT_EQ(kill(victim, SIGKILL), 0);

  Result watch = Dgca(coord, {"watch", job}, 120s);
  JobView end = Status(coord, job);
  EXPECT_EQ(watch.code, 0) << watch.out << watch.err << end.raw << coord.Log();
  EXPECT_EQ(end.state, "SUCCEEDED") << end.raw;
  EXPECT_NE(end.raw.find("\"restarts\": 1"), std::string::npos) << end.raw;
  Result logs = Dgca(coord, {"logs", job, "--rank", "1"});
  EXPECT_NE(logs.out.find("attempt 1"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("resum"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("step 150/150"), std::string::npos) << logs.out;
  for (pid_t p : v.pids) {
    if (ProcessAlive(p)) kill(p, SIGKILL);
  }
  coord.Stop();
}

// A failed rank whose log cannot be read (here a directory where its log
// was, as a full disk or an operator's mistake can leave it): the agent
// reports the failure without the log's tail, and the coordinator, whose
// embedded agent it is, stays up (it aborted with std::out_of_range).
TEST(RankRestartTest, AnUnreadableLogDoesNotTakeTheCoordinatorDown) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("log-gone");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start());
  std::string spec = dir + "/log-gone.yaml";
  WriteFile(spec,
            "name: log-gone\n"
            "model: {preset: tiny}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: 2000, global_batch: 8, eval_every: 0, checkpoint_every: 0}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n");
  Result sub = Dgca(coord, {"submit", spec});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitRunning(coord, job, 2, 3, 60s, &v)) << v.raw << coord.Log();
  std::string log;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir + "/state"))
    if (e.path().filename() == "rank-1.log") log = e.path().string();
  ASSERT_FALSE(log.empty()) << "no rank-1.log under " << dir;
  ASSERT_EQ(rename(log.c_str(), (log + ".moved").c_str()), 0);
  ASSERT_EQ(mkdir(log.c_str(), 0755), 0);
  ASSERT_EQ(kill(v.pids[1], SIGKILL), 0);
  JobView end;
  ASSERT_TRUE(WaitUntil(
      [&] {
        end = Status(coord, job);
        return end.state == "FAILED";
      },
      60s))
      << end.raw << coord.Log();
  EXPECT_NE(end.message.find("rank 1"), std::string::npos) << end.raw;
  // Still serving: another call answers.
  Result list = Dgca(coord, {"list"});
  EXPECT_EQ(list.code, 0) << list.out << list.err << coord.Log();
  for (pid_t p : v.pids) {
    if (ProcessAlive(p)) kill(p, SIGKILL);
  }
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
