// Two `dgca-worker agent` processes (as on two nodes) and a coordinator
// without its embedded agent: nodes register, a 2-rank job runs on them and
// succeeds; stopping an agent with SIGTERM stops its ranks; `dgca nodes
// forget` then drops a node that is gone. A node made slow (its CPU shared
// with a busy loop) is named by `dgca diagnose JOB` as the straggler.
#include <gtest/gtest.h>
#include <sched.h>

#include <set>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

// Waits up to 20 s for node-a and node-b in `dgca nodes`; the last answer
// in *nodes.
bool BothNodesRegister(const CoordinatorProcess& coord, Result* nodes) {
  return WaitUntil(
      [&] {
        *nodes = Dgca(coord, {"nodes", "--json"});
        return nodes->out.find("node-a") != std::string::npos &&
               nodes->out.find("node-b") != std::string::npos;
      },
      20s);
}

TEST(MultiAgentTest, TwoAgentsRunATwoRankJob) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("multi");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--no-local-agent"}));
  pid_t a1 = StartAgent(coord, "node-a", dir + "/a");
  pid_t a2 = StartAgent(coord, "node-b", dir + "/b");

  Result nodes;
  EXPECT_TRUE(BothNodesRegister(coord, &nodes)) << nodes.out << nodes.err << coord.Log();
  Result table = Dgca(coord, {"nodes"});
  EXPECT_NE(table.out.find("node-a"), std::string::npos) << table.out;

  auto t_sub = Clock::now();
  Result sub = Dgca(coord, {"submit", WriteTinySpec(dir, "two-nodes", 8), "--wait"}, 120s);
  std::fprintf(stderr, "2-rank job over two agents: %.1f s\n",
               std::chrono::duration<double>(Clock::now() - t_sub).count());
  EXPECT_EQ(sub.code, 0) << sub.out << sub.err << coord.Log() << "\nagent a:\n"
                         << ReadFile(dir + "/a/agent.log") << "\nagent b:\n"
                         << ReadFile(dir + "/b/agent.log");
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
  StopAgent(a1);
  StopAgent(a2);
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
  EXPECT_NE(HttpGet(coord.metrics(), "/metrics").find("dgca_worker_connected{node=\"node-a\"} 0"),
            std::string::npos);
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
  std::string dir = MakeTempDir("adopt");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--no-local-agent"}));
  pid_t a = StartAgent(coord, "node-a", dir + "/a");
  pid_t b = StartAgent(coord, "node-b", dir + "/b");
  Result nodes;
  ASSERT_TRUE(BothNodesRegister(coord, &nodes)) << nodes.out << nodes.err << coord.Log();
  Result sub = Dgca(coord, {"submit", WriteTinySpec(dir, "adopt", 400)});
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
  kill(b, SIGKILL);
  waitpid(b, nullptr, 0);
  std::this_thread::sleep_for(1s);
  b = StartAgent(coord, "node-b", dir + "/b");
  JobView end;
  const bool finished = WaitUntil(
      [&] {
        end = Status(coord, job);
        return end.state == "SUCCEEDED" || end.state == "FAILED";
      },
      180s);
  const std::string agent_b = ReadFile(dir + "/b/agent.log");
  StopAgent(a);
  StopAgent(b);
  coord.Stop();
  ASSERT_TRUE(finished) << end.raw;
  EXPECT_EQ(end.state, "SUCCEEDED") << end.message << "\n" << coord.Log() << agent_b;
  EXPECT_NE(agent_b.find("adopted job " + job), std::string::npos) << agent_b;
  EXPECT_NE(end.raw.find("\"restarts\": 0"), std::string::npos) << end.raw;
}

// Pins the calling thread to one CPU; processes it forks inherit that.
bool PinSelfToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
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
  std::string dir = MakeTempDir("straggler");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--no-local-agent"}));
  // Each agent is forked pinned (every thread it starts, and its ranks,
  // inherit the CPU); this thread gets its CPUs back after.
  const bool pinned_a = PinSelfToCpu(0);
  pid_t a = pinned_a ? StartAgent(coord, "node-a", dir + "/a") : -1;
  const bool pinned_b = PinSelfToCpu(1);
  pid_t b = pinned_b ? StartAgent(coord, "node-b", dir + "/b") : -1;
  pid_t hog = pinned_b ? fork() : -1;
  if (hog == 0) {
    for (volatile uint64_t i = 0;; i = i + 1) {
    }
  }
  sched_setaffinity(0, sizeof(mine), &mine);
  auto cleanup = [&] {
    if (hog > 0) {
      kill(hog, SIGKILL);
      waitpid(hog, nullptr, 0);
    }
    StopAgent(a);
    StopAgent(b);
    coord.Stop();
  };
  if (!pinned_a || !pinned_b || hog < 0) {
    cleanup();
    FAIL() << "cannot pin the agents to CPUs 0 and 1 or start the busy loop";
  }
  Result nodes;
  if (!BothNodesRegister(coord, &nodes)) {
    cleanup();
    FAIL() << nodes.out << nodes.err << coord.Log();
  }
  Result sub = Dgca(coord, {"submit", WriteTinySpec(dir, "slow-node", 150), "--wait"}, 240s);
  const std::string job = sub.out.substr(0, sub.out.find('\n'));
  Result diag = Dgca(coord, {"diagnose", job}, 20s);
  Result json = Dgca(coord, {"diagnose", "--json", job}, 20s);
  cleanup();
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
