// kill -9 of the coordinator while a job runs, then a restart on the same
// state dir and address: no job is lost or listed twice, and the running
// job's ranks, which trained on meanwhile, are re-adopted (docs/operations.md,
// "When the coordinator dies"; coordinator/recovery.h). Real programs on loopback:
//  - the embedded agent died with the coordinator; the new one adopts the
//    ranks from the store and their exit records, and `dgca watch`, started
//    before the crash, follows the job to SUCCEEDED without a restart;
//  - a rank killed while the coordinator is down is found gone, and the job
//    restarts from its checkpoint and succeeds;
//  - a separate `dgca-worker agent` keeps its ranks, reconnects and
//    re-registers them;
//  - SIGTERM with --on-shutdown keep-jobs leaves the job to the next
//    coordinator the same way, and SIGTERM by default ends it.
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

// A job of `steps` tiny steps on 2 CPU ranks that checkpoints every 50 and
// may restart once.
std::string WriteLongSpec(const std::string& dir, const std::string& name, int steps) {
  std::string path = dir + "/" + name + ".yaml";
  WriteFile(path,
            "name: " + name + "\n"
            "model: {preset: tiny}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  eval: " + SharedData() + "/ecspell/test_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: " + std::to_string(steps) + ", global_batch: 8, eval_every: 0,\n"
            "        checkpoint_every: 50, max_restarts: 1, optimizer: {lr: 1.0e-3}}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n"
            "tuning: {mode: off}\n");
  return path;
}

// Waits for the job to run both ranks past `min_step`.
JobView WaitRunning(const CoordinatorProcess& coord, const std::string& job, int64_t min_step) {
  JobView v;
  bool ok = WaitUntil(
      [&] {
        v = Status(coord, job);
        return v.state == "RUNNING" && v.pids.size() == 2 && v.step >= min_step;
      },
      60s);
  EXPECT_TRUE(ok) << v.raw << coord.Log();
  return v;
}

constexpr int kSteps = 600;  // long enough to outlast a restart here

// Submits a kSteps job (WriteLongSpec) and waits for both its ranks past
// `min_step` but short of half the job. False (with the failure recorded)
// otherwise.
bool SubmitLongJob(const CoordinatorProcess& coord, const std::string& dir, const std::string& name,
                   int64_t min_step, std::string* id, JobView* before) {
  Result sub = Dgca(coord, {"submit", WriteLongSpec(dir, name, kSteps)});
  if (sub.code != 0) {
    ADD_FAILURE() << "submit " << name << ": exit " << sub.code << "\n" << sub.err;
    return false;
  }
  *id = Trim(sub.out);
  *before = WaitRunning(coord, *id, min_step);
  if (before->state != "RUNNING" || before->step >= kSteps / 2) {
    ADD_FAILURE() << "job " << *id << " is not running short of half its steps (the job is too "
                  << "short for this machine?)\n" << before->raw;
    return false;
  }
  return true;
}

// Waits (up to 120 s) for the job to leave RUNNING; its last view. On a
// timeout the failure shows the coordinator's log and `more`.
JobView WaitEnded(const CoordinatorProcess& coord, const std::string& job,
                  const std::string& more = "") {
  JobView v;
  bool ended = WaitUntil(
      [&] {
        v = Status(coord, job);
        return v.ok && v.state != "RUNNING";
      },
      120s);
  EXPECT_TRUE(ended) << v.raw << coord.Log() << more;
  return v;
}

bool HasEvent(const JobView& v, const std::string& text) {
  return v.raw.find(text) != std::string::npos;
}

// --restart-node-wait (how long a restart waits for a node of its plan;
// the wait itself: server_test's ARestart* tests) is listed and checked.
TEST(CoordinatorRestartTest, RestartNodeWaitFlagIsCheckedAtStart) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  Result help = Exec({CoordinatorBin(), "--help"}, 20s);
  EXPECT_EQ(help.code, 0) << help.err;
  EXPECT_NE(help.out.find("--restart-node-wait"), std::string::npos) << help.out;
  Result bad = Exec({CoordinatorBin(), "--restart-node-wait", "-1", "--state-dir",
                     MakeTempDir("restart-wait")},
                    20s);
  EXPECT_EQ(bad.code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("--restart-node-wait"), std::string::npos) << bad.err;
}

TEST(CoordinatorRestartTest, Kill9ThenRestartReadoptsRunningRanks) {
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
  std::string run_id;
  JobView before;
  ASSERT_TRUE(SubmitLongJob(coord, dir, "running", 30, &run_id, &before));
  // `dgca watch` from before the crash to the end.
  pid_t watch = SpawnLogged({CliBin(), "--coordinator", coord.address(), "--token-file",
                             coord.token_file(), "watch", run_id},
                            dir + "/watch.log");
  std::string address = coord.address();

  coord.Kill9();
  std::this_thread::sleep_for(300ms);  // the ranks train on, unheard
  for (pid_t p : before.pids) EXPECT_TRUE(ProcessAlive(p)) << "rank " << p << " died with it";
  ASSERT_TRUE(coord.Start(address));

  // Listed exactly once each; the finished one untouched.
  Result list = Dgca(coord, {"list", "--json"});
  ASSERT_EQ(list.code, 0) << list.err << coord.Log();
  EXPECT_EQ(CountOccurrences(list.out, "\"id\": \"" + run_id + "\""), 1) << list.out;
  EXPECT_EQ(CountOccurrences(list.out, "\"id\": \"" + done_id + "\""), 1) << list.out;
  EXPECT_EQ(Status(coord, done_id).state, "SUCCEEDED");

  // Re-adopted: still RUNNING with the same rank processes, which are heard
  // from again and go on from where they were (or, on a machine fast enough
  // to finish the job during the outage, it succeeded from their exit
  // records: the checks below hold either way).
  JobView after;
  ASSERT_TRUE(WaitUntil(
      [&] {
        after = Status(coord, run_id);
        return (after.state == "RUNNING" && after.rank_states.size() == 2 &&
                after.rank_states[0] == "running" && after.rank_states[1] == "running" &&
                after.step > before.step) ||
               after.state == "SUCCEEDED";
      },
      30s))
      << after.raw << coord.Log();
  EXPECT_EQ(after.pids, before.pids) << after.raw;
  EXPECT_TRUE(HasEvent(after, "coordinator restarted; re-adopting attempt 0")) << after.raw;

  // ... to the end, with no restart; the rank exits come from their exit
  // records, through the agent that adopted them.
  JobView end = WaitEnded(coord, run_id);
  EXPECT_EQ(end.state, "SUCCEEDED") << end.raw << coord.Log();
  EXPECT_EQ(end.message, "all 2 ranks exited 0");
  EXPECT_EQ(end.step, kSteps);
  EXPECT_FALSE(HasEvent(end, "restart 1 of")) << end.raw;
  const std::string log0 = ReadFile(coord.state_dir() + "/jobs/" + run_id + "/rank-0.log");
  if (after.state == "RUNNING") {
    EXPECT_NE(log0.find("adopted rank 0 (pid " + std::to_string(before.pids[0])),
              std::string::npos)
        << log0;
  }
  EXPECT_NE(log0.find("exited with code 0 (adopted; from its exit record)"), std::string::npos)
      << log0;

  // The watch rode through the restart and saw the job succeed.
  int status = -1;
  ASSERT_TRUE(WaitUntil([&] { return waitpid(watch, &status, WNOHANG) == watch; }, 30s));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(dir + "/watch.log");
  EXPECT_NE(ReadFile(dir + "/watch.log").find("SUCCEEDED"), std::string::npos)
      << ReadFile(dir + "/watch.log");

  coord.Stop();
  KillJobLeftovers(before.pids, run_id);
}

// SIGTERM (systemctl stop/restart) with --on-shutdown keep-jobs: a clean
// shutdown that leaves the job RUNNING and its ranks training, and the next
// coordinator re-adopts them as after kill -9.
TEST(CoordinatorRestartTest, SigtermWithKeepJobsLeavesTheJobForTheNextCoordinator) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("restart-keep");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--on-shutdown", "keep-jobs"}));
  std::string job;
  JobView before;
  ASSERT_TRUE(SubmitLongJob(coord, dir, "kept", 30, &job, &before));
  std::string address = coord.address();

  const int status = coord.Stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << coord.Log();
  EXPECT_NE(coord.Log().find("detached from 2 rank(s), which keep running"), std::string::npos)
      << coord.Log();
  for (pid_t p : before.pids) EXPECT_TRUE(ProcessAlive(p)) << "rank " << p << " was stopped";
  ASSERT_TRUE(coord.Start(address));  // default --on-shutdown from here on

  JobView end = WaitEnded(coord, job);
  EXPECT_EQ(end.state, "SUCCEEDED") << end.raw << coord.Log();
  EXPECT_EQ(end.message, "all 2 ranks exited 0");
  EXPECT_EQ(end.step, kSteps);
  EXPECT_TRUE(HasEvent(end, "coordinator shutting down, keeping the job")) << end.raw;
  EXPECT_TRUE(HasEvent(end, "coordinator restarted; re-adopting attempt 0 (rank@node:pid 0@"))
      << end.raw;
  EXPECT_FALSE(HasEvent(end, "restart 1 of")) << end.raw;
  EXPECT_FALSE(HasEvent(end, "coordinator shut down")) << end.raw;
  coord.Stop();
  KillJobLeftovers(before.pids, job);
}

// The default (--on-shutdown stop-jobs, a coordinator run in a terminal):
// SIGTERM stops the ranks before the coordinator exits and the job is
// FAILED for good, also for the next coordinator.
TEST(CoordinatorRestartTest, SigtermByDefaultStopsRanksAndFailsTheJob) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("restart-stop");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start());
  std::string job;
  JobView before;
  ASSERT_TRUE(SubmitLongJob(coord, dir, "ended", 30, &job, &before));

  const int status = coord.Stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << coord.Log();
  for (pid_t p : before.pids) EXPECT_FALSE(ProcessAlive(p)) << "rank " << p << " outlived it";
  ASSERT_TRUE(coord.Start());
  JobView after = Status(coord, job);
  EXPECT_EQ(after.state, "FAILED") << after.raw;
  EXPECT_EQ(after.message, "coordinator shut down") << after.raw;
  EXPECT_LT(after.step, kSteps) << after.raw;
  // Its ranks were stopped with it: none is shown running (they were, with
  // a heartbeat age of 0, before the job ended marked them).
  ASSERT_FALSE(after.rank_states.empty()) << after.raw;
  for (const std::string& s : after.rank_states) EXPECT_NE(s, "running") << after.raw;
  EXPECT_FALSE(HasEvent(after, "re-adopting")) << after.raw;
  coord.Stop();
  KillJobLeftovers(before.pids, job);
}

TEST(CoordinatorRestartTest, RankKilledWhileCoordinatorIsDownRestartsFromCheckpoint) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("restart-dead-rank");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start());
  std::string job;
  JobView before;
  ASSERT_TRUE(SubmitLongJob(coord, dir, "victim", 60, &job, &before));  // past the first checkpoint
  std::string address = coord.address();

  coord.Kill9();
  ASSERT_EQ(kill(before.pids[1], SIGKILL), 0);  // no exit record, nobody to wait for it
  ASSERT_TRUE(coord.Start(address));

  JobView end = WaitEnded(coord, job);
  EXPECT_EQ(end.state, "SUCCEEDED") << end.raw << coord.Log();
  // The dead rank is named for what is known of it (the headline, or under
  // "other ranks" when rank 0's exit, which it caused, came first).
  const std::string unknown =
      " (adopted after a restart of its agent or the coordinator) ended without an exit status "
      "(killed by a signal "
      "or crashed)";
  const size_t at = end.raw.find(unknown);
  ASSERT_NE(at, std::string::npos) << end.raw;
  EXPECT_NE(end.raw.substr(at > 64 ? at - 64 : 0, 64).find("rank 1 on node "), std::string::npos)
      << end.raw.substr(at > 64 ? at - 64 : 0, 200);
  EXPECT_TRUE(HasEvent(end, "restart 1 of 1 (attempt 1)")) << end.raw;
  Result logs = Dgca(coord, {"logs", job, "--rank", "1"});
  EXPECT_NE(logs.out.find("resuming from"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("step " + std::to_string(kSteps) + "/" + std::to_string(kSteps)),
            std::string::npos)
      << logs.out;
  coord.Stop();
  KillJobLeftovers(before.pids, job);
}

TEST(CoordinatorRestartTest, ExternalAgentKeepsItsRanksThroughARestart) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("restart-agent");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--no-local-agent"}));
  AgentProcess agent;
  ASSERT_TRUE(agent.Start(coord, "n1", dir + "/agent"));
  std::string job;
  JobView before;
  ASSERT_TRUE(SubmitLongJob(coord, dir, "remote", 30, &job, &before));
  std::string address = coord.address();

  coord.Kill9();
  ASSERT_TRUE(coord.Start(address, {"--no-local-agent"}));
  JobView end = WaitEnded(coord, job, agent.Log());
  EXPECT_EQ(end.state, "SUCCEEDED") << end.raw << agent.Log();
  EXPECT_FALSE(HasEvent(end, "restart 1 of")) << end.raw;
  EXPECT_TRUE(HasEvent(end, "coordinator restarted; re-adopting attempt 0 (rank@node:pid 0@n1:" +
                                std::to_string(before.pids[0])))
      << end.raw;
  const std::string agent_log = agent.Log();
  EXPECT_EQ(CountOccurrences(agent_log, "agent n1: connected to"), 2) << agent_log;
  agent.Stop();
  coord.Stop();
  KillJobLeftovers(before.pids, job);
}

}  // namespace
}  // namespace itest
}  // namespace dgca
