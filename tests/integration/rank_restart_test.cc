// A rank killed with SIGKILL mid-run: the job restarts from its last
// checkpoint (max_restarts: 1), every rank resumes, and it still SUCCEEDS
// (docs/operations.md). Checkpoints are pruned to train.keep_checkpoints
// meanwhile, and the restart still finds its resume point. Real programs on
// loopback.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

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
            "        keep_checkpoints: 2, max_restarts: 1, optimizer: {lr: 1.0e-3}}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n");
  Result sub = Dgca(coord, {"submit", spec});
  ASSERT_EQ(sub.code, 0) << sub.err;
  std::string job = Trim(sub.out);
  const std::string ckpt = dir + "/state/jobs/" + job + "/checkpoints";
  JobView v;
  // Past step 30: the checkpoints of steps 10, 20 and 30 are written, so
  // the one of step 10 is pruned before the kill.
  ASSERT_TRUE(WaitRunning(coord, job, 2, 35, 60s, &v)) << v.raw << coord.Log();
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
  // Rank 0 pruned (before the kill too: step-00000010 went at step 30),
  // and the restart resumed from a checkpoint pruning had left: the rank
  // logs "resumed from" only after loading it.
  Result logs0 = Dgca(coord, {"logs", job, "--rank", "0"});
  EXPECT_NE(logs0.out.find("pruned 1 checkpoint (step-00000010)"), std::string::npos) << logs0.out;
  const size_t from = logs0.out.find("resumed from ");
  ASSERT_NE(from, std::string::npos) << logs0.out;
  const size_t at = logs0.out.find("/checkpoints/step-", from);
  ASSERT_NE(at, std::string::npos) << logs0.out;
  const int64_t resumed = std::atoll(logs0.out.substr(at + 18, 8).c_str());
  EXPECT_GE(resumed, 30) << logs0.out;
  EXPECT_EQ(resumed % 10, 0) << logs0.out;
  // After the job: keep_checkpoints (2) step directories, the newest (no
  // eval but the final one, whose checkpoint is the newest: no extra best).
  std::set<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0) left.insert(n);
  }
  EXPECT_EQ(left, (std::set<std::string>{"step-00000140", "step-00000150"}));
  EXPECT_EQ(ReadFile(ckpt + "/latest"), "step-00000150\n");
  EXPECT_TRUE(Exists(ckpt + "/step-00000150/eval.json"));
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
