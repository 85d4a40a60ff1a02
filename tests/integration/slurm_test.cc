// Jobs on a real Slurm cluster (resources.launcher: slurm; docs/slurm.md):
// tools/slurm-local.sh starts munged, slurmctld and two slurmds on this
// machine for the suite (the second in network and UTS namespaces of its
// own, so it has its own address and host name; one node where namespaces
// cannot be made, said on stderr). The real coordinator (without its
// embedded agent, so that only Slurm's agents run ranks) hands each job to
// sbatch, and srun starts one `dgca-worker agent --bound-job` per allocated
// node. CPU ranks over Gloo, across the two nodes' veth link.
#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

std::string SourceDir() { return Env("DGCA_SOURCE_DIR", "."); }

// The processes whose command line mentions `job` (agents bound to it and
// its ranks).
std::vector<pid_t> ProcessesOf(const std::string& job) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    std::string cmd = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (absl::StrContains(cmd, "dgca-worker") && absl::StrContains(cmd, job) && ProcessAlive(pid)) {
      out.push_back(pid);
    }
  }
  closedir(d);
  return out;
}

// The bound agent of `job` (its pid), or -1.
pid_t BoundAgentOf(const std::string& job) {
  for (pid_t pid : ProcessesOf(job)) {
    std::string cmd = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (absl::StrContains(cmd, " agent ") && absl::StrContains(cmd, "--bound-job")) return pid;
  }
  return -1;
}

// `dgca status --json`'s job.launcher, as read.
struct SlurmView {
  std::string id, state, reason, nodes;
};
SlurmView LauncherOf(const CoordinatorProcess& c, const std::string& job) {
  SlurmView v;
  Result r = Dgca(c, {"status", "--json", job}, 20s);
  auto j = Json(r.out);
  if (!j.ok() || !j->Find("job")) return v;
  const JsonValue* l = j->Find("job")->Find("launcher");
  if (l == nullptr) return v;
  v.id = JsonStr(l->Find("job_id"));
  v.state = JsonStr(l->Find("state"));
  v.reason = JsonStr(l->Find("reason"));
  v.nodes = JsonStr(l->Find("nodes"));
  return v;
}

class SlurmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HavePrograms() || !HaveSharedData()) return;
    dir_ = new std::string(MakeTempDir("slurm"));
    chmod(dir_->c_str(), 0755);  // munged runs as user munge (tools/slurm-local.sh)
    const std::string slurm_dir = *dir_ + "/slurm";
    Result r = Exec({"/bin/bash", SourceDir() + "/tools/slurm-local.sh", "start", slurm_dir}, 120s);
    if (r.code != 0) {
      why_not_ = new std::string(absl::StrCat("a local Slurm cluster cannot run here (",
                                              "tools/slurm-local.sh exited ", r.code, "): ",
                                              r.err, r.out));
      return;
    }
    std::cerr << r.err;  // why the cluster has one node, when it has
    // KEY=VALUE lines: the cluster's config, its node count, the address its
    // nodes reach this machine on, and the interface Gloo uses between them.
    std::map<std::string, std::string> got;
    for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      const std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
      if (kv.size() == 2) got[kv[0]] = kv[1];
    }
    slurm_conf_ = new std::string(got["SLURM_CONF"]);
    nodes_ = std::max(1, std::atoi(got["SLURM_NODES"].c_str()));
    host_ = new std::string(got.count("DGCA_ADVERTISE_HOST") ? got["DGCA_ADVERTISE_HOST"]
                                                             : "127.0.0.1");
    setenv("SLURM_CONF", slurm_conf_->c_str(), 1);  // the coordinator's tools, and ours
    // The coordinator's environment is its Slurm jobs' (sbatch --export=ALL),
    // so the agents and ranks on both nodes get it.
    if (got.count("DGCA_GLOO_IFACE")) setenv("DGCA_GLOO_IFACE", got["DGCA_GLOO_IFACE"].c_str(), 1);
    mkdir((*dir_ + "/state").c_str(), 0755);
    coord_ = new CoordinatorProcess(*dir_ + "/state");
    // A fixed port: agents reconnect to it after a coordinator restart. On
    // the address both nodes reach (it is also the address agents get).
    port_ = FreePort();
    if (!coord_->Start(Listen(), {"--no-local-agent", "--heartbeat-timeout", "20"})) {
      delete coord_;
      coord_ = nullptr;
    }
  }
  static std::string Listen() { return absl::StrCat(*host_, ":", port_); }
  static void TearDownTestSuite() {
    if (coord_) {
      coord_->Stop();
      delete coord_;
      coord_ = nullptr;
    }
    if (slurm_conf_) {
      Exec({"/bin/bash", SourceDir() + "/tools/slurm-local.sh", "stop", *dir_ + "/slurm"}, 60s);
    }
  }
  void SetUp() override {
    if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
    if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
    if (why_not_) GTEST_SKIP() << *why_not_;
    ASSERT_NE(coord_, nullptr) << "coordinator did not start";
  }

  static int FreePort() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t n = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    close(fd);
    return ntohs(a.sin_port);
  }

  // A Slurm job holding every node (so the next one waits in the queue).
  std::string Blocker() {
    Result r = Exec({"/usr/bin/sbatch", "--parsable", "--job-name=blocker",
                     absl::StrCat("--nodes=", nodes_), "--exclusive",
                     "--output=" + *dir_ + "/blocker-%j.out", "--wrap", "sleep 300"},
                    30s);
    EXPECT_EQ(r.code, 0) << r.err;
    const std::string id = Trim(r.out);
    EXPECT_TRUE(WaitUntil([&] { return Squeue(id) == "RUNNING"; }, 30s)) << Squeue(id);
    return id;
  }
  // squeue's state of `id` ("" once Slurm has forgotten it).
  static std::string Squeue(const std::string& id) {
    Result r = Exec({"/usr/bin/squeue", "-h", "-t", "all", "-o", "%T", "-j", id}, 20s);
    return r.code == 0 ? Trim(r.out) : "";
  }
  // Whether Slurm holds or queues `id` no more.
  static bool SlurmDone(const std::string& id) {
    const std::string s = Squeue(id);
    return s.empty() || s == "COMPLETED" || s == "CANCELLED" || s == "FAILED" ||
           s == "TIMEOUT" || s == "NODE_FAIL" || s == "OUT_OF_MEMORY";
  }
  static std::string AllSqueue() {
    return Exec({"/usr/bin/squeue", "-t", "all"}, 20s).out;
  }
  // A tiny job on 2 CPU ranks in `slurm`'s allocation (default: every node).
  std::string Spec(const std::string& name, int steps, const std::string& slurm = "",
                   int checkpoint_every = 0, int max_restarts = 0) {
    TinySpecOptions o;
    o.ranks = 2;
    o.checkpoint_every = checkpoint_every;
    o.max_restarts = max_restarts;
    o.resources_extra = "launcher: slurm, slurm: " +
                        (slurm.empty() ? absl::StrCat("{nodes: ", nodes_, "}") : slurm);
    return WriteTinySpec(*dir_, name, steps, o);
  }
  std::string Submit(const std::string& spec) {
    Result r = Dgca(*coord_, {"submit", spec}, 60s);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return Trim(r.out);
  }
  // Whether `job` is RUNNING at step `step` or later within `timeout`.
  bool WaitRunning(const std::string& job, int64_t step, std::chrono::milliseconds timeout) {
    return WaitUntil([&] {
      JobView v = Status(*coord_, job);
      return v.state == "RUNNING" && v.step >= step;
    }, timeout);
  }
  std::string WaitState(const std::string& job, const std::set<std::string>& want,
                        std::chrono::milliseconds timeout) {
    std::string state;
    WaitUntil([&] {
      state = Status(*coord_, job).state;
      return want.count(state) > 0;
    }, timeout);
    return state;
  }

  static inline std::string* dir_ = nullptr;
  static inline std::string* slurm_conf_ = nullptr;
  static inline std::string* why_not_ = nullptr;
  static inline CoordinatorProcess* coord_ = nullptr;
  static inline std::string* host_ = nullptr;
  static inline int port_ = 0;
  static inline int nodes_ = 1;
};

// submit -> PENDING in Slurm (the node is busy) -> RUNNING -> SUCCEEDED with
// evaluation metrics; the allocation is released at the end.
TEST_F(SlurmTest, AJobWaitsInSlurmRunsAndSucceeds) {
  const std::string blocker = Blocker();
  const std::string job = Submit(Spec("queued", 40));
  ASSERT_FALSE(job.empty());
  SlurmView l;
  ASSERT_TRUE(WaitUntil([&] {
    l = LauncherOf(*coord_, job);
    return l.state == "PENDING" && !l.reason.empty();
  }, 60s)) << Status(*coord_, job).raw;
  JobView v = Status(*coord_, job);
  EXPECT_EQ(v.state, "PENDING");
  EXPECT_TRUE(absl::StartsWith(v.message, "waiting in Slurm: PENDING (")) << v.message;
  std::cerr << "while queued: dgca status says \"" << v.message << "\"; squeue:\n"
            << AllSqueue();
  Exec({"/usr/bin/scancel", blocker}, 20s);
  ASSERT_EQ(WaitState(job, {"RUNNING", "SUCCEEDED", "FAILED"}, 90s), "RUNNING")
      << Status(*coord_, job).raw;
  l = LauncherOf(*coord_, job);
  std::cerr << "while running: Slurm job " << l.id << " " << l.state << " on " << l.nodes
            << "; squeue:\n" << AllSqueue();
  ASSERT_EQ(WaitState(job, {"SUCCEEDED", "FAILED", "CANCELLED"}, 240s), "SUCCEEDED")
      << Status(*coord_, job).raw << coord_->Log();
  Result s = Dgca(*coord_, {"status", "--json", job}, 20s);
  EXPECT_TRUE(absl::StrContains(s.out, "char_correction_f1")) << s.out;
  // One rank per allocated node (HOST-slurmID, HOST-2-slurmID).
  std::set<std::string> rank_nodes;
  if (auto j = Json(s.out); j.ok() && j->Find("job") && j->Find("job")->Find("ranks")) {
    for (const JsonValue& r : j->Find("job")->Find("ranks")->array) {
      rank_nodes.insert(JsonStr(r.Find("node")));
    }
  }
  EXPECT_EQ(static_cast<int>(rank_nodes.size()), nodes_) << s.out;
  // Its agents were released: the allocation ends and nothing of it is left.
  EXPECT_TRUE(WaitUntil([&] { return SlurmDone(l.id); }, 60s)) << AllSqueue();
  EXPECT_TRUE(WaitUntil([&] { return ProcessesOf(job).empty(); }, 30s));
  Result text = Dgca(*coord_, {"status", job}, 20s);
  EXPECT_TRUE(absl::StrContains(text.out, "slurm    job " + l.id)) << text.out;
}

TEST_F(SlurmTest, CancelWhileQueuedLeavesNothingInSlurm) {
  const std::string blocker = Blocker();
  const std::string job = Submit(Spec("cancel-queued", 40));
  SlurmView l;
  ASSERT_TRUE(WaitUntil([&] {
    l = LauncherOf(*coord_, job);
    return l.state == "PENDING";
  }, 60s)) << Status(*coord_, job).raw;
  Result c = Dgca(*coord_, {"cancel", job}, 30s);
  EXPECT_EQ(c.code, 0) << c.out << c.err;
  EXPECT_EQ(Status(*coord_, job).state, "CANCELLED");
  EXPECT_TRUE(WaitUntil([&] { return SlurmDone(l.id); }, 30s)) << AllSqueue();
  Exec({"/usr/bin/scancel", blocker}, 20s);
  EXPECT_TRUE(ProcessesOf(job).empty());
}

TEST_F(SlurmTest, CancelWhileRunningStopsRanksAgentsAndTheAllocation) {
  const std::string job = Submit(Spec("cancel-running", 5000));
  ASSERT_TRUE(WaitRunning(job, 1, 120s)) << Status(*coord_, job).raw;
  const SlurmView l = LauncherOf(*coord_, job);
  ASSERT_FALSE(ProcessesOf(job).empty());
  Result c = Dgca(*coord_, {"cancel", job}, 30s);
  EXPECT_EQ(c.code, 0) << c.out << c.err;
  EXPECT_EQ(WaitState(job, {"CANCELLED"}, 30s), "CANCELLED");
  EXPECT_TRUE(WaitUntil([&] { return ProcessesOf(job).empty(); }, 30s));
  EXPECT_TRUE(WaitUntil([&] { return SlurmDone(l.id); }, 30s)) << AllSqueue();
}

// kill -9 of the job's agent: srun ends the step, Slurm takes the
// allocation back and the ranks go with it; the job restarts from its
// checkpoint in a new allocation and succeeds.
TEST_F(SlurmTest, AKilledAgentRestartsTheJobInANewAllocation) {
  const std::string job = Submit(Spec("agent-killed", 400, "", /*checkpoint_every=*/20,
                                      /*max_restarts=*/1));
  ASSERT_TRUE(WaitRunning(job, 40, 180s)) << Status(*coord_, job).raw;
  const SlurmView first = LauncherOf(*coord_, job);
  const pid_t agent = BoundAgentOf(job);
  ASSERT_GT(agent, 0);
  const int64_t at = Status(*coord_, job).step;
  kill(agent, SIGKILL);
  std::cerr << "killed agent pid " << agent << " at step " << at << " (Slurm job " << first.id
            << ")\n";
  ASSERT_TRUE(WaitUntil([&] {
    const SlurmView l = LauncherOf(*coord_, job);
    return !l.id.empty() && l.id != first.id;
  }, 90s)) << Status(*coord_, job).raw << coord_->Log();
  ASSERT_EQ(WaitState(job, {"SUCCEEDED", "FAILED", "CANCELLED"}, 300s), "SUCCEEDED")
      << Status(*coord_, job).raw;
  Result s = Dgca(*coord_, {"status", job}, 20s);
  EXPECT_TRUE(absl::StrContains(s.out, "1 restart(s)")) << s.out;
  // It resumed from a checkpoint: the restart's ranks logged so.
  const std::string log = ReadFile(coord_->state_dir() + "/jobs/" + job + "/rank-0.log");
  EXPECT_TRUE(absl::StrContains(log, "resuming from")) << log.substr(0, 4000);
  std::cerr << "restart: " << s.out;
}

// Slurm's warning before the time limit (--signal=USR1@120; sent here with
// scancel --signal=USR1, which like Slurm signals every process of the
// step, agents and ranks): the ranks live on, the agents ask for a
// checkpoint, and every rank takes it at the same step.
TEST_F(SlurmTest, TheTimeLimitWarningCheckpointsEveryRankAtOneStep) {
  const std::string job = Submit(Spec("time-limit", 5000));
  ASSERT_TRUE(WaitRunning(job, 5, 120s)) << Status(*coord_, job).raw;
  const SlurmView l = LauncherOf(*coord_, job);
  Result sig = Exec({"/usr/bin/scancel", "--signal=USR1", l.id}, 20s);
  ASSERT_EQ(sig.code, 0) << sig.err;
  const std::string logs = coord_->state_dir() + "/jobs/" + job + "/rank-";
  // The step at which `rank`'s trainer acted on the request (-1: not yet).
  auto acted_at = [&](int rank) -> int64_t {
    const std::string log = ReadFile(logs + std::to_string(rank) + ".log");
    const std::string mark = "checkpoint asked for at step ";
    const size_t at = log.find(mark);
    return at == std::string::npos ? -1 : std::atoll(log.c_str() + at + mark.size());
  };
  ASSERT_TRUE(WaitUntil([&] { return acted_at(0) > 0 && acted_at(1) > 0; }, 60s))
      << ReadFile(logs + "0.log").substr(0, 3000) << Status(*coord_, job).raw;
  const int64_t step = acted_at(0);
  EXPECT_EQ(acted_at(1), step);
  // Rank 0 writes the data-parallel job's checkpoint (the ranks' weights are
  // the same).
  EXPECT_TRUE(WaitUntil([&] {
    return absl::StrContains(ReadFile(logs + "0.log"), absl::StrCat("checkpoint at step ", step, ": "));
  }, 30s)) << ReadFile(logs + "0.log").substr(0, 3000);
  JobView v = Status(*coord_, job);
  EXPECT_EQ(v.state, "RUNNING") << v.raw;
  Result text = Dgca(*coord_, {"status", job}, 20s);
  EXPECT_TRUE(absl::StrContains(text.out, absl::StrCat("checkpoint asked for at step ", step)))
      << text.out;
  EXPECT_TRUE(absl::StrContains(ReadFile(logs + "1.log"), "SIGUSR1: the time limit is near"));
  std::cerr << "after scancel --signal=USR1 " << l.id << ": both ranks checkpointed at step "
            << step << "\n";
  Dgca(*coord_, {"cancel", job}, 30s);
  EXPECT_EQ(WaitState(job, {"CANCELLED"}, 30s), "CANCELLED");
}

// kill -9 of the coordinator while the job runs in Slurm: the next
// coordinator finds the allocation again (its id is in the job store), asks
// Slurm for no other, and the job succeeds.
TEST_F(SlurmTest, ARestartedCoordinatorFindsItsSlurmJobs) {
  const std::string job = Submit(Spec("refound", 300));
  ASSERT_TRUE(WaitRunning(job, 1, 120s)) << Status(*coord_, job).raw;
  const SlurmView before = LauncherOf(*coord_, job);
  coord_->Kill9();
  ASSERT_TRUE(coord_->Start(Listen(), {"--no-local-agent", "--heartbeat-timeout", "20"}));
  ASSERT_EQ(WaitState(job, {"SUCCEEDED", "FAILED", "CANCELLED"}, 240s), "SUCCEEDED")
      << Status(*coord_, job).raw << coord_->Log();
  EXPECT_EQ(LauncherOf(*coord_, job).id, before.id) << "a second allocation was asked for";
  Result q = Exec({"/usr/bin/squeue", "-h", "-t", "all", "-n", "dgca-" + job, "-o", "%i"}, 20s);
  EXPECT_EQ(Trim(q.out), before.id) << q.out;
}

// deploy/slurm/agents.sbatch, as a user who holds an allocation runs it:
// its agent joins the running coordinator, an ordinary (launcher: local)
// job runs on it, and scancel of the allocation takes the agent away. The
// example job specs there are valid specs (their data, the quickstart's
// corpus under .dgca/data, is not built in a fresh clone: --spec-only).
TEST_F(SlurmTest, AgentsInAnAllocationOfYourOwnRunOrdinaryJobs) {
  for (const char* f : {"job.yaml", "launcher-job.yaml"}) {
    Result v =
        Dgca(*coord_, {"validate", "--spec-only", SourceDir() + "/deploy/slurm/" + f}, 20s);
    EXPECT_EQ(v.code, 0) << f << ": " << v.out << v.err;
    EXPECT_NE(v.out.find("valid as a spec"), std::string::npos) << v.out;
  }
  const std::string agent_dir = *dir_ + "/own-agents";
  mkdir(agent_dir.c_str(), 0755);
  // sbatch passes this environment to the script (--export=ALL).
  const std::vector<std::pair<std::string, std::string>> env = {
      {"DGCA_COORDINATOR", Listen()},
      {"DGCA_AGENT_TOKEN_FILE", coord_->state_dir() + "/agent-token"},
      {"DGCA_WORKER", WorkerBin()},
      {"DGCA_AGENT_STATE_DIR", agent_dir}};
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  Result r = Exec({"/usr/bin/sbatch", "--parsable", absl::StrCat("--nodes=", nodes_),
                   "--output=" + agent_dir + "/slurm-%j.out",
                   SourceDir() + "/deploy/slurm/agents.sbatch"},
                  30s);
  for (const auto& [k, v] : env) unsetenv(k.c_str());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string allocation = Trim(r.out);
  // Connected agents not bound to a job: these agents register under their
  // nodes' host names (the launcher's are HOST-slurmID, bound).
  auto agents = [&] {
    auto j = Json(Dgca(*coord_, {"nodes", "--json"}, 20s).out);
    const JsonValue* nodes = j.ok() ? j->Find("nodes") : nullptr;
    int n = 0;
    if (nodes == nullptr || !nodes->is_array()) return n;
    for (const JsonValue& node : nodes->array) {
      const JsonValue* c = node.Find("connected");
      const bool connected = c != nullptr && c->type == JsonValue::Type::kBool && c->boolean;
      if (connected && !absl::StrContains(JsonStr(node.Find("name")), "-slurm")) ++n;
    }
    return n;
  };
  ASSERT_TRUE(WaitUntil([&] { return agents() == nodes_; }, 60s))
      << Dgca(*coord_, {"nodes"}, 20s).out << AllSqueue()
      << ReadFile(agent_dir + "/slurm-" + allocation + ".out");
  std::cerr << "agents of Slurm job " << allocation << ":\n" << Dgca(*coord_, {"nodes"}, 20s).out;
  const std::string job = Submit(WriteTinySpec(*dir_, "on-own-agents", 30, 2));
  EXPECT_EQ(WaitState(job, {"SUCCEEDED", "FAILED", "CANCELLED"}, 180s), "SUCCEEDED")
      << Status(*coord_, job).raw;
  Exec({"/usr/bin/scancel", allocation}, 20s);
  EXPECT_TRUE(WaitUntil([&] { return SlurmDone(allocation); }, 60s)) << AllSqueue();
  EXPECT_TRUE(WaitUntil([&] { return agents() == 0; }, 60s)) << Dgca(*coord_, {"nodes"}, 20s).out;
}

// What Slurm says of a bad request reaches the user, naming the command.
TEST_F(SlurmTest, SlurmsRefusalsAreNamed) {
  Result part = Dgca(*coord_, {"submit", Spec("bad-partition", 10, "{partition: nope}")}, 60s);
  EXPECT_EQ(part.code, 2) << part.out << part.err;
  EXPECT_TRUE(absl::StrContains(part.err, "no partition 'nope'")) << part.err;
  EXPECT_TRUE(absl::StrContains(part.err, "sinfo lists: debug")) << part.err;
  Result nodes = Dgca(*coord_, {"submit", Spec("too-many-nodes", 10, "{nodes: 3}")}, 60s);
  EXPECT_EQ(nodes.code, 2) << nodes.out << nodes.err;
  EXPECT_TRUE(absl::StrContains(nodes.err, absl::StrCat("has ", nodes_, " node(s)"))) << nodes.err;
  // Refused before anything was stored.
  Result list = Dgca(*coord_, {"list"}, 20s);
  EXPECT_FALSE(absl::StrContains(list.out, "bad-partition")) << list.out;
  EXPECT_FALSE(absl::StrContains(list.out, "too-many-nodes")) << list.out;
  Result plan = Dgca(*coord_, {"plan", Spec("planned", 10, "{nodes: 1, time: '10:00'}")}, 60s);
  EXPECT_EQ(plan.code, 0) << plan.out << plan.err;
  EXPECT_TRUE(absl::StrContains(plan.out, "#SBATCH --time=10:00")) << plan.out;
  EXPECT_TRUE(absl::StrContains(plan.out, "--bound-job")) << plan.out;
  // time: auto, after the jobs above measured this model's step time on
  // the partition: the predicted run time plus the margin.
  Result automatic = Dgca(
      *coord_, {"plan", Spec("timed", 2000, absl::StrCat("{nodes: ", nodes_, ", time: auto}"))},
      60s);
  EXPECT_EQ(automatic.code, 0) << automatic.out << automatic.err;
  EXPECT_TRUE(absl::StrContains(automatic.out, "#SBATCH --time=")) << automatic.out;
  EXPECT_TRUE(absl::StrContains(automatic.out, "resources.slurm.time auto: --time=")) << automatic.out;
  EXPECT_TRUE(absl::StrContains(automatic.out, "2000 steps x ")) << automatic.out;
  // On a partition nothing has run on, there is nothing to predict from.
  Result unknown = Dgca(*coord_, {"plan", Spec("untimed", 10, "{partition: debug, time: auto}")}, 60s);
  EXPECT_EQ(unknown.code, 0) << unknown.out << unknown.err;
  EXPECT_FALSE(absl::StrContains(unknown.out, "#SBATCH --time=")) << unknown.out;
  EXPECT_TRUE(absl::StrContains(unknown.out, "no step-time measurement")) << unknown.out;
}

// A coordinator whose Slurm is down, or not there, says which command failed
// and what it printed.
TEST_F(SlurmTest, ASlurmThatIsDownOrMissingIsNamed) {
  const std::string dir = MakeTempDir("slurm-down");
  // The cluster's config with the controller moved to a port nobody serves.
  std::string conf = ReadFile(*slurm_conf_);
  std::vector<std::string> lines = absl::StrSplit(conf, '\n');
  for (auto& line : lines) {
    if (absl::StartsWith(line, "SlurmctldPort=")) line = absl::StrCat("SlurmctldPort=", FreePort());
  }
  WriteFile(dir + "/slurm.conf", absl::StrJoin(lines, "\n"));
  setenv("SLURM_CONF", (dir + "/slurm.conf").c_str(), 1);
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess down(dir + "/state");
  const bool started = down.Start("127.0.0.1:0", {"--no-local-agent"});
  setenv("SLURM_CONF", slurm_conf_->c_str(), 1);
  ASSERT_TRUE(started);
  Result r = Dgca(down, {"submit", Spec("slurm-down", 10)}, 120s);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.err, "sinfo -h -o")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "Unable to contact slurm controller")) << r.err;
  down.Stop();

  CoordinatorProcess missing(dir + "/state");
  ASSERT_TRUE(missing.Start("127.0.0.1:0", {"--no-local-agent", "--slurm-bin-dir", "/nonexistent"}));
  Result m = Dgca(missing, {"submit", Spec("slurm-missing", 10)}, 60s);
  EXPECT_NE(m.code, 0);
  EXPECT_TRUE(absl::StrContains(m.err, "/nonexistent/sinfo is not installed")) << m.err;
}

}  // namespace
}  // namespace itest
}  // namespace dgca
