#include "worker/agent/agent.h"

#include <signal.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <gtest/gtest.h>

#include <filesystem>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "dgca/v1/agent.grpc.pb.h"
#include "model/core/core_test_util.h"
#include "proto/rpc/rpc_util.h"
#include "worker/agent/rank_process.h"

namespace dgca {
namespace {

using namespace std::chrono_literals;

// A coordinator stand-in: accepts one agent stream at a time, records what
// the agent sends and sends the commands a test queues.
class FakeCoordinator final : public v1::AgentService::Service {
 public:
  explicit FakeCoordinator(std::string token) : token_(std::move(token)) {}

  grpc::Status Connect(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<v1::CoordinatorCommand, v1::AgentMessage>* stream)
      override {
    if (!IsAuthorized(*ctx, token_)) return Unauthenticated();
    bool done = false;
    std::thread reader([&] {
      v1::AgentMessage m;
      while (stream->Read(&m)) {
        std::lock_guard<std::mutex> l(mu_);
        received_.push_back(m);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> l(mu_);
      done = true;
      cv_.notify_all();
    });
    while (true) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, 50ms, [&] { return done || !commands_.empty() || shutdown_; });
      if (done || shutdown_ || ctx->IsCancelled()) break;
      while (!commands_.empty()) {
        auto c = commands_.front();
        commands_.pop_front();
        l.unlock();
        stream->Write(c);
        l.lock();
      }
    }
    ctx->TryCancel();
    reader.join();
    return grpc::Status::OK;
  }

  void Send(const v1::CoordinatorCommand& c) {
    std::lock_guard<std::mutex> l(mu_);
    commands_.push_back(c);
    cv_.notify_all();
  }
  void Shutdown() {
    std::lock_guard<std::mutex> l(mu_);
    shutdown_ = true;
    cv_.notify_all();
  }

  // Waits for a message matching `pred`; returns it (or nullopt on timeout).
  template <typename Pred>
  std::optional<v1::AgentMessage> WaitFor(Pred pred, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> l(mu_);
    std::optional<v1::AgentMessage> found;
    cv_.wait_for(l, timeout, [&] {
      for (const auto& m : received_) {
        if (pred(m)) {
          found = m;
          return true;
        }
      }
      return false;
    });
    return found;
  }
  std::optional<v1::RankExited> WaitExit(const std::string& job, int rank,
                                         std::chrono::milliseconds timeout = 10s) {
    auto m = WaitFor(
        [&](const v1::AgentMessage& m) {
          return m.has_rank_exited() && m.rank_exited().job_id() == job &&
                 m.rank_exited().rank() == rank;
        },
        timeout);
    if (!m) return std::nullopt;
    return m->rank_exited();
  }
  std::vector<v1::AgentMessage> Received() {
    std::lock_guard<std::mutex> l(mu_);
    return received_;
  }
  int CountRegisters() {
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    for (const auto& m : received_) n += m.has_register_();
    return n;
  }

 private:
  std::string token_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::AgentMessage> received_;
  std::deque<v1::CoordinatorCommand> commands_;
  bool shutdown_ = false;
};

std::string MakeTempDir() {
  const std::string d = testutil::MakeTempDir("agent_test");
  EXPECT_FALSE(d.empty());
  return d.empty() ? "/tmp" : d;
}

using testutil::ReadFile;

bool ProcessAlive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  // A zombie counts as gone.
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t p = stat.rfind(')');
  return !(p != std::string::npos && p + 2 < stat.size() && stat[p + 2] == 'Z');
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    StartServer(0);
  }
  void TearDown() override { StopServer(); }
  void StartServer(int port) {
    fake_ = std::make_unique<FakeCoordinator>("secret");
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                       &port_);
    b.RegisterService(fake_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void StopServer() {
    if (!server_) return;
    fake_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
    server_->Wait();
    server_.reset();
  }
  AgentOptions Options(std::vector<std::string> argv) {
    AgentOptions o;
    o.coordinator_address = "127.0.0.1:" + std::to_string(port_);
    o.token = "secret";
    o.node_name = "test-node";
    o.state_dir = dir_;
    o.heartbeat_interval_s = 0.2;
    o.rank_argv_override = std::move(argv);
    return o;
  }
  // Starts `agent`, waits for its registration and launches rank 0 of
  // job-a; the rank's pid in *pid.
  void StartWithOneRank(Agent* agent, pid_t* pid) {
    ASSERT_TRUE(agent->Start().ok());
    ASSERT_TRUE(fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_register_(); }));
    agent->Execute(Launch("job-a", 0));
    auto running = agent->Running();
    ASSERT_EQ(running.size(), 1u);
    *pid = running[0].pid();
  }
  static v1::CoordinatorCommand Launch(const std::string& job, int rank) {
    v1::CoordinatorCommand c;
    c.mutable_launch()->set_job_id(job);
    c.mutable_launch()->set_rank(rank);
    c.mutable_launch()->set_world_size(1);
    c.mutable_launch()->set_rank_token("dgca-rank:" + job + ":0:test");
    return c;
  }

  std::string dir_;
  int port_ = 0;
  std::unique_ptr<FakeCoordinator> fake_;
  std::unique_ptr<grpc::Server> server_;
};

TEST(AgentEnvTest, AllowList) {
  EXPECT_TRUE(IsAllowedRankEnv("NCCL_DEBUG"));
  EXPECT_TRUE(IsAllowedRankEnv("CUDA_VISIBLE_DEVICES"));
  EXPECT_TRUE(IsAllowedRankEnv("OMP_NUM_THREADS"));
  EXPECT_TRUE(IsAllowedRankEnv("DGCA_X1"));
  EXPECT_FALSE(IsAllowedRankEnv("LD_PRELOAD"));
  EXPECT_FALSE(IsAllowedRankEnv("PATH"));
  EXPECT_FALSE(IsAllowedRankEnv("NCCL_"));
  EXPECT_FALSE(IsAllowedRankEnv("nccl_debug"));
  EXPECT_FALSE(IsAllowedRankEnv("NCCL_X=Y"));
}

// Allowed prefixes, refused names (spec/rank_env.h): what loads code into
// the rank or writes files on the node; their tuning neighbours stay.
TEST(AgentEnvTest, RefusesWhatLoadsCodeOrWritesFiles) {
  for (const char* n : {"NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN",
                        "NCCL_ENV_PLUGIN", "CUDA_INJECTION64_PATH", "OMP_TOOL_LIBRARIES",
                        "NCCL_DEBUG_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_DUMP_FILE",
                        "NCCL_CONF_FILE"}) {
    EXPECT_FALSE(IsAllowedRankEnv(n)) << n;
  }
  EXPECT_TRUE(IsAllowedRankEnv("NCCL_TOPO_FILE"));
  EXPECT_TRUE(IsAllowedRankEnv("NCCL_SOCKET_IFNAME"));
  EXPECT_TRUE(IsAllowedRankEnv("OMP_TOOL"));
}

// A LaunchRank that sets one anyway (a coordinator that skipped the spec's
// check): the rank runs without it, and its log says which and why.
TEST_F(AgentTest, LaunchRefusesEnvThatLoadsCodeAndLogsWhy) {
  Agent agent(Options({"/bin/sh", "-c",
                       "echo \"plugin=[$NCCL_NET_PLUGIN] file=[$NCCL_DEBUG_FILE] ib=[$NCCL_IB_DISABLE]\""}));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_register_(); }));
  auto cmd = Launch("job-env", 0);
  (*cmd.mutable_launch()->mutable_env())["NCCL_NET_PLUGIN"] = "/tmp/evil.so";
  (*cmd.mutable_launch()->mutable_env())["NCCL_DEBUG_FILE"] = "/tmp/x";
  (*cmd.mutable_launch()->mutable_env())["NCCL_IB_DISABLE"] = "1";
  fake_->Send(cmd);
  auto e = fake_->WaitExit("job-env", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 0);
  const std::string log = ReadFile(dir_ + "/jobs/job-env/rank-0.log");
  EXPECT_NE(log.find("plugin=[] file=[] ib=[1]"), std::string::npos) << log;
  EXPECT_NE(log.find("refused environment variable NCCL_NET_PLUGIN (it loads a library into the "
                     "rank"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("refused environment variable NCCL_DEBUG_FILE (it writes a file on the node"),
            std::string::npos)
      << log;
  agent.Stop();
}

TEST_F(AgentTest, RegistersWithTopologyAndHeartbeats) {
  Agent agent(Options({}));
  ASSERT_TRUE(agent.Start().ok());
  auto reg = fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_register_(); });
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->register_().node(), "test-node");
  EXPECT_EQ(reg->register_().topology().node(), "test-node");
  EXPECT_GT(reg->register_().topology().cpu_count(), 0);
  auto hb = fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_heartbeat(); });
  ASSERT_TRUE(hb.has_value());
  EXPECT_GT(hb->heartbeat().time_unix_ms(), 0);
  EXPECT_TRUE(agent.connected());
  agent.Stop();
}

TEST_F(AgentTest, FailedProbeStillRegistersWithTheError) {
  AgentOptions o = Options({});
  o.topology_root = "/nonexistent/root";
  Agent agent(o);
  ASSERT_TRUE(agent.Start().ok());
  auto reg = fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_register_(); });
  ASSERT_TRUE(reg.has_value());
  const auto& t = reg->register_().topology();
  EXPECT_EQ(t.node(), "test-node");
  EXPECT_GT(t.cpu_count(), 0);
  ASSERT_GT(t.unknown_size(), 0);
  EXPECT_NE(t.unknown(0).find("topology probe failed"), std::string::npos) << t.unknown(0);
  agent.Stop();
}

// A refused token never connects, and the log says so with the
// coordinator's own status (the stream's end used to read "CANCELLED", our
// cancel before Finish, so the refusal was never named).
TEST_F(AgentTest, WrongTokenNeverConnects) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  AgentOptions o = Options({});
  o.token = "wrong";
  Agent agent(o);
  ASSERT_TRUE(agent.Start().ok());
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(fake_->CountRegisters(), 0);
  agent.Stop();
  spdlog::default_logger()->sinks().pop_back();
  const std::string text = log.str();
  EXPECT_NE(text.find("closed (16: missing or wrong bearer token"), std::string::npos) << text;
  EXPECT_NE(text.find("the coordinator rejected the token; --token-file must be a copy of the "
                      "coordinator's STATE_DIR/agent-token"),
            std::string::npos)
      << text;
}

TEST_F(AgentTest, LaunchReportsExitCodeAndLogTail) {
  Agent agent(Options({"/bin/sh", "-c",
                       "echo out job={job} rank={rank} attempt={attempt}; echo oops >&2; "
                       "echo \"env=$DGCA_TEST_X path=$LD_PRELOAD\"; echo dev=$DGCA_LOCAL_DEVICE node=$DGCA_NODE; "
                       "exit 3"}));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_register_(); }));
  auto cmd = Launch("job-1", 1);
  cmd.mutable_launch()->set_attempt(2);
  cmd.mutable_launch()->set_local_device(-1);
  (*cmd.mutable_launch()->mutable_env())["DGCA_TEST_X"] = "42";
  (*cmd.mutable_launch()->mutable_env())["LD_PRELOAD"] = "/evil.so";
  fake_->Send(cmd);
  auto e = fake_->WaitExit("job-1", 1);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 3);
  EXPECT_EQ(e->signal(), 0);
  EXPECT_EQ(e->attempt(), 2);
  EXPECT_NE(e->message().find("oops"), std::string::npos) << e->message();
  std::string log = ReadFile(dir_ + "/jobs/job-1/rank-1.log");
  EXPECT_NE(log.find("out job=job-1 rank=1 attempt=2"), std::string::npos) << log;
  EXPECT_NE(log.find("env=42 path=\n"), std::string::npos) << log;
  EXPECT_NE(log.find("refused"), std::string::npos) << log;
  EXPECT_NE(log.find("dev=-1 node=test-node"), std::string::npos) << log;
  EXPECT_NE(log.find("LD_PRELOAD"), std::string::npos) << log;
  EXPECT_NE(log.find("exited with code 3"), std::string::npos) << log;
  EXPECT_TRUE(agent.Running().empty());
  agent.Stop();
}

// The rank's credential (LaunchRank.rank_token) reaches the rank through a
// 0600 file of its own attempt, given as --token-file, and is gone once the
// rank has exited.
TEST_F(AgentTest, TheRankTokenIsAFileOfItsOwnGoneAfterTheExit) {
  // Where the agent's own token is does not reach the rank.
  setenv("CREDENTIALS_DIRECTORY", "/run/credentials/dgca-agent.service", 1);
  setenv("DGCA_AGENT_TOKEN_FILE", "/etc/dgca/agent-token", 1);
  Agent agent(Options({"/bin/sh", "-c",
                       "echo file={token_file}; echo token=$(cat {token_file}); "
                       "stat -c mode=%a {token_file}; "
                       "echo \"creds=$CREDENTIALS_DIRECTORY agent=$DGCA_AGENT_TOKEN_FILE.\""}));
  const bool started = agent.Start().ok();
  auto cmd = Launch("job-t", 1);
  cmd.mutable_launch()->set_attempt(3);
  cmd.mutable_launch()->set_rank_token("dgca-rank:job-t:3:abc123");
  if (started) agent.Execute(cmd);  // the environment is read at launch
  auto e = started ? fake_->WaitExit("job-t", 1) : std::nullopt;
  unsetenv("CREDENTIALS_DIRECTORY");
  unsetenv("DGCA_AGENT_TOKEN_FILE");
  ASSERT_TRUE(started);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 0);
  const std::string file = dir_ + "/jobs/job-t/rank-1.3.token";
  std::string log = ReadFile(dir_ + "/jobs/job-t/rank-1.log");
  EXPECT_NE(log.find("file=" + file + "\n"), std::string::npos) << log;
  EXPECT_NE(log.find("token=dgca-rank:job-t:3:abc123\n"), std::string::npos) << log;
  EXPECT_NE(log.find("mode=600\n"), std::string::npos) << log;
  EXPECT_NE(log.find("creds= agent=.\n"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(file)) << "left behind after the rank exited";
  agent.Stop();
}

// A LaunchRank without a rank token (a coordinator older than the agent) is
// refused with why, rather than starting a rank that cannot reach it.
TEST_F(AgentTest, ALaunchWithoutARankTokenIsRefused) {
  Agent agent(Options({"/bin/sh", "-c", "echo started"}));
  ASSERT_TRUE(agent.Start().ok());
  auto cmd = Launch("job-n", 0);
  cmd.mutable_launch()->clear_rank_token();
  agent.Execute(cmd);
  auto e = fake_->WaitExit("job-n", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 127);
  EXPECT_NE(e->message().find("sent no rank token"), std::string::npos) << e->message();
  EXPECT_EQ(ReadFile(dir_ + "/jobs/job-n/rank-0.log").find("started"), std::string::npos);
  agent.Stop();
}

TEST_F(AgentTest, CleanExitHasNoMessage) {
  Agent agent(Options({"/bin/sh", "-c", "echo fine"}));
  ASSERT_TRUE(agent.Start().ok());
  agent.Execute(Launch("job-ok", 0));
  auto e = fake_->WaitExit("job-ok", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 0);
  EXPECT_TRUE(e->message().empty());
  agent.Stop();
}

TEST_F(AgentTest, BadJobIdIsRefused) {
  Agent agent(Options({"/bin/sh", "-c", "exit 0"}));
  ASSERT_TRUE(agent.Start().ok());
  agent.Execute(Launch("../escape", 0));
  auto e = fake_->WaitExit("../escape", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 127);
  EXPECT_NE(e->message().find("job id"), std::string::npos);
  struct stat st;
  EXPECT_NE(stat((dir_ + "/escape").c_str(), &st), 0);
  agent.Stop();
}

TEST_F(AgentTest, MissingBinaryReports127) {
  Agent agent(Options({"/nonexistent/dgca-worker"}));
  ASSERT_TRUE(agent.Start().ok());
  agent.Execute(Launch("job-x", 0));
  auto e = fake_->WaitExit("job-x", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 127);
  EXPECT_NE(e->message().find("exec failed"), std::string::npos) << e->message();
  agent.Stop();
}

// The rank ignores SIGTERM and has a grandchild: StopRanks must SIGKILL the
// whole process group once the grace expires.
TEST_F(AgentTest, StopKillsWholeProcessGroupWithinGrace) {
  std::string pidfile = dir_ + "/grandchild.pid";
  Agent agent(Options({"/bin/sh", "-c",
                       "trap '' TERM; sleep 100 & echo $! > " + pidfile + "; wait; wait"}));
  ASSERT_TRUE(agent.Start().ok());
  agent.Execute(Launch("job-s", 0));
  pid_t grandchild = 0;
  for (int i = 0; i < 100 && grandchild == 0; ++i) {
    std::this_thread::sleep_for(20ms);
    grandchild = std::atoi(ReadFile(pidfile).c_str());
  }
  ASSERT_GT(grandchild, 0);
  auto running = agent.Running();
  ASSERT_EQ(running.size(), 1u);
  pid_t rank_pid = running[0].pid();
  EXPECT_TRUE(ProcessAlive(grandchild));

  v1::CoordinatorCommand stop;
  stop.mutable_stop()->set_job_id("job-s");
  stop.mutable_stop()->set_grace_seconds(0.5);
  auto t0 = std::chrono::steady_clock::now();
  fake_->Send(stop);
  auto e = fake_->WaitExit("job-s", 0);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), -1);
  EXPECT_EQ(e->signal(), SIGKILL);
  EXPECT_LT(took, 3s);
  EXPECT_GE(took, 400ms);  // it waited for the grace
  for (int i = 0; i < 50 && ProcessAlive(grandchild); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(ProcessAlive(grandchild));
  EXPECT_FALSE(ProcessAlive(rank_pid));
  agent.Stop();
}

TEST_F(AgentTest, StopTermsPoliteRankQuickly) {
  Agent agent(Options({"/bin/sh", "-c", "sleep 100"}));
  ASSERT_TRUE(agent.Start().ok());
  agent.Execute(Launch("job-t", 0));
  agent.Execute(Launch("job-t", 1));
  ASSERT_EQ(agent.Running().size(), 2u);
  v1::CoordinatorCommand stop;
  stop.mutable_stop()->set_job_id("job-t");
  stop.mutable_stop()->set_grace_seconds(5);
  auto t0 = std::chrono::steady_clock::now();
  agent.Execute(stop);
  auto e0 = fake_->WaitExit("job-t", 0);
  auto e1 = fake_->WaitExit("job-t", 1);
  ASSERT_TRUE(e0 && e1);
  EXPECT_EQ(e0->signal(), SIGTERM);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  agent.Stop();
}

// StopRanks naming attempts stops only those ranks: the coordinator stops
// stale ranks that way, and a new attempt launched just before must live.
TEST_F(AgentTest, StopOfAnAttemptSparesTheOthers) {
  Agent agent(Options({"/bin/sh", "-c", "sleep 100"}));
  ASSERT_TRUE(agent.Start().ok());
  auto old_rank = Launch("job-a", 0);
  old_rank.mutable_launch()->set_attempt(2);
  agent.Execute(old_rank);
  auto new_rank = Launch("job-a", 1);
  new_rank.mutable_launch()->set_attempt(3);
  agent.Execute(new_rank);
  ASSERT_EQ(agent.Running().size(), 2u);
  v1::CoordinatorCommand stop;
  stop.mutable_stop()->set_job_id("job-a");
  stop.mutable_stop()->set_grace_seconds(5);
  stop.mutable_stop()->add_attempts(2);
  agent.Execute(stop);
  auto e = fake_->WaitExit("job-a", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->attempt(), 2);
  EXPECT_EQ(e->signal(), SIGTERM);
  std::this_thread::sleep_for(300ms);
  auto left = agent.Running();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].attempt(), 3);
  agent.Stop();
}

// A launch that arrives while the agent drains its ranks (Stop waits for
// them) is refused and reported at once, not started and then SIGKILLed
// with no exit reported.
TEST_F(AgentTest, ALaunchWhileStoppingIsRefusedAndReported) {
  const std::string ready = dir_ + "/ready";
  Agent agent(Options({"/bin/sh", "-c", "trap '' TERM; touch " + ready + "; sleep 2"}));
  ASSERT_TRUE(agent.Start().ok());
  agent.Execute(Launch("job-d", 0));
  ASSERT_EQ(agent.Running().size(), 1u);
  for (int i = 0; i < 200 && access(ready.c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(access(ready.c_str(), F_OK), 0);  // SIGTERM is ignored from here on
  std::thread stopper([&] { agent.Stop(); });
  std::this_thread::sleep_for(300ms);  // Stop() is waiting for rank 0
  agent.Execute(Launch("job-d", 1));
  auto e = fake_->WaitExit("job-d", 1, 5s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 127);
  EXPECT_NE(e->message().find("agent is stopping"), std::string::npos) << e->message();
  stopper.join();
}

TEST_F(AgentTest, NewAttemptReplacesOldOne) {
  Agent agent(Options({"/bin/sh", "-c", "sleep 100"}));
  ASSERT_TRUE(agent.Start().ok());
  agent.Execute(Launch("job-n", 0));
  auto first = agent.Running();
  ASSERT_EQ(first.size(), 1u);
  agent.Execute(Launch("job-n", 0));  // same attempt: ignored
  ASSERT_EQ(agent.Running().size(), 1u);
  EXPECT_EQ(agent.Running()[0].pid(), first[0].pid());
  auto next = Launch("job-n", 0);
  next.mutable_launch()->set_attempt(1);
  agent.Execute(next);
  auto now = agent.Running();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].attempt(), 1);
  EXPECT_NE(now[0].pid(), first[0].pid());
  EXPECT_FALSE(ProcessAlive(first[0].pid()));
  auto e = fake_->WaitExit("job-n", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->attempt(), 0);
  EXPECT_EQ(e->signal(), SIGKILL);
  agent.Stop();
}

TEST_F(AgentTest, AgentStopStopsItsRanks) {
  Agent agent(Options({"/bin/sh", "-c", "sleep 100"}));
  ASSERT_TRUE(agent.Start().ok());
  agent.Execute(Launch("job-a", 0));
  auto running = agent.Running();
  ASSERT_EQ(running.size(), 1u);
  pid_t pid = running[0].pid();
  auto t0 = std::chrono::steady_clock::now();
  agent.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 7s);
  EXPECT_FALSE(ProcessAlive(pid));
}

// The first rank exit among the messages `fake` received, after it has
// checked that AgentLeaving came before it; nullopt (with a failure) when
// either is missing or out of order.
std::optional<v1::RankExited> ExitAfterLeaving(FakeCoordinator* fake) {
  // Stop() does not wait for the fake server's reader: wait for the exit.
  EXPECT_TRUE(fake->WaitFor([](const v1::AgentMessage& m) { return m.has_rank_exited(); }, 5s));
  const auto ms = fake->Received();
  auto first = [&](auto pred) {
    for (size_t i = 0; i < ms.size(); ++i) {
      if (pred(ms[i])) return static_cast<int>(i);
    }
    return -1;
  };
  const int leaving = first([](const v1::AgentMessage& m) { return m.has_leaving(); });
  const int exit = first([](const v1::AgentMessage& m) { return m.has_rank_exited(); });
  EXPECT_GE(leaving, 0) << "no AgentLeaving";
  EXPECT_GE(exit, 0) << "no RankExited";
  EXPECT_LT(leaving, exit) << "the exit came before AgentLeaving";
  if (leaving < 0 || exit < 0 || leaving > exit) return std::nullopt;
  return ms[exit].rank_exited();
}

// A stopping agent says so (AgentLeaving) before it reports the ends of the
// ranks it stops, and marks those reports: the coordinator must not launch a
// restart back onto an agent about to go.
TEST_F(AgentTest, AStoppingAgentSaysSoBeforeItsRanksExits) {
  Agent agent(Options({"/bin/sh", "-c", "sleep 100"}));
  pid_t pid = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithOneRank(&agent, &pid));
  agent.Stop();
  auto e = ExitAfterLeaving(fake_.get());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->agent_leaving());
  EXPECT_EQ(e->signal(), SIGTERM);
}

// Slurm ending a step, or systemd stopping the service, signals the ranks
// and the agent at once; the rank may die first. Its report waits for the
// agent's own stop (up to 1 s), so it still follows AgentLeaving.
TEST_F(AgentTest, ARankKilledAlongWithItsAgentIsReportedAfterTheLeaving) {
  Agent agent(Options({"/bin/sh", "-c", "sleep 100"}));
  pid_t pid = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithOneRank(&agent, &pid));
  ASSERT_EQ(kill(-pid, SIGTERM), 0);
  std::this_thread::sleep_for(300ms);  // reaped (every 50 ms), its report held
  agent.Stop();
  auto e = ExitAfterLeaving(fake_.get());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->agent_leaving());
}

// The same for a rank that catches SIGTERM and exits 5, as dgca-worker
// rank does (kExitStopped): its report waits for the agent's stop too.
TEST_F(AgentTest, ARankThatExitsStoppedAlongWithItsAgentIsReportedAfterTheLeaving) {
  Agent agent(Options({"/bin/sh", "-c", "trap 'exit 5' TERM; sleep 100 & wait"}));
  pid_t pid = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithOneRank(&agent, &pid));
  std::this_thread::sleep_for(200ms);  // the trap is set
  ASSERT_EQ(kill(-pid, SIGTERM), 0);
  std::this_thread::sleep_for(300ms);  // reaped (every 50 ms), its report held
  agent.Stop();
  auto e = ExitAfterLeaving(fake_.get());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 5);
  EXPECT_TRUE(e->agent_leaving());
}

// Without a stop of the agent the held report still goes, unmarked.
TEST_F(AgentTest, ARankKilledFromOutsideIsReportedWithinASecondOrSo) {
  Agent agent(Options({"/bin/sh", "-c", "sleep 100"}));
  pid_t pid = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithOneRank(&agent, &pid));
  ASSERT_EQ(kill(-pid, SIGKILL), 0);
  auto e = fake_->WaitExit("job-a", 0, 5s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->signal(), SIGKILL);
  EXPECT_FALSE(e->agent_leaving());
  agent.Stop();
}

// The coordinator goes away and comes back on the same port: the agent
// reconnects and re-registers with the rank it still supervises; an exit that
// happened while disconnected is delivered after the reconnect.
TEST_F(AgentTest, ReconnectsAndReportsRunningRanks) {
  Agent agent(Options({"/bin/sh", "-c", "sleep {rank}"}));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_register_(); }));
  agent.Execute(Launch("job-r", 30));  // sleeps 30 s
  agent.Execute(Launch("job-r", 1));   // exits after 1 s, while disconnected
  int port = port_;
  StopServer();
  std::this_thread::sleep_for(1500ms);
  StartServer(port);
  ASSERT_EQ(port_, port);
  auto reg = fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_register_(); }, 15s);
  ASSERT_TRUE(reg.has_value());
  ASSERT_EQ(reg->register_().running_size(), 1);
  EXPECT_EQ(reg->register_().running(0).job_id(), "job-r");
  EXPECT_EQ(reg->register_().running(0).rank(), 30);
  auto e = fake_->WaitExit("job-r", 1);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 0);
  agent.Stop();
  EXPECT_TRUE(agent.Running().empty());
}


// Starts `script` under /bin/sh as an orphan (its parent exits at once, as a
// rank's agent does when a coordinator is killed with -9) in its own process
// group, with `env_entry` (e.g. DGCA_RANK_ID=J/R/A) and PATH as its whole
// environment. Returns its pid.
pid_t SpawnOrphan(const std::string& script, const std::string& env_entry) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t middle = fork();
  if (middle == 0) {
    pid_t rank = fork();
    if (rank == 0) {
      setpgid(0, 0);
      close(fds[0]);
      close(fds[1]);
      std::string path = "PATH=/usr/bin:/bin";
      char* const argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"),
                            const_cast<char*>(script.c_str()), nullptr};
      char* const envp[] = {const_cast<char*>(env_entry.c_str()), path.data(), nullptr};
      execve("/bin/sh", argv, envp);
      _exit(127);
    }
    (void)!write(fds[1], &rank, sizeof(rank));
    _exit(0);
  }
  close(fds[1]);
  pid_t rank = -1;
  if (read(fds[0], &rank, sizeof(rank)) != sizeof(rank)) rank = -1;
  close(fds[0]);
  waitpid(middle, nullptr, 0);
  // Until the exec, /proc/PID/environ is the forked copy: wait for the entry.
  for (int i = 0; i < 250 && rank > 0 && !ProcessEnvironHas(rank, env_entry); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  return rank;
}

AgentOptions::AdoptRank Adoptee(const std::string& node, const std::string& job, int rank,
                                int attempt, pid_t pid) {
  AgentOptions::AdoptRank a;
  a.node = node;
  a.rank.set_job_id(job);
  a.rank.set_rank(rank);
  a.rank.set_attempt(attempt);
  a.rank.set_pid(pid);
  return a;
}

// A rank launched by an earlier agent (now dead) is adopted: listed in the
// registration and Running(), and when it ends its exit record's code is
// reported. Entries of other nodes are ignored.
TEST_F(AgentTest, AdoptsARankAndReportsItsRecordedExitCode) {
  const std::string job_dir = dir_ + "/jobs/job-ad";
  ASSERT_EQ(system(("mkdir -p " + job_dir).c_str()), 0);
  // As a rank does: output to its log, the exit record last (once the test
  // says so, after the agent has adopted it).
  const std::string go = dir_ + "/go";
  pid_t pid = SpawnOrphan("exec >> " + job_dir + "/rank-0.log 2>&1; echo training; "
                          "while [ ! -e " + go + " ]; do sleep 0.02; done; "
                          "echo 'attempt 3 code 7' > " + ExitRecordPath(job_dir, 0),
                          RankIdEntry("job-ad", 0, 3));
  ASSERT_GT(pid, 0);
  // A rank being adopted has been running: its log exists (the agent's
  // "adopted" line was once lost to a shell that had not opened it yet).
  for (int i = 0; i < 500 && ReadFile(job_dir + "/rank-0.log").find("training") == std::string::npos; ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_NE(ReadFile(job_dir + "/rank-0.log").find("training"), std::string::npos);
  AgentOptions o = Options({});
  o.adopt = {Adoptee("test-node", "job-ad", 0, 3, pid),
             Adoptee("other-node", "job-other", 0, 0, pid)};
  Agent agent(o);
  ASSERT_TRUE(agent.Start().ok());
  auto running = agent.Running();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].pid(), pid);
  EXPECT_EQ(running[0].attempt(), 3);
  auto reg = fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_register_(); });
  ASSERT_TRUE(reg.has_value());
  ASSERT_EQ(reg->register_().running_size(), 1);
  EXPECT_EQ(reg->register_().running(0).job_id(), "job-ad");
  EXPECT_EQ(reg->register_().running(0).pid(), pid);
  std::ofstream(go) << "go\n";
  auto e = fake_->WaitExit("job-ad", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code(), 7);
  EXPECT_EQ(e->signal(), 0);
  EXPECT_FALSE(e->status_unknown());
  EXPECT_EQ(e->attempt(), 3);
  EXPECT_FALSE(fake_->WaitExit("job-other", 0, 200ms).has_value());
  const std::string log = ReadFile(job_dir + "/rank-0.log");
  EXPECT_NE(log.find("adopted rank 0 (pid " + std::to_string(pid) + ", attempt 3)"),
            std::string::npos) << log;
  EXPECT_NE(log.find("exited with code 7 (adopted; from its exit record)"), std::string::npos)
      << log;
  EXPECT_TRUE(agent.Running().empty());
  agent.Stop();
}

// An adopted rank killed by a signal leaves no exit record: reported with
// status_unknown (not as a clean exit, not as an invented signal).
TEST_F(AgentTest, AnAdoptedRankKilledBySignalHasUnknownStatus) {
  const std::string job_dir = dir_ + "/jobs/job-k";
  ASSERT_EQ(system(("mkdir -p " + job_dir).c_str()), 0);
  pid_t pid = SpawnOrphan("exec >> " + job_dir + "/rank-1.log 2>&1; echo training; sleep 100",
                          RankIdEntry("job-k", 1, 0));
  ASSERT_GT(pid, 0);
  AgentOptions o = Options({});
  o.adopt = {Adoptee("test-node", "job-k", 1, 0, pid)};
  Agent agent(o);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_EQ(agent.Running().size(), 1u);
  kill(-pid, SIGKILL);
  auto e = fake_->WaitExit("job-k", 1);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->status_unknown());
  EXPECT_EQ(e->exit_code(), -1);
  EXPECT_EQ(e->signal(), 0);
  // The log's tail, with the agent's line last.
  EXPECT_NE(e->message().find("[agent test-node] rank 1 (pid " + std::to_string(pid) +
                              ") ended without an exit record (adopted, so no wait status"),
            std::string::npos)
      << e->message();
  agent.Stop();
}

// Only the process that carries the rank's own DGCA_RANK_ID is adopted: a
// pid now used by something else (here: another attempt's id), or a pid
// never known (0), is reported gone at once and left alone.
TEST_F(AgentTest, DoesNotAdoptAPidThatIsNotTheRank) {
  pid_t other = SpawnOrphan("sleep 100", RankIdEntry("job-p", 0, 2));
  ASSERT_GT(other, 0);
  AgentOptions o = Options({});
  o.adopt = {Adoptee("test-node", "job-p", 0, 3, other), Adoptee("test-node", "job-p", 1, 3, 0)};
  Agent agent(o);
  ASSERT_TRUE(agent.Start().ok());
  EXPECT_TRUE(agent.Running().empty());
  for (int rank : {0, 1}) {
    auto e = fake_->WaitExit("job-p", rank);
    ASSERT_TRUE(e.has_value()) << rank;
    EXPECT_TRUE(e->status_unknown()) << rank;
    EXPECT_EQ(e->attempt(), 3);
  }
  agent.Stop();
  EXPECT_TRUE(ProcessAlive(other));  // not ours: not stopped
  kill(-other, SIGKILL);
}

// A rank whose pid the coordinator never recorded (0) is found by its
// DGCA_RANK_ID and adopted.
TEST_F(AgentTest, AdoptsARankWhosePidWasNeverRecorded) {
  pid_t pid = SpawnOrphan("sleep 100", RankIdEntry("job-z", 1, 2));
  ASSERT_GT(pid, 0);
  AgentOptions o = Options({});
  o.adopt = {Adoptee("test-node", "job-z", 1, 2, 0)};
  Agent agent(o);
  ASSERT_TRUE(agent.Start().ok());
  auto running = agent.Running();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].pid(), pid);
  agent.Stop();  // stops it, as it stops its own ranks
  EXPECT_FALSE(ProcessAlive(pid));
}

// Exit reports are sent again after every registration: a coordinator that
// restarted after the agent wrote an exit, but before it handled it, still
// learns it.
TEST_F(AgentTest, SendsRecentExitsAgainAfterReconnecting) {
  Agent agent(Options({"/bin/sh", "-c", "exit {rank}"}));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(fake_->WaitFor([](const v1::AgentMessage& m) { return m.has_register_(); }));
  agent.Execute(Launch("job-re", 0));
  agent.Execute(Launch("job-re", 3));
  ASSERT_TRUE(fake_->WaitExit("job-re", 0).has_value());
  ASSERT_TRUE(fake_->WaitExit("job-re", 3).has_value());
  int port = port_;
  StopServer();
  StartServer(port);
  ASSERT_EQ(port_, port);
  auto e0 = fake_->WaitExit("job-re", 0, 15s);
  auto e3 = fake_->WaitExit("job-re", 3, 15s);
  ASSERT_TRUE(e0.has_value());
  ASSERT_TRUE(e3.has_value());
  EXPECT_EQ(e0->exit_code(), 0);
  EXPECT_EQ(e3->exit_code(), 3);
  agent.Stop();
}

// StopRanks reaches an adopted rank (its process group), and its end is
// reported.
TEST_F(AgentTest, StopsAnAdoptedRank) {
  pid_t pid = SpawnOrphan("sleep 100", RankIdEntry("job-st", 0, 1));
  ASSERT_GT(pid, 0);
  AgentOptions o = Options({});
  o.adopt = {Adoptee("test-node", "job-st", 0, 1, pid)};
  Agent agent(o);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_EQ(agent.Running().size(), 1u);
  v1::CoordinatorCommand stop;
  stop.mutable_stop()->set_job_id("job-st");
  stop.mutable_stop()->set_grace_seconds(5);
  auto t0 = std::chrono::steady_clock::now();
  agent.Execute(stop);
  auto e = fake_->WaitExit("job-st", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);  // SIGTERM, not the grace's SIGKILL
  EXPECT_TRUE(e->status_unknown());
  EXPECT_FALSE(ProcessAlive(pid));
  agent.Stop();
}

// AdoptRanks (an agent restarted while its ranks trained on): a rank still
// running is supervised again; one that ended meanwhile is reported with
// the code its exit record holds; one already supervised is left alone.
TEST_F(AgentTest, AdoptRanksCommandSupervisesOrReports) {
  pid_t pid = SpawnOrphan("sleep 100", RankIdEntry("job-ad", 0, 2));
  ASSERT_GT(pid, 0);
  const std::string job_dir = dir_ + "/jobs/job-ad";
  ASSERT_EQ(system(("mkdir -p " + job_dir).c_str()), 0);
  ASSERT_TRUE(WriteExitRecord(ExitRecordPath(job_dir, 1), 2, 0).ok());  // rank 1 finished
  Agent agent(Options({}));
  ASSERT_TRUE(agent.Start().ok());
  for (int i = 0; i < 500 && !agent.connected(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(agent.connected());
  v1::CoordinatorCommand adopt;
  for (int r : {0, 1}) {
    v1::RunningRank* a = adopt.mutable_adopt()->add_ranks();
    a->set_job_id("job-ad");
    a->set_rank(r);
    a->set_attempt(2);
    a->set_pid(r == 0 ? pid : 0);
  }
  agent.Execute(adopt);
  auto running = agent.Running();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].pid(), pid);
  auto done = fake_->WaitExit("job-ad", 1);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->exit_code(), 0);
  EXPECT_FALSE(done->status_unknown());
  agent.Execute(adopt);  // again: rank 0 is supervised already
  EXPECT_EQ(agent.Running().size(), 1u);
  kill(pid, SIGKILL);
  auto gone = fake_->WaitExit("job-ad", 0);
  ASSERT_TRUE(gone.has_value());
  EXPECT_TRUE(gone->status_unknown());
  agent.Stop();
}

// A launched rank carries what a later agent adopts it by, and a stale exit
// record of an earlier attempt is removed before it starts.
TEST_F(AgentTest, LaunchSetsTheRankIdAndExitFile) {
  const std::string job_dir = dir_ + "/jobs/job-id";
  ASSERT_EQ(system(("mkdir -p " + job_dir).c_str()), 0);
  ASSERT_TRUE(WriteExitRecord(ExitRecordPath(job_dir, 2), 4, 9).ok());
  Agent agent(Options({"/bin/sh", "-c",
                       "test -e \"$DGCA_EXIT_FILE\" && echo stale; "
                       "echo \"id=$DGCA_RANK_ID exit=$DGCA_EXIT_FILE\""}));
  ASSERT_TRUE(agent.Start().ok());
  auto cmd = Launch("job-id", 2);
  cmd.mutable_launch()->set_attempt(4);
  (*cmd.mutable_launch()->mutable_env())["DGCA_RANK_ID"] = "forged/0/0";
  agent.Execute(cmd);
  ASSERT_TRUE(fake_->WaitExit("job-id", 2).has_value());
  const std::string log = ReadFile(job_dir + "/rank-2.log");
  EXPECT_NE(log.find("id=job-id/2/4 exit=" + job_dir + "/rank-2.exit"), std::string::npos) << log;
  EXPECT_EQ(log.find("stale"), std::string::npos) << log;
  agent.Stop();
}

// The files the rank would read are checked on the agent's node before it
// starts: a missing one fails the launch, every such file named with its
// place in the spec, and no rank process runs (the stand-in would write
// its marker file).
TEST_F(AgentTest, ALaunchWhoseInputFilesAreMissingStartsNoRank) {
  const std::string marker = dir_ + "/rank-ran";
  Agent agent(Options({"/bin/sh", "-c", "touch " + marker}));
  ASSERT_TRUE(agent.Start().ok());
  auto cmd = Launch("job-files", 0);
  const std::string present = dir_ + "/train.txt";
  { std::ofstream(present) << "a\ta\n"; }
  auto input = [&](const std::string& field, const std::string& written, int line) {
    v1::InputFile* f = cmd.mutable_launch()->add_inputs();
    f->set_field(field);
    f->set_written(written);
    f->set_path(dir_ + "/" + written);
    f->set_base_dir(dir_);
    f->set_spec_file("job.yaml");
    f->set_line(line);
    f->set_column(10);
    f->set_kind("data");
  };
  input("data.train", "train.txt", 4);
  input("data.eval", "eval.txt", 5);
  input("model.vocab", "vocab.txt", 6);
  cmd.mutable_launch()->mutable_inputs(2)->set_kind("vocab");
  agent.Execute(cmd);
  auto e = fake_->WaitExit("job-files", 0);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->inputs_missing());
  EXPECT_EQ(e->exit_code(), 2);
  EXPECT_EQ(e->message().rfind("2 input files of the job cannot be read on node test-node by its "
                               "agent:\njob.yaml:5:10: data.eval: " + dir_ + "/eval.txt: does not exist",
                               0),
            0u)
      << e->message();
  EXPECT_NE(e->message().find("\njob.yaml:6:10: model.vocab: " + dir_ + "/vocab.txt: does not exist"),
            std::string::npos)
      << e->message();
  EXPECT_EQ(e->message().find("data.train"), std::string::npos) << e->message();
  // Said in the rank's log too, where `dgca logs` looks.
  EXPECT_NE(ReadFile(dir_ + "/jobs/job-files/rank-0.log").find("not starting job job-files rank 0"),
            std::string::npos);
  std::this_thread::sleep_for(200ms);
  struct stat st;
  EXPECT_NE(stat(marker.c_str(), &st), 0) << "the rank was started";
  EXPECT_TRUE(agent.Running().empty());

  // With the files there, the rank starts.
  { std::ofstream(dir_ + "/eval.txt") << "a\ta\n"; }
  { std::ofstream(dir_ + "/vocab.txt") << "[PAD]\n"; }
  cmd.mutable_launch()->set_attempt(1);
  agent.Execute(cmd);
  auto ok = fake_->WaitFor([](const v1::AgentMessage& m) {
    return m.has_rank_exited() && m.rank_exited().attempt() == 1;
  });
  ASSERT_TRUE(ok.has_value());
  EXPECT_FALSE(ok->rank_exited().inputs_missing());
  EXPECT_EQ(ok->rank_exited().exit_code(), 0);
  EXPECT_EQ(stat(marker.c_str(), &st), 0);
  agent.Stop();
}

}  // namespace
}  // namespace dgca
