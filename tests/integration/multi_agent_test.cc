// Two `dgca-worker agent` processes (as on two nodes) and a coordinator
// without its embedded agent: nodes register, a 2-rank job runs on them and
// succeeds; stopping an agent with SIGTERM stops its ranks; `dgca nodes
// forget` then drops a node that is gone. A node made slow (its CPU shared
// with a busy loop) is named by `dgca diagnose JOB` as the straggler.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

// Pins the calling thread to one CPU; processes it forks inherit that.
bool PinSelfToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

// A busy loop pinned to one CPU, in a child process killed when this goes
// out of scope; pid <= 0 when it could not be forked.
struct BusyLoop {
  explicit BusyLoop(int cpu) : pid(fork()) {
    if (pid == 0) {
      PinSelfToCpu(cpu);
      for (volatile uint64_t i = 0;; i = i + 1) {
      }
    }
  }
  ~BusyLoop() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  BusyLoop(const BusyLoop&) = delete;
  BusyLoop& operator=(const BusyLoop&) = delete;
  const pid_t pid;
};

// Two nodes: a coordinator without its embedded agent (state in DIR/state)
// and agents node-a and node-b (state in DIR/a and DIR/b), DIR a fresh
// temporary directory. Everything is stopped when it goes out of scope.
struct TwoNodes {
  explicit TwoNodes(const std::string& name)
      : dir(MakeTempDir(name)), coord((mkdir((dir + "/state").c_str(), 0755), dir + "/state")) {}

  // Starts the coordinator and both agents and waits up to 20 s for both
  // nodes in `dgca nodes`; with `pin`, node-a's agent (and its ranks) runs
  // on CPU 0 and node-b's on CPU 1. The failure, if any, in *why.
  bool Start(std::string* why, bool pin = false, std::vector<std::string> coord_flags = {}) {
    coord_flags.insert(coord_flags.begin(), "--no-local-agent");
    if (!coord.Start("127.0.0.1:0", coord_flags)) {
      *why = "the coordinator did not start";
      return false;
    }
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (pin && sched_getaffinity(0, sizeof(mine), &mine) != 0) {
      *why = "cannot read this thread's CPU affinity";
      return false;
    }
    const bool ok = (!pin || PinSelfToCpu(0)) && a.Start(coord, "node-a", dir + "/a") &&
              (!pin || PinSelfToCpu(1)) && b.Start(coord, "node-b", dir + "/b");
    if (pin) sched_setaffinity(0, sizeof(mine), &mine);  // this thread gets its CPUs back
    if (!ok) {
      *why = "cannot start the agents or pin them to CPUs 0 and 1";
      return false;
    }
    Result nodes;
    if (!WaitUntil(
            [&] {
              nodes = Dgca(coord, {"nodes", "--json"});
              return nodes.out.find("node-a") != std::string::npos &&
                     nodes.out.find("node-b") != std::string::npos;
            },
            20s)) {
      *why = "both nodes did not register: " + nodes.out + nodes.err + coord.Log();
      return false;
    }
    return true;
  }
  std::string Logs() const { return coord.Log() + "\nagent a:\n" + a.Log() + "\nagent b:\n" + b.Log(); }

  std::string dir;
  CoordinatorProcess coord;  // declared before the agents: they stop first
  AgentProcess a, b;
};

TEST(MultiAgentTest, TwoAgentsRunATwoRankJob) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  TwoNodes nodes("multi");
  std::string why;
  ASSERT_TRUE(nodes.Start(&why)) << why;
  const std::string& dir = nodes.dir;
  CoordinatorProcess& coord = nodes.coord;
  Result table = Dgca(coord, {"nodes"});
  EXPECT_NE(table.out.find("node-a"), std::string::npos) << table.out;

  auto t_sub = Clock::now();
  Result sub = Dgca(coord, {"submit", WriteTinySpec(dir, "two-nodes", 8), "--wait"}, 120s);
  std::fprintf(stderr, "2-rank job over two agents: %.1f s\n",
               std::chrono::duration<double>(Clock::now() - t_sub).count());
  EXPECT_EQ(sub.code, 0) << sub.out << sub.err << nodes.Logs();
  std::string job = sub.out.substr(0, sub.out.find('\n'));
  Result st = Dgca(coord, {"status", "--json", job});
  EXPECT_TRUE(st.out.find("node-a") != std::string::npos ||
              st.out.find("node-b") != std::string::npos)
      << st.out;
  // The rank logs are on the agents' nodes (their state dirs).
  bool log_a = Exists(dir + "/a/jobs/" + job + "/rank-0.log") ||
               Exists(dir + "/a/jobs/" + job + "/rank-1.log");
  bool log_b = Exists(dir + "/b/jobs/" + job + "/rank-0.log") ||
               Exists(dir + "/b/jobs/" + job + "/rank-1.log");
  EXPECT_TRUE(log_a || log_b);

  // A long job, then SIGTERM to both agents: their ranks go with them.
  Result sub2 = Dgca(coord, {"submit", WriteTinySpec(dir, "long", 1000000)});
  ASSERT_EQ(sub2.code, 0) << sub2.err;
  std::string job2 = Trim(sub2.out);
  JobView v;
  ASSERT_TRUE(WaitUntil(
      [&] {
        v = Status(coord, job2);
        return v.state == "RUNNING" && v.pids.size() == 2 && v.step >= 1;
      },
      45s))
      << v.raw;
  auto t_stop = Clock::now();
  nodes.a.Stop();
  nodes.b.Stop();
  std::fprintf(stderr, "agents stopped in %.1f s\n",
               std::chrono::duration<double>(Clock::now() - t_stop).count());
  for (pid_t p : v.pids) {
    EXPECT_FALSE(ProcessAlive(p)) << "rank " << p << " outlived its agent";
    if (ProcessAlive(p)) kill(p, SIGKILL);
  }
  JobView after;
  EXPECT_TRUE(WaitUntil(
      [&] {
        after = Status(coord, job2);
        return after.state == "FAILED" || after.state == "PENDING";
      },
      60s))
      << after.raw;
  std::fprintf(stderr, "job %s after its agents left: %s %s (%.1f s)\n", job2.c_str(),
               after.state.c_str(), after.message.c_str(),
               std::chrono::duration<double>(Clock::now() - t_stop).count());
  Dgca(coord, {"cancel", job2});

  // Both nodes are gone for good: `dgca nodes forget` drops them from the
  // list and their series from /metrics (DgcaAgentDisconnected resolves).
  // The job can end (a rank's exit, reported by the other agent) before the
  // coordinator has seen agent a's stream close: wait for that.
  EXPECT_TRUE(WaitUntil(
      [&] {
        return HttpGet(coord.metrics(), "/metrics").find("dgca_worker_connected{node=\"node-a\"} 0") !=
               std::string::npos;
      },
      15s))
      << HttpGet(coord.metrics(), "/metrics");
  Result unknown = Dgca(coord, {"nodes", "forget", "node-z"});
  EXPECT_EQ(unknown.code, 2) << unknown.out << unknown.err;
  EXPECT_NE(unknown.err.find("no node named 'node-z' has registered (known: node-a, node-b)"),
            std::string::npos)
      << unknown.err;
  Result forget = Dgca(coord, {"nodes", "forget", "node-a"});
  EXPECT_EQ(forget.code, 0) << forget.out << forget.err << coord.Log();
  EXPECT_EQ(forget.out, "node node-a forgotten\n");
  Result left = Dgca(coord, {"nodes", "--json"});
  EXPECT_EQ(left.out.find("node-a"), std::string::npos) << left.out;
  EXPECT_NE(left.out.find("node-b"), std::string::npos) << left.out;
  const std::string metrics = HttpGet(coord.metrics(), "/metrics");
  EXPECT_EQ(metrics.find("dgca_worker_connected{node=\"node-a\"}"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("dgca_worker_heartbeat_age_seconds{node=\"node-a\"}"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("dgca_worker_connected{node=\"node-b\"} 0"), std::string::npos)
      << metrics;
  coord.Stop();
}

// An agent killed with SIGKILL (a crash, a closed terminal) leaves its rank
// training; the agent started again on that node is asked to adopt it and
// reports its end, so the job finishes SUCCEEDED with no restart (it used to
// stall once the rank exited unseen, and fail).
TEST(MultiAgentTest, AnAgentKilledMidJobAdoptsItsRankWhenItComesBack) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  TwoNodes nodes("adopt");
  std::string why;
  ASSERT_TRUE(nodes.Start(&why)) << why;
  CoordinatorProcess& coord = nodes.coord;
  Result sub = Dgca(coord, {"submit", WriteTinySpec(nodes.dir, "adopt", 400)});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitUntil(
      [&] {
        v = Status(coord, job);
        return v.state == "RUNNING" && v.rank_steps.size() == 2 && v.rank_steps[0] >= 2 &&
               v.rank_steps[1] >= 2;
      },
      60s))
      << v.raw;
  nodes.b.Kill9();
  std::this_thread::sleep_for(1s);
  ASSERT_TRUE(nodes.b.Restart());
  JobView end;
  const bool finished = WaitUntil(
      [&] {
        end = Status(coord, job);
        return end.state == "SUCCEEDED" || end.state == "FAILED";
      },
      180s);
  const std::string agent_b = nodes.b.Log();
  ASSERT_TRUE(finished) << end.raw;
  EXPECT_EQ(end.state, "SUCCEEDED") << end.message << "\n" << coord.Log() << agent_b;
  EXPECT_NE(agent_b.find("adopted job " + job), std::string::npos) << agent_b;
  EXPECT_NE(end.raw.find("\"restarts\": 0"), std::string::npos) << end.raw;
}

// The parent pid of `pid`, from /proc (-1 when it cannot be read).
pid_t ParentOf(pid_t pid) {
  const std::string st = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t p = st.rfind(')');
  if (p == std::string::npos) return -1;
  int ppid = -1;
  char state = 0;
  if (std::sscanf(st.c_str() + p + 1, " %c %d", &state, &ppid) != 2) return -1;
  return ppid;
}

// A frozen agent (SIGSTOP) keeps its stream open and says nothing. After the
// heartbeat timeout `dgca nodes` calls it silent; a restart is not sent into
// its unread stream (where it used to wait, stall and use up max_restarts)
// but waits for it; after SIGCONT the job restarts on both nodes, and the
// frozen node's rank of the old attempt does not live on.
TEST(MultiAgentTest, AFrozenAgentIsSilentAndARestartWaitsForIt) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  TwoNodes nodes("frozen");
  std::string why;
  ASSERT_TRUE(nodes.Start(&why, false, {"--agent-timeout", "10"})) << why;
  CoordinatorProcess& coord = nodes.coord;
  TinySpecOptions o;
  o.max_restarts = 1;
  Result sub = Dgca(coord, {"submit", WriteTinySpec(nodes.dir, "frozen", 1000000, o)});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitRunning(coord, job, 2, 2, 60s, &v)) << v.raw;
  pid_t rank_a = -1, rank_b = -1;
  for (pid_t p : v.pids) (ParentOf(p) == nodes.a.pid() ? rank_a : rank_b) = p;
  ASSERT_GT(rank_a, 0) << v.raw;
  ASSERT_GT(rank_b, 0) << v.raw;

  nodes.b.Signal(SIGSTOP);
  Result list;
  EXPECT_TRUE(WaitUntil(
      [&] {
        list = Dgca(coord, {"nodes"});
        return list.out.find("silent") != std::string::npos;
      },
      30s))
      << list.out;
  ASSERT_EQ(kill(rank_a, SIGKILL), 0);
  JobView waiting;
  const bool waited = WaitUntil(
      [&] {
        waiting = Status(coord, job);
        return waiting.message.find("node-b (rank") != std::string::npos &&
               waiting.message.find("is silent") != std::string::npos;
      },
      60s);
  nodes.b.Signal(SIGCONT);
  ASSERT_TRUE(waited) << waiting.raw << "\n" << coord.Log();
  EXPECT_EQ(waiting.state, "PLANNING");

  JobView again;
  EXPECT_TRUE(WaitUntil(
      [&] {
        again = Status(coord, job);
        return again.state == "RUNNING" && again.pids.size() == 2 &&
               again.raw.find("\"restarts\": 1") != std::string::npos &&
               std::find(again.pids.begin(), again.pids.end(), rank_b) == again.pids.end();
      },
      60s))
      << again.raw << "\n" << coord.Log();
  EXPECT_TRUE(WaitUntil([&] { return !ProcessAlive(rank_b); }, 30s))
      << "node-b's rank of attempt 0 lives on";
  Dgca(coord, {"cancel", job});
}

// A real straggler: node-a's agent (and so its rank) has CPU 0 to itself;
// node-b's shares CPU 1 with a busy loop, so its rank computes about half as
// fast. Every step the node-a rank waits for it at the all-reduce. `dgca
// diagnose` must name the straggler and node-b, and must not blame the
// link for node-a's wait.
TEST(MultiAgentTest, DiagnoseNamesASlowNodeAsTheStraggler) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0 || !CPU_ISSET(0, &mine) ||
      !CPU_ISSET(1, &mine)) {
    GTEST_SKIP() << "needs CPUs 0 and 1 to give each node one of its own";
  }
  TwoNodes nodes("straggler");
  std::string why;
  ASSERT_TRUE(nodes.Start(&why, /*pin=*/true)) << why;
  const std::string& dir = nodes.dir;
  CoordinatorProcess& coord = nodes.coord;
  auto hog = std::make_unique<BusyLoop>(1);  // shares node-b's CPU
  ASSERT_GT(hog->pid, 0) << "cannot start the busy loop";
  Result sub = Dgca(coord, {"submit", WriteTinySpec(dir, "slow-node", 150), "--wait"}, 240s);
  const std::string job = sub.out.substr(0, sub.out.find('\n'));
  Result diag = Dgca(coord, {"diagnose", job}, 20s);
  Result json = Dgca(coord, {"diagnose", "--json", job}, 20s);
  hog.reset();
  ASSERT_EQ(sub.code, 0) << sub.out << sub.err << coord.Log();
  ASSERT_EQ(diag.code, 0) << diag.out << diag.err;
  std::fprintf(stderr, "%s", diag.out.c_str());
  // Each node has a rank (the planner spreads a CPU job's set ranks).
  EXPECT_NE(diag.out.find("node-a"), std::string::npos) << diag.out;
  EXPECT_NE(diag.out.find("limiting stage: straggler"), std::string::npos) << diag.out;
  EXPECT_NE(diag.out.find("look at node node-b"), std::string::npos) << diag.out;
  auto j = Json(json.out);
  ASSERT_TRUE(j.ok()) << json.out;
  const JsonValue* findings = j->Find("findings");
  ASSERT_TRUE(findings && findings->is_array()) << json.out;
  for (const auto& f : findings->array) {
    // node-a's wait is the straggler's doing, not the link's.
    if (JsonStr(f.Find("stage")) == "comm") {
      EXPECT_FALSE(f.Find("limiting") && f.Find("limiting")->boolean) << json.out;
    }
  }
}

}  // namespace
}  // namespace itest
}  // namespace dgca
