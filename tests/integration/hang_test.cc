// Hang diagnosis (docs/operations.md, "Hangs"): ranks report their phase in
// their heartbeats, `dgca status` shows it, and a rank stuck past
// train.progress_timeout_s fails the attempt with a message naming it and
// what the other rank does, long before Gloo's 60 s collective timeout.
// Real coordinator (with its embedded agent) and two real CPU rank
// processes on loopback:
//   - a rank frozen with SIGSTOP (it sends no heartbeat either): named as
//     silent with its last phase, the other rank waiting in an all-reduce;
//   - a rank whose data does not come (DGCA_TEST_DATA_STALL, the test-only
//     loader hook): named as waiting for data, the other in the all-reduce;
//   - a rank hung mid-step: its training thread (the process's main thread)
//     held in a ptrace stop while its heartbeat thread runs on, as a thread
//     stuck in a kernel or a library would be: named with the compute phase
//     it is in, the other in the all-reduce.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>

#include <regex>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

constexpr int kProgressTimeoutS = 10;

std::string WriteHangSpec(const std::string& dir, const std::string& name,
                          int progress_timeout_s = kProgressTimeoutS, int comm_timeout_s = 60) {
  const std::string path = dir + "/" + name + ".yaml";
  WriteFile(path,
            "name: " + name + "\n"
            "model: {preset: tiny}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: 5000, global_batch: 8, eval_every: 0, checkpoint_every: 0,\n"
            "        progress_timeout_s: " + std::to_string(progress_timeout_s) + ",\n"
            "        optimizer: {lr: 1.0e-3}}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n"
            "comm: {backend: gloo, timeout_s: " + std::to_string(comm_timeout_s) + ", bucket_mb: 1}\n"
            "tuning: {mode: off}\n");
  return path;
}

// The PHASE cell of rank `rank` in `dgca status` text ("" when not found):
// the ranks table's columns are RANK NODE PID STATE STEP PHASE ..., the
// phase being a label and "N.N s" (several words).
std::string PhaseCell(const std::string& status, int rank) {
  std::regex row("\\n" + std::to_string(rank) +
                 R"( +\S+ +\d+ +\S+ +\d+ +([a-z/ -]+(?: \d+/\d+)? [0-9.m]+ s|-))");
  std::smatch m;
  return std::regex_search(status, m, row) ? m[1].str() : "";
}

// The ranks table of `dgca status` text (for the test's output).
std::string RanksTable(const std::string& status) {
  const size_t from = status.find("RANK ");
  if (from == std::string::npos) return status;
  return status.substr(from, status.find("\n\n", from) - from);
}

void KillAll(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    if (ProcessAlive(p)) {
      kill(p, SIGCONT);
      kill(p, SIGKILL);
    }
  }
}

class HangTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
    if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
    dir_ = MakeTempDir("hang");
    mkdir((dir_ + "/state").c_str(), 0755);
  }
  std::string dir_;
};

TEST_F(HangTest, AFrozenRankIsNamedWithItsLastPhaseAndTheOtherWaitsInTheAllReduce) {
  CoordinatorProcess coord(dir_ + "/state");
  ASSERT_TRUE(coord.Start());
  Result sub = Dgca(coord, {"submit", WriteHangSpec(dir_, "frozen")});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitRunning(coord, job, 2, 5, 120s, &v)) << v.raw << coord.Log();

  // While it runs, `dgca status` shows what each rank is doing (from the
  // heartbeats, every 2 s: the first may come after step 5).
  const std::regex busy(R"((data|forward|backward|all-reduce \d+/\d+|optimizer) [0-9.]+ s)");
  std::string status;
  const bool shown = WaitUntil(
      [&] {
        status = Dgca(coord, {"status", job}).out;
        return std::regex_match(PhaseCell(status, 0), busy) &&
               std::regex_match(PhaseCell(status, 1), busy);
      },
      20s);
  EXPECT_TRUE(shown) << status;
  EXPECT_NE(status.find(" PHASE "), std::string::npos) << status;
  std::printf("status while it runs:\n%s\n", RanksTable(status).c_str());

  const auto stopped = Clock::now();
  ASSERT_EQ(kill(v.pids[1], SIGSTOP), 0);
  JobView end;
  const bool failed = WaitUntil(
      [&] {
        end = Status(coord, job);
        return end.state == "FAILED";
      },
      50s);
  const double took = std::chrono::duration<double>(Clock::now() - stopped).count();
  KillAll(v.pids);
  ASSERT_TRUE(failed) << end.raw << coord.Log();
  std::printf("frozen rank: FAILED %.1f s after SIGSTOP: %s\n", took, end.message.c_str());
  // Before Gloo's collective timeout (60 s) and the heartbeat timeout (30 s).
  EXPECT_LT(took, 28) << end.message;
  EXPECT_GE(took, kProgressTimeoutS - 3) << end.message;
  // Its last news: the phase of its last heartbeat, or a step it finished
  // after that heartbeat (steps stream every step, heartbeats every 2 s).
  const std::regex want(
      R"(^rank 1 \(node [^)]+\) stuck: no heartbeat for [0-9.]+ s, (last in (data|forward|backward|optimizer|all-reduce \d+/\d+)[^;]*\(no progress for [0-9.]+ s\)|last heard of when it finished step \d+ \(no progress for [0-9.]+ s; its last heartbeat said it was [^;]*\)); rank 0 \(node [^)]+\) waiting .*all-reduce.* \(no progress within train\.progress_timeout_s, 10 s\)$)");
  EXPECT_TRUE(std::regex_match(end.message, want)) << end.message;
  EXPECT_EQ(end.message.find("gloo"), std::string::npos) << end.message;
  // `dgca status` says it too.
  Result after = Dgca(coord, {"status", job});
  EXPECT_NE(after.out.find(end.message), std::string::npos) << after.out;
  coord.Stop();
}

TEST_F(HangTest, ARankWaitingForDataIsNamedAndTheOtherWaitsInTheAllReduce) {
  // Rank 1's data of step 6 comes 90 s late (the ranks inherit the
  // coordinator's environment through its embedded agent).
  setenv("DGCA_TEST_DATA_STALL", "1:6:90", 1);
  CoordinatorProcess coord(dir_ + "/state");
  const bool started = coord.Start();
  unsetenv("DGCA_TEST_DATA_STALL");
  ASSERT_TRUE(started);
  Result sub = Dgca(coord, {"submit", WriteHangSpec(dir_, "stall")});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitRunning(coord, job, 2, 0, 120s, &v)) << v.raw << coord.Log();

  // The stall as `dgca status` shows it while it lasts: rank 1 in "data"
  // for seconds, rank 0 in an all-reduce of the same step.
  std::string status, cell1, cell0;
  const bool seen = WaitUntil(
      [&] {
        Result st = Dgca(coord, {"status", job});
        status = st.out;
        cell1 = PhaseCell(status, 1);
        cell0 = PhaseCell(status, 0);
        std::smatch m;
        return std::regex_match(cell1, m, std::regex(R"(data ([0-9.]+) s)")) &&
               std::stod(m[1].str()) >= 3 && cell0.rfind("all-reduce ", 0) == 0;
      },
      60s);
  EXPECT_TRUE(seen) << "rank 0 '" << cell0 << "', rank 1 '" << cell1 << "' in\n" << status;
  std::printf("status during the stall:\n%s\n", RanksTable(status).c_str());

  JobView end;
  const bool failed = WaitUntil(
      [&] {
        end = Status(coord, job);
        return end.state == "FAILED";
      },
      50s);
  KillAll(v.pids);
  ASSERT_TRUE(failed) << end.raw << coord.Log();
  std::printf("data stall: %s\n", end.message.c_str());
  const std::regex want(
      R"(^rank 1 \(node [^)]+\) stuck ([0-9.]+) s waiting for data \(loader\) in step 6; rank 0 \(node [^)]+\) waiting [0-9.]+ s in all-reduce \d+/\d+ of step 6 \([0-9.]+ [KMG]?B\) \(no progress within train\.progress_timeout_s, 10 s\)$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(end.message, m, want)) << end.message;
  // Named at the timeout, not at Gloo's (60 s) nor at the stall's end (90 s).
  EXPECT_GE(std::stod(m[1].str()), kProgressTimeoutS);
  EXPECT_LT(std::stod(m[1].str()), 30);
  Result logs = Dgca(coord, {"logs", job, "--rank", "1"});
  EXPECT_NE(logs.out.find("DGCA_TEST_DATA_STALL: holding the data of step 6"), std::string::npos)
      << logs.out;
  coord.Stop();
}

// With the progress timeout off (as, in effect, with the default 300 s
// against the collective's 60 s), Gloo's timeout ends the waiting rank
// first: its failure still names the rank it waited for.
TEST_F(HangTest, TheCollectiveTimeoutsFailureNamesTheStuckRank) {
  setenv("DGCA_TEST_DATA_STALL", "1:6:90", 1);
  CoordinatorProcess coord(dir_ + "/state");
  const bool started = coord.Start();
  unsetenv("DGCA_TEST_DATA_STALL");
  ASSERT_TRUE(started);
  Result sub = Dgca(coord, {"submit", WriteHangSpec(dir_, "gloo-timeout", 0, 15)});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitRunning(coord, job, 2, 0, 120s, &v)) << v.raw << coord.Log();
  JobView end;
  const bool failed = WaitUntil(
      [&] {
        end = Status(coord, job);
        return end.state == "FAILED";
      },
      80s);
  KillAll(v.pids);
  ASSERT_TRUE(failed) << end.raw << coord.Log();
  std::printf("collective timeout: %s\n", end.message.c_str());
  const std::regex want(
      R"(^rank 0 on node \S+ exited with code 1; meanwhile rank 1 \(node [^)]+\) stuck ([0-9.]+) s waiting for data \(loader\) in step 6; last output:\n(.|\n)*)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(end.message, m, want)) << end.message;
  EXPECT_GE(std::stod(m[1].str()), 14);
  coord.Stop();
}

// Holds thread `tid` (of another process) in a ptrace stop: that thread
// alone stops, the process's other threads run on. "" when it is stopped,
// else why not (ptrace refused: no CAP_SYS_PTRACE and Yama's
// ptrace_scope, typically).
std::string HoldThread(pid_t tid) {
  if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
    return std::string("PTRACE_SEIZE: ") + std::strerror(errno);
  }
  if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) {
    const std::string why = std::string("PTRACE_INTERRUPT: ") + std::strerror(errno);
    ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
    return why;
  }
  int st = 0;
  if (waitpid(tid, &st, __WALL) != tid || !WIFSTOPPED(st)) return "the thread did not stop";
  return "";
}
// Lets it go (from its ptrace stop).
void ReleaseThread(pid_t tid) { ptrace(PTRACE_DETACH, tid, nullptr, nullptr); }

TEST_F(HangTest, ARankHungInItsComputeIsNamedWithThePhaseAndTheOtherWaits) {
  CoordinatorProcess coord(dir_ + "/state");
  ASSERT_TRUE(coord.Start());
  Result sub = Dgca(coord, {"submit", WriteHangSpec(dir_, "compute")});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitRunning(coord, job, 2, 5, 120s, &v)) << v.raw << coord.Log();
  const pid_t rank1 = v.pids[1];  // its main thread trains; heartbeats have their own

  // Held at a random point of its step; kept when its heartbeat says the
  // point is compute (forward, backward, optimizer), else let go and held
  // again a moment later (an all-reduce wait would blame the collective).
  const std::regex compute(R"((forward|backward|optimizer) ([0-9.]+) s)");
  std::string cell, status;
  bool held = false;
  for (int attempt = 0; attempt < 12 && !held; ++attempt) {
    const std::string why = HoldThread(rank1);
    if (!why.empty()) {
      KillAll(v.pids);
      GTEST_SKIP() << "cannot hold one thread of rank 1 (pid " << rank1 << "): " << why;
    }
    // The next heartbeats (every 2 s) say where it is held and for how long.
    WaitUntil(
        [&] {
          status = Dgca(coord, {"status", job}).out;
          cell = PhaseCell(status, 1);
          std::smatch m;
          return std::regex_match(cell, m, std::regex(R"(.* ([0-9.]+) s)")) &&
                 std::stod(m[1].str()) >= 2.5;
        },
        8s);
    held = std::regex_match(cell, compute);
    if (!held) {
      ReleaseThread(rank1);
      std::this_thread::sleep_for(std::chrono::milliseconds(137 * (attempt + 1)));
    }
  }
  if (!held) ReleaseThread(rank1);
  ASSERT_TRUE(held) << "never held in compute; last phase '" << cell << "' in\n" << status;
  std::printf("status while rank 1 is held:\n%s\n", RanksTable(status).c_str());

  JobView end;
  const bool failed = WaitUntil(
      [&] {
        end = Status(coord, job);
        return end.state == "FAILED";
      },
      50s);
  ReleaseThread(rank1);
  KillAll(v.pids);
  ASSERT_TRUE(failed) << end.raw << coord.Log();
  std::printf("compute hang: %s\n", end.message.c_str());
  // Its heartbeat thread ran on: named by its phase, not as silent.
  const std::regex want(
      R"(^rank 1 \(node [^)]+\) stuck ([0-9.]+) s in (forward|backward|optimizer) of step \d+; rank 0 \(node [^)]+\) waiting [0-9.]+ s in all-reduce \d+/\d+ of step \d+ \([0-9.]+ [KMG]?B\) \(no progress within train\.progress_timeout_s, 10 s\)$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(end.message, m, want)) << end.message;
  EXPECT_GE(std::stod(m[1].str()), kProgressTimeoutS);
  EXPECT_LT(std::stod(m[1].str()), 30);
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
