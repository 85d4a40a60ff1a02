// A coordinator that stops answering while a job trains (issue 28: an outage
// longer than the 30 s heartbeat timeout used to fail the job, its ranks
// exiting 3 "unreachable" and the restart counted against max_restarts).
// Real programs on loopback; the outage is a SIGSTOP of the coordinator
// process (its embedded agent freezes with it), which looks to the ranks
// exactly like a coordinator host that stopped answering:
//  - an outage past both the ranks' old 30 s limit and the coordinator's own
//    --heartbeat-timeout: the ranks train through it, and on SIGCONT the
//    coordinator excuses the silence (it was its own), the job goes on with
//    no restart and its progress catches up with the ranks;
//  - an outage past --rank-outage-limit (3 s here): the ranks stop with exit
//    code 3 (held by the frozen agent until it runs again) and
//    the job resumes from its checkpoint without counting a failure
//    (max_restarts 0) and succeeds.
#include <gtest/gtest.h>
#include <signal.h>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

std::string WriteSpec(const std::string& dir, const std::string& name, int steps) {
  std::string path = dir + "/" + name + ".yaml";
  WriteFile(path,
            "name: " + name + "\n"
            "model: {preset: tiny}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: " + std::to_string(steps) + ", global_batch: 8, eval_every: 0,\n"
            "        checkpoint_every: 20, max_restarts: 0, optimizer: {lr: 1.0e-3}}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n"
            "tuning: {mode: off}\n");
  return path;
}

int64_t Restarts(const CoordinatorProcess& coord, const std::string& job) {
  auto j = Json(Dgca(coord, {"status", "--json", job}, 20s).out);
  if (!j.ok() || j->Find("job") == nullptr) return -1;
  return JsonInt(j->Find("job")->Find("restarts"));  // omitted when 0
}

std::string RankLog(const CoordinatorProcess& coord, const std::string& job, int rank) {
  return Dgca(coord, {"logs", job, "--rank", std::to_string(rank)}, 20s).out;
}

TEST(CoordinatorOutageTest, ALongOutageIsRiddenOutWithoutARestart) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("outage-long");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  // A 4 s stall timeout: without the excuse of its own pause, the
  // coordinator would fail the ranks the moment it runs again.
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--heartbeat-timeout", "4"}));
  Result sub = Dgca(coord, {"submit", WriteSpec(dir, "ride-out", 1000000)});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  JobView before = WaitForJob(
      coord, job, [](const JobView& v) { return v.state == "RUNNING" && v.pids.size() == 2 && v.step >= 5; },
      60s);
  ASSERT_EQ(before.pids.size(), 2u) << before.raw;

  // 35 s: past the ranks' former fixed limit (30 s) and the stall timeout.
  ASSERT_EQ(kill(coord.pid(), SIGSTOP), 0);
  std::this_thread::sleep_for(35s);
  const bool ranks_alive = ProcessAlive(before.pids[0]) && ProcessAlive(before.pids[1]);
  ASSERT_EQ(kill(coord.pid(), SIGCONT), 0);
  EXPECT_TRUE(ranks_alive) << "a rank ended during the outage";

  // The ranks trained meanwhile: the job's step catches up past where it was
  // plus what 35 s of training adds, with no restart and the same ranks.
  JobView after = WaitForJob(
      coord, job,
      [&](const JobView& v) {
        return v.state == "RUNNING" && v.step > before.step + 20 &&
               RankLog(coord, job, 0).find("coordinator back after") != std::string::npos;
      },
      30s);
  EXPECT_EQ(after.state, "RUNNING") << after.raw;
  EXPECT_EQ(after.pids, before.pids) << after.raw;  // the same processes: no restart
  EXPECT_EQ(Restarts(coord, job), 0) << after.raw;
  EXPECT_EQ(after.raw.find("made no progress"), std::string::npos) << after.raw;
  const std::string log = RankLog(coord, job, 0);
  EXPECT_NE(log.find("coordinator unreachable ("), std::string::npos) << log;
  EXPECT_NE(log.find("training on, for up to 600 s"), std::string::npos) << log;
  EXPECT_NE(coord.Log().find("the coordinator did not run for "), std::string::npos)
      << coord.Log();

  Result cancel = Dgca(coord, {"cancel", job});
  EXPECT_EQ(cancel.code, 0) << cancel.out << cancel.err;
  WaitForJob(coord, job, [](const JobView& v) { return v.state == "CANCELLED"; }, 60s);
  coord.Stop();
  KillJobLeftovers(before.pids, job);
}

TEST(CoordinatorOutageTest, RanksPastTheOutageLimitResumeWithoutCountingAFailure) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("outage-limit");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--rank-outage-limit", "3"}));
  Result sub = Dgca(coord, {"submit", WriteSpec(dir, "resume", 400)});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  JobView before = WaitForJob(
      coord, job,
      [](const JobView& v) { return v.state == "RUNNING" && v.pids.size() == 2 && v.step >= 25; },
      60s);
  ASSERT_LT(before.step, 300) << "the job is too short for this machine\n" << before.raw;

  // A heartbeat times out after 5 s: the first that fails finds the ranks
  // past their 3 s limit; each stops at its next step and exits 3 once its
  // queued metrics have had their 5 s to go out (to nobody).
  ASSERT_EQ(kill(coord.pid(), SIGSTOP), 0);
  const bool stopped = WaitUntil(
      [&] { return !ProcessAlive(before.pids[0]) && !ProcessAlive(before.pids[1]); }, 40s);
  ASSERT_EQ(kill(coord.pid(), SIGCONT), 0);
  EXPECT_TRUE(stopped) << "the ranks did not stop past their outage limit";

  JobView end = WaitForJob(
      coord, job, [](const JobView& v) { return v.state != "RUNNING"; }, 180s);
  EXPECT_EQ(end.state, "SUCCEEDED") << end.raw << coord.Log();
  EXPECT_NE(end.raw.find("after losing the coordinator for longer than its outage limit "
                         "(dgca-coordinator --rank-outage-limit, 3 s)"),
            std::string::npos)
      << end.raw;
  EXPECT_NE(end.raw.find("resumes from the last checkpoint, not counted as a failure (restarts 0 "
                         "of 0)"),
            std::string::npos)
      << end.raw;
  EXPECT_EQ(Restarts(coord, job), 0) << end.raw;
  const std::string log = RankLog(coord, job, 1);
  EXPECT_NE(log.find("its outage limit"), std::string::npos) << log;
  EXPECT_NE(log.find("resuming from"), std::string::npos) << log;
  coord.Stop();
  KillJobLeftovers(before.pids, job);
}

}  // namespace
}  // namespace itest
}  // namespace dgca
