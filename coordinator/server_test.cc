// CoordinatorServer over real gRPC on loopback, with the test acting as a
// node agent on the real AgentService stream and as ranks on RankService.
#include "coordinator/server.h"

#include <algorithm>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/job_store.h"
#include "spec/spec.h"
#include "dgca/v1/agent.grpc.pb.h"
#include "dgca/v1/coordinator.grpc.pb.h"
#include "dgca/v1/rank.grpc.pb.h"
#include "model/core/core_test_util.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string TempDir() {
  const std::string d = testutil::MakeTempDir("dgca-server-test");
  return d.empty() ? "/tmp" : d;
}

bool WaitUntil(const std::function<bool()>& pred, milliseconds timeout = milliseconds(10000)) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return pred();
}

// One thread per rank: several such jobs run at once on the fake agent's 8
// CPUs (a plan left to choose takes them all, and CPU admission would queue
// the next job behind it: placement.h CpuPlanFits).
std::string Spec(int max_restarts = 0, int ranks = 2) {
  return "name: t\ntrain: {steps: 10, max_restarts: " + std::to_string(max_restarts) +
         "}\nresources: {ranks: " + std::to_string(ranks) + ", device: cpu, threads_per_rank: 1}\n";
}

// The test as a node agent on the real stream.
class FakeAgent {
 public:
  // `running`: ranks it registers with (as an agent that outlived a
  // coordinator restart); a stop of their job makes them exit too.
  // `gpus`: H100s (80 GiB, sm_90) the node reports, for CUDA plans.
  // `memory_bytes`: the node's memory (CPU plans fill their share of it, and
  // CPU admission queues the jobs whose predicted memory would not fit).
  FakeAgent(const std::string& address, const std::string& token, const std::string& node,
            bool auto_exit_on_stop = true, const std::vector<v1::RunningRank>& running = {},
            int gpus = 0, uint64_t memory_bytes = 16ull << 30)
      : node_(node), auto_exit_(auto_exit_on_stop) {
    stub_ = v1::AgentService::NewStub(MakeChannel(address));
    AddAuth(&ctx_, token);
    stream_ = stub_->Connect(&ctx_);
    v1::AgentMessage m;
    m.mutable_register_()->set_node(node);
    for (const auto& r : running) {
      *m.mutable_register_()->add_running() = r;
      v1::LaunchRank l;
      l.set_job_id(r.job_id());
      l.set_rank(r.rank());
      l.set_attempt(r.attempt());
      running_.push_back(l);
    }
    m.mutable_register_()->mutable_topology()->set_node(node);
    m.mutable_register_()->mutable_topology()->set_hostname(node);
    m.mutable_register_()->mutable_topology()->set_cpu_count(8);
    m.mutable_register_()->mutable_topology()->set_memory_bytes(memory_bytes);
    for (int i = 0; i < gpus; ++i) {
      v1::Gpu* g = m.mutable_register_()->mutable_topology()->add_gpus();
      g->set_index(i);
      g->set_name("NVIDIA H100 80GB HBM3");
      g->set_memory_bytes(80ull << 30);
      g->set_compute_capability_major(9);
      g->set_compute_capability_minor(0);
    }
    Write(m);
    reader_ = std::thread([this] { Read(); });
  }
  ~FakeAgent() {
    {
      std::lock_guard<std::mutex> l(wmu_);
      stream_->WritesDone();
    }
    ctx_.TryCancel();
    reader_.join();
  }
  void Write(const v1::AgentMessage& m) {
    std::lock_guard<std::mutex> l(wmu_);
    stream_->Write(m);
  }
  void Exit(const std::string& job, int rank, int attempt, int code, int sig = 0,
            const std::string& msg = "") {
    v1::AgentMessage m;
    auto* e = m.mutable_rank_exited();
    e->set_job_id(job);
    e->set_rank(rank);
    e->set_attempt(attempt);
    e->set_exit_code(code);
    e->set_signal(sig);
    e->set_message(msg);
    Write(m);
  }
  // An adopted rank that ended without an exit record.
  void ExitUnknown(const std::string& job, int rank, int attempt) {
    v1::AgentMessage m;
    auto* e = m.mutable_rank_exited();
    e->set_job_id(job);
    e->set_rank(rank);
    e->set_attempt(attempt);
    e->set_exit_code(-1);
    e->set_status_unknown(true);
    Write(m);
  }
  void HeartbeatWith(const std::string& job, int rank, int attempt, int pid) {
    v1::AgentMessage m;
    auto* r = m.mutable_heartbeat()->add_running();
    r->set_job_id(job);
    r->set_rank(rank);
    r->set_attempt(attempt);
    r->set_pid(pid);
    Write(m);
  }
  std::vector<v1::LaunchRank> Launches(const std::string& job, int attempt) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<v1::LaunchRank> out;
    for (const auto& c : cmds_) {
      if (c.has_launch() && c.launch().job_id() == job && c.launch().attempt() == attempt) {
        out.push_back(c.launch());
      }
    }
    return out;
  }
  // The ranks of `job` the coordinator asked this agent to adopt.
  std::vector<v1::RunningRank> Adopts(const std::string& job) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<v1::RunningRank> out;
    for (const auto& c : cmds_) {
      if (!c.has_adopt()) continue;
      for (const auto& r : c.adopt().ranks()) {
        if (r.job_id() == job) out.push_back(r);
      }
    }
    return out;
  }
  int Stops(const std::string& job) {
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    for (const auto& c : cmds_) n += c.has_stop() && c.stop().job_id() == job;
    return n;
  }

 private:
  void Read() {
    v1::CoordinatorCommand c;
    while (stream_->Read(&c)) {
      std::vector<v1::LaunchRank> to_exit;
      {
        std::lock_guard<std::mutex> l(mu_);
        cmds_.push_back(c);
        if (c.has_launch()) running_.push_back(c.launch());
        if (c.has_stop() && auto_exit_) {
          // As the real agent: only the stop's attempts (none listed: all),
          // so a stop of a stale attempt sent after the next one's launch
          // leaves the new ranks alone.
          const auto& attempts = c.stop().attempts();
          auto stopped = [&](int attempt) {
            return attempts.empty() ||
                   std::find(attempts.begin(), attempts.end(), attempt) != attempts.end();
          };
          for (auto it = running_.begin(); it != running_.end();) {
            if (it->job_id() == c.stop().job_id() && stopped(it->attempt())) {
              to_exit.push_back(*it);
              it = running_.erase(it);
            } else {
              ++it;
            }
          }
        }
      }
      for (const auto& l : to_exit) Exit(l.job_id(), l.rank(), l.attempt(), -1, SIGTERM);
    }
  }

  std::string node_;
  bool auto_exit_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorCommand>> stream_;
  std::mutex wmu_;
  std::mutex mu_;
  std::vector<v1::CoordinatorCommand> cmds_;
  std::vector<v1::LaunchRank> running_;
  std::thread reader_;
};

class ServerTest : public ::testing::Test {
 protected:
  void StartServer(double heartbeat_timeout_s = 30, double restart_node_wait_s = 300) {
    CoordinatorServerOptions o;
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "";
    o.state_dir = dir_;
    o.local_agent = false;
    o.heartbeat_timeout_s = heartbeat_timeout_s;
    o.restart_node_wait_s = restart_node_wait_s;
    o.stop_grace_s = 0.5;
    auto s = CoordinatorServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    channel_ = MakeChannel(server_->address());
    coord_ = v1::Coordinator::NewStub(channel_);
    rank_ = v1::RankService::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }
  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = "") {
    auto c = std::make_unique<grpc::ClientContext>();
    AddAuth(c.get(), token.empty() ? server_->token() : token);
    c->set_deadline(std::chrono::system_clock::now() + seconds(20));
    return c;
  }
  std::string Submit(const std::string& yaml) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    req.set_spec_path("job.yaml");
    v1::SubmitJobResponse resp;
    auto ctx = Ctx();
    grpc::Status s = coord_->SubmitJob(ctx.get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job_id();
  }
  // Submits a 2-rank job with max_restarts 1 on node n1, kills rank 0 and
  // takes n1's agent away before rank 1 reports: the restart comes due with
  // its node gone. Returns the job id.
  std::string LoseANodeWithARestartDue() {
    FakeAgent agent(server_->address(), server_->agent_token(), "n1", /*auto_exit_on_stop=*/false);
    const std::string id = Submit(Spec(1));
    EXPECT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
    agent.Exit(id, 0, 0, -1, SIGKILL);
    EXPECT_TRUE(WaitUntil([&] { return agent.Stops(id) >= 1; }));
    return id;
  }
  v1::GetJobResponse Get(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    auto ctx = Ctx();
    grpc::Status s = coord_->GetJob(ctx.get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  v1::JobState State(const std::string& id) { return Get(id).job().state(); }
  // The job's event messages (of `kind` only, when given), one per line.
  std::string EventText(const std::string& id, const std::string& kind = "") {
    std::string text;
    const v1::GetJobResponse j = Get(id);
    for (const auto& e : j.events())
      if (kind.empty() || e.kind() == kind) text += e.message() + "\n";
    return text;
  }
  // The reason of decision `name` in PlanJob's plan of `spec_yaml`.
  std::string PlanReason(const std::string& spec_yaml, const std::string& name) {
    auto ctx = Ctx();
    v1::PlanJobRequest req;
    req.set_spec_yaml(spec_yaml);
    v1::PlanJobResponse resp;
    EXPECT_TRUE(coord_->PlanJob(ctx.get(), req, &resp).ok());
    for (const auto& d : resp.plan().decisions())
      if (d.name() == name) return d.reason();
    return "(no " + name + " decision)";
  }
  bool WaitState(const std::string& id, v1::JobState st, milliseconds t = milliseconds(10000)) {
    return WaitUntil([&] { return State(id) == st; }, t);
  }

  std::string dir_ = TempDir();
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> coord_;
  std::unique_ptr<v1::RankService::Stub> rank_;
};

TEST_F(ServerTest, TokenRequiredOnEveryService) {
  StartServer();
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  for (const std::string& token : {std::string("wrong"), std::string("none")}) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (token != "none") AddAuth(ctx.get(), token);
    v1::ListJobsResponse resp;
    EXPECT_EQ(coord_->ListJobs(ctx.get(), v1::ListJobsRequest(), &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    AddAuth(&ctx, "wrong");
    v1::RankHeartbeatResponse resp;
    EXPECT_EQ(rank_->Heartbeat(&ctx, v1::RankHeartbeatRequest(), &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    auto stub = v1::AgentService::NewStub(channel_);
    grpc::ClientContext ctx;
    auto stream = stub->Connect(&ctx);
    v1::AgentMessage m;
    m.mutable_register_()->set_node("x");
    stream->Write(m);
    stream->WritesDone();
    v1::CoordinatorCommand c;
    EXPECT_FALSE(stream->Read(&c));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  auto ctx = Ctx();
  v1::ListJobsResponse resp;
  EXPECT_TRUE(coord_->ListJobs(ctx.get(), v1::ListJobsRequest(), &resp).ok());
  // One coordinator per state dir.
  CoordinatorServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.state_dir = dir_;
  o.local_agent = false;
  auto second = CoordinatorServer::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("another dgca-coordinator"), std::string::npos);
  // coordinator.json names the bound address.
  std::ifstream in(dir_ + "/coordinator.json");
  std::string json((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(json.find("\"listen\": \"" + server_->address() + "\""), std::string::npos) << json;
}

// Three roles (coordinator/credentials.h), each refused outside its
// service: the user token is not a rank's or an agent's, the agent token
// not the user's, and a rank token speaks for its own job and attempt only.
TEST_F(ServerTest, EachTokenIsRefusedOutsideItsRole) {
  StartServer();
  for (const char* f : {"/agent-token", "/rank-key"}) {
    struct stat st;
    ASSERT_EQ(stat((dir_ + f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0600) << f;
  }
  EXPECT_NE(server_->agent_token(), server_->token());
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", /*auto_exit_on_stop=*/false);
  const std::string id = Submit(Spec());
  const std::string other = Submit(Spec());
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  // Each launch carries the rank token of its job and attempt.
  for (const auto& l : agent.Launches(id, 0)) EXPECT_EQ(l.rank_token(), server_->RankToken(id, 0));
  const std::string rank_token = server_->RankToken(id, 0);

  auto code_and_message = [](const grpc::Status& st) {
    return std::make_pair(st.error_code(), st.error_message());
  };
  {  // the agent's and a rank's tokens on the CLI's service
    for (const std::string& t : {server_->agent_token(), rank_token}) {
      auto ctx = Ctx(t);
      v1::ListJobsResponse resp;
      auto [code, msg] = code_and_message(coord_->ListJobs(ctx.get(), v1::ListJobsRequest(), &resp));
      EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED) << msg;
      EXPECT_NE(msg.find("this call takes the user token (the coordinator's STATE_DIR/token"),
                std::string::npos) << msg;
    }
  }
  {  // the user's and a rank's tokens on the agents' service
    for (const std::string& t : {server_->token(), rank_token}) {
      auto stub = v1::AgentService::NewStub(channel_);
      grpc::ClientContext ctx;
      AddAuth(&ctx, t);
      auto stream = stub->Connect(&ctx);
      v1::AgentMessage m;
      m.mutable_register_()->set_node("intruder");
      stream->Write(m);
      stream->WritesDone();
      v1::CoordinatorCommand c;
      EXPECT_FALSE(stream->Read(&c));
      auto [code, msg] = code_and_message(stream->Finish());
      EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED) << msg;
      EXPECT_NE(msg.find("STATE_DIR/agent-token"), std::string::npos) << msg;
    }
  }
  v1::RankHeartbeatRequest hb;
  hb.set_job_id(id);
  hb.set_rank(0);
  v1::RankHeartbeatResponse hr;
  {  // the user's and the agent's tokens on the ranks' service
    for (const std::string& t : {server_->token(), server_->agent_token()}) {
      auto ctx = Ctx(t);
      auto [code, msg] = code_and_message(rank_->Heartbeat(ctx.get(), hb, &hr));
      EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED) << msg;
      EXPECT_NE(msg.find("this call takes a rank token"), std::string::npos) << msg;
    }
  }
  {  // the rank token itself: its job and attempt only
    auto ctx = Ctx(rank_token);
    EXPECT_TRUE(rank_->Heartbeat(ctx.get(), hb, &hr).ok());
    for (const auto& [job, attempt] : {std::make_pair(other, 0), std::make_pair(id, 1)}) {
      v1::RankHeartbeatRequest h = hb;
      h.set_job_id(job);
      h.set_attempt(attempt);
      auto c = Ctx(rank_token);
      auto [code, msg] = code_and_message(rank_->Heartbeat(c.get(), h, &hr));
      EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED) << msg;
      EXPECT_NE(msg.find("the rank token of job " + id + " attempt 0 speaks only for that job and "
                         "attempt, not for job " + job + " attempt " + std::to_string(attempt)),
                std::string::npos) << msg;
    }
  }
  {  // a forged MAC, and a token another coordinator would mint
    std::string forged = rank_token;
    forged.back() = forged.back() == '0' ? '1' : '0';
    Credentials elsewhere("u", "a", "another key");
    for (const std::string& t : {forged, elsewhere.RankToken(id, 0)}) {
      auto ctx = Ctx(t);
      EXPECT_EQ(rank_->Heartbeat(ctx.get(), hb, &hr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
  }
  {  // metrics for another job on a rank token's stream end it
    auto ctx = Ctx(rank_token);
    v1::StreamMetricsResponse resp;
    auto w = rank_->StreamMetrics(ctx.get(), &resp);
    v1::MetricSample sample;
    sample.mutable_step()->set_job_id(other);
    sample.mutable_step()->set_step(1);
    w->Write(sample);
    w->WritesDone();
    auto [code, msg] = code_and_message(w->Finish());
    EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED) << msg;
    EXPECT_EQ(Get(other).job().step(), 0);
  }
  {  // an eval (no attempt of its own) on the token of an attempt the job
     // is not at is dropped; on the current attempt's it counts
    auto eval_on = [&](int attempt, double f1) {
      auto ctx = Ctx(server_->RankToken(id, attempt));
      v1::StreamMetricsResponse resp;
      auto w = rank_->StreamMetrics(ctx.get(), &resp);
      v1::MetricSample e;
      e.mutable_eval()->set_job_id(id);
      (*e.mutable_eval()->mutable_metrics())["sentence_correction_f1"] = f1;
      w->Write(e);
      w->WritesDone();
      EXPECT_TRUE(w->Finish().ok());
    };
    eval_on(3, 0.25);
    eval_on(0, 0.75);
    ASSERT_TRUE(WaitUntil([&] { return !EventText(id, "eval").empty(); }));
    const std::string evals = EventText(id, "eval");
    EXPECT_EQ(evals.find("0.25"), std::string::npos) << evals;
    EXPECT_NE(evals.find("0.75"), std::string::npos) << evals;
  }
  {  // a validly minted token of an attempt the job is not at: no store
    auto ctx = Ctx(server_->RankToken(id, 3));
    v1::StoreSetRequest set;
    set.set_job_id(id);
    set.set_attempt(3);
    set.set_key("k");
    v1::StoreSetResponse sr;
    auto [code, msg] = code_and_message(rank_->StoreSet(ctx.get(), set, &sr));
    EXPECT_EQ(code, grpc::StatusCode::FAILED_PRECONDITION) << msg;
    EXPECT_NE(msg.find("attempt 3 of job " + id + " is over (the job runs attempt 0)"),
              std::string::npos) << msg;
  }
}

// Issue 28's flood: anyone with the one token could open 4,095 rendezvous
// namespaces with made-up attempt numbers, and the next job's rendezvous
// failed RESOURCE_EXHAUSTED. A rank token of job A now opens none of job
// B's, nor another attempt of A's, and B's rendezvous works after it.
TEST_F(ServerTest, ARankTokenCannotFloodAnotherJobsRendezvous) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", /*auto_exit_on_stop=*/false,
                  {}, 0, 512ull << 30);
  const std::string attacker = Submit(Spec());
  const std::string victim = Submit(Spec());
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(victim, 0).size() == 2; }));
  const std::string token = server_->RankToken(attacker, 0);
  int refused = 0;
  for (int attempt = 0; attempt < 5000; ++attempt) {
    // Even attempts at the victim, odd ones (never its own 0) at the
    // attacker's job.
    const std::string job = attempt % 2 == 0 ? victim : attacker;
    auto ctx = Ctx(token);
    v1::StoreSetRequest set;
    set.set_job_id(job);
    set.set_attempt(attempt);
    set.set_key("k");
    set.set_value("v");
    v1::StoreSetResponse sr;
    if (rank_->StoreSet(ctx.get(), set, &sr).error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      ++refused;
    }
  }
  EXPECT_EQ(refused, 5000);
  // The victim's own ranks still meet.
  auto set_ctx = Ctx(server_->RankToken(victim, 0));
  v1::StoreSetRequest set;
  set.set_job_id(victim);
  set.set_key("addr0");
  set.set_value("127.0.0.1:1");
  v1::StoreSetResponse sr;
  grpc::Status st = rank_->StoreSet(set_ctx.get(), set, &sr);
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto get_ctx = Ctx(server_->RankToken(victim, 0));
  v1::StoreGetRequest g;
  g.set_job_id(victim);
  g.set_key("addr0");
  v1::StoreGetResponse gr;
  ASSERT_TRUE(rank_->StoreGet(get_ctx.get(), g, &gr).ok());
  EXPECT_EQ(gr.value(), "127.0.0.1:1");
}

TEST_F(ServerTest, InvalidSpecGivesProblems) {
  StartServer();
  v1::SubmitJobRequest req;
  req.set_spec_yaml("name: bad\nmodle: {}\ntrain:\n  steps: -5\n  global_batch: lots\n");
  req.set_spec_path("bad.yaml");
  v1::SubmitJobResponse resp;
  auto ctx = Ctx();
  grpc::Status s = coord_->SubmitJob(ctx.get(), req, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("bad.yaml:4:10: train.steps: must be >= 1"), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("bad.yaml:2:1: modle"), std::string::npos);
  v1::SubmitJobResponse details;
  ASSERT_TRUE(details.ParseFromString(s.error_details()));
  ASSERT_EQ(details.problems_size(), 3);
  EXPECT_EQ(details.problems(2).field(), "train.global_batch");
  EXPECT_EQ(details.problems(2).line(), 5);
  // Thousands of problems stay within the trailer bounds.
  std::string many;
  for (int i = 0; i < 3000; ++i) many += "unknown_field_" + std::to_string(i) + ": 1\n";
  req.set_spec_yaml(many);
  auto ctx2 = Ctx();
  s = coord_->SubmitJob(ctx2.get(), req, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("more"), std::string::npos);
  // validate_only stores nothing.
  req.set_spec_yaml(Spec());
  req.set_validate_only(true);
  auto ctx3 = Ctx();
  ASSERT_TRUE(coord_->SubmitJob(ctx3.get(), req, &resp).ok());
  EXPECT_TRUE(resp.job_id().empty());
  EXPECT_EQ(resp.spec().train().steps(), 10);
  EXPECT_EQ(resp.spec().train().global_batch(), 128);
  auto ctx4 = Ctx();
  v1::ListJobsResponse list;
  ASSERT_TRUE(coord_->ListJobs(ctx4.get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  // dry_run with no agent: FAILED_PRECONDITION.
  req.set_validate_only(false);
  req.set_dry_run(true);
  auto ctx5 = Ctx();
  EXPECT_EQ(coord_->SubmitJob(ctx5.get(), req, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ServerTest, PendingWithoutAgentThenRunsAndSucceeds) {
  StartServer();
  std::string id = Submit(Spec());
  ASSERT_FALSE(id.empty());
  std::this_thread::sleep_for(milliseconds(600));
  auto j = Get(id);
  EXPECT_EQ(j.job().state(), v1::PENDING);
  EXPECT_EQ(j.job().message(), "waiting for a node agent");

  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  auto launches = agent.Launches(id, 0);
  EXPECT_EQ(launches[0].world_size(), 2);
  EXPECT_EQ(launches[1].rank(), 1);
  EXPECT_EQ(launches[0].local_device(), -1);
  j = Get(id);
  EXPECT_EQ(j.plan().ranks(), 2);
  ASSERT_EQ(j.job().ranks_size(), 2);
  EXPECT_EQ(j.job().ranks(1).node(), "n1");

  // Rank calls: assignment, rendezvous, heartbeat, metrics.
  {
    auto ctx = Ctx(server_->RankToken(id, 0));
    v1::GetAssignmentRequest req;
    req.set_job_id(id);
    req.set_rank(1);
    v1::GetAssignmentResponse a;
    ASSERT_TRUE(rank_->GetAssignment(ctx.get(), req, &a).ok());
    EXPECT_EQ(a.world_size(), 2);
    EXPECT_EQ(a.rank(), 1);
    EXPECT_EQ(a.checkpoint_dir(), server_->state_dir() + "/jobs/" + id + "/checkpoints");
    EXPECT_EQ(a.resume_from(), "");
    EXPECT_EQ(a.spec().train().steps(), 10);
    req.set_attempt(1);
    auto ctx2 = Ctx(server_->RankToken(id, 1));
    EXPECT_EQ(rank_->GetAssignment(ctx2.get(), req, &a).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    auto c1 = Ctx(server_->RankToken(id, 0));
    v1::StoreSetRequest set;
    set.set_job_id(id);
    set.set_key("uid");
    set.set_value("xyz");
    v1::StoreSetResponse sr;
    ASSERT_TRUE(rank_->StoreSet(c1.get(), set, &sr).ok());
    auto c2 = Ctx(server_->RankToken(id, 0));
    v1::StoreWaitRequest w;
    w.set_job_id(id);
    w.add_keys("uid");
    w.set_timeout_seconds(1);
    v1::StoreWaitResponse wr;
    ASSERT_TRUE(rank_->StoreWait(c2.get(), w, &wr).ok());
    w.add_keys("never");
    auto c3 = Ctx(server_->RankToken(id, 0));
    EXPECT_EQ(rank_->StoreWait(c3.get(), w, &wr).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    auto c4 = Ctx(server_->RankToken(id, 0));
    v1::StoreAddRequest add;
    add.set_job_id(id);
    add.set_key("n");
    add.set_delta(2);
    v1::StoreAddResponse ar;
    ASSERT_TRUE(rank_->StoreAdd(c4.get(), add, &ar).ok());
    EXPECT_EQ(ar.value(), 2);
    auto c5 = Ctx(server_->RankToken(id, 0));
    v1::StoreGetRequest g;
    g.set_job_id(id);
    g.set_key("uid");
    v1::StoreGetResponse gr;
    ASSERT_TRUE(rank_->StoreGet(c5.get(), g, &gr).ok());
    EXPECT_TRUE(gr.found());
    EXPECT_EQ(gr.value(), "xyz");
  }
  {
    auto ctx = Ctx(server_->RankToken(id, 0));
    v1::StreamMetricsResponse resp;
    auto w = rank_->StreamMetrics(ctx.get(), &resp);
    // Step 3 from both ranks: a point of the loss curve (their mean);
    // steps 4 and 5 from one rank each: none yet.
    for (int r = 0; r < 2; ++r) {
      v1::MetricSample s;
      auto* m = s.mutable_step();
      m->set_job_id(id);
      m->set_rank(r);
      m->set_step(3);
      m->set_loss(1.0 + r);
      ASSERT_TRUE(w->Write(s));
    }
    for (int r = 0; r < 2; ++r) {
      v1::MetricSample s;
      auto* m = s.mutable_step();
      m->set_job_id(id);
      m->set_rank(r);
      m->set_step(4 + r);
      m->set_total_steps(10);
      m->set_loss(2.0 + r);
      m->set_samples_per_second(100);
      m->set_step_seconds(0.5);
      m->set_gpu_memory_used_bytes(-1);
      m->set_host_memory_peak_bytes(r == 0 ? 3e8 : 4e8);
      ASSERT_TRUE(w->Write(s));
    }
    v1::MetricSample e;
    e.mutable_eval()->set_job_id(id);
    (*e.mutable_eval()->mutable_metrics())["sentence_correction_f1"] = 0.5;
    ASSERT_TRUE(w->Write(e));
    // The final loss each rank sends when training ends (the same
    // all-reduced figure; another attempt's is ignored). Rank 0's is of an
    // attempt this job never ran, on that attempt's own stream and token
    // (a rank token speaks for one attempt).
    auto finished = [&](int rank, int attempt, double loss) {
      v1::MetricSample f;
      auto* t = f.mutable_finished();
      t->set_job_id(id);
      t->set_rank(rank);
      t->set_attempt(attempt);
      t->set_final_loss(loss);
      t->set_final_loss_steps(10);
      t->set_final_loss_ranks(2);
      return f;
    };
    {
      auto other_ctx = Ctx(server_->RankToken(id, 7));
      v1::StreamMetricsResponse other_resp;
      auto other = rank_->StreamMetrics(other_ctx.get(), &other_resp);
      ASSERT_TRUE(other->Write(finished(0, 7, 9.0)));
      other->WritesDone();
      ASSERT_TRUE(other->Finish().ok());
    }
    ASSERT_TRUE(w->Write(finished(1, 0, 1.75)));
    w->WritesDone();
    ASSERT_TRUE(w->Finish().ok());
    EXPECT_EQ(resp.received(), 6);
    auto g = Get(id);
    EXPECT_EQ(g.job().step(), 4);
    ASSERT_EQ(g.job().loss_curve_size(), 1);
    EXPECT_EQ(g.job().loss_curve(0).step(), 3);
    EXPECT_DOUBLE_EQ(g.job().loss_curve(0).loss(), 1.5);
    EXPECT_DOUBLE_EQ(g.job().samples_per_second(), 200);
    EXPECT_DOUBLE_EQ(g.job().loss(), 2.5);
    EXPECT_DOUBLE_EQ(g.job().eta_seconds(), 3.0);
    EXPECT_EQ(g.job().ranks(1).step(), 5);
    EXPECT_DOUBLE_EQ(g.job().eval().at("sentence_correction_f1"), 0.5);
    EXPECT_NE(server_->metrics()->Serialize().find("dgca_train_step{job=\"" + id), std::string::npos);
  }
  agent.Exit(id, 0, 0, 0);
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(State(id), v1::RUNNING);
  agent.Exit(id, 1, 0, 0);
  ASSERT_TRUE(WaitState(id, v1::SUCCEEDED));
  j = Get(id);
  EXPECT_EQ(j.job().ranks_size(), 2);
  EXPECT_EQ(j.job().ranks(0).state(), "exited");
  // The ended job's facts: its final loss, exit 0, peak memory, its times.
  ASSERT_TRUE(j.job().has_final_loss());
  EXPECT_EQ(j.job().final_loss(), 1.75);
  EXPECT_EQ(j.job().final_loss_steps(), 10);
  EXPECT_EQ(j.job().exit().rank(), -1);
  EXPECT_FALSE(j.job().exit().failed());
  EXPECT_EQ(j.job().peak_memory_bytes(), 4e8);
  EXPECT_GT(j.job().started_unix_ms(), 0);
  EXPECT_GE(j.job().ended_unix_ms(), j.job().started_unix_ms());
  {
    const std::string text = server_->metrics()->Serialize();
    EXPECT_NE(text.find("dgca_job_final_loss{job=\"" + id + "\"} 1.75"), std::string::npos) << text;
    EXPECT_NE(text.find("dgca_job_peak_memory_bytes{job=\"" + id + "\"} 400000000"), std::string::npos)
        << text;
    EXPECT_EQ(text.find("dgca_train_step{job=\"" + id), std::string::npos) << text;
    EXPECT_EQ(text.find("dgca_job_samples_per_second{job=\"" + id), std::string::npos) << text;
  }
  std::vector<std::string> kinds;
  for (const auto& e : j.events()) kinds.push_back(v1::JobState_Name(e.state()) + ":" + e.kind());
  EXPECT_EQ(kinds.front(), "PENDING:state");
  EXPECT_EQ(kinds.back(), "SUCCEEDED:state");
  // The rendezvous store is gone once the job ended.
  auto c = Ctx(server_->RankToken(id, 0));
  v1::StoreGetRequest g;
  g.set_job_id(id);
  g.set_key("uid");
  v1::StoreGetResponse gr;
  EXPECT_EQ(rank_->StoreGet(c.get(), g, &gr).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // Heartbeats now say stop.
  auto hc = Ctx(server_->RankToken(id, 0));
  v1::RankHeartbeatRequest hb;
  hb.set_job_id(id);
  v1::RankHeartbeatResponse hr;
  ASSERT_TRUE(rank_->Heartbeat(hc.get(), hb, &hr).ok());
  EXPECT_TRUE(hr.stop());
}

// A rank that took the stop and exits 5 ("stopped") is not listed among the
// ranks that failed; a rank stopped by someone else (exit 5 with no stop
// of ours) is named as stopped.
TEST_F(ServerTest, AStoppedRankIsNotAFailedOne) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", /*auto_exit_on_stop=*/false);
  const std::string id = Submit(Spec(0, 3));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 3; }));
  agent.Exit(id, 2, 0, 1, 0, "RuntimeError: boom\n");
  ASSERT_TRUE(WaitUntil([&] { return agent.Stops(id) >= 1; }));
  agent.Exit(id, 0, 0, 5);
  agent.Exit(id, 1, 0, 5);
  ASSERT_TRUE(WaitState(id, v1::FAILED));
  const std::string msg = Get(id).job().message();
  EXPECT_NE(msg.find("rank 2 on node n1 exited with code 1"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("other ranks"), std::string::npos) << msg;

  const std::string other = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(other, 0).size() == 2; }));
  agent.Exit(other, 1, 0, 5);
  ASSERT_TRUE(WaitState(other, v1::FAILED));
  EXPECT_NE(Get(other).job().message().find(
                "rank 1 on node n1 was stopped (exit code 5: SIGTERM or SIGINT not from this "
                "coordinator, e.g. its agent stopping)"),
            std::string::npos)
      << Get(other).job().message();
}

TEST_F(ServerTest, RankFailureNamesTheRank) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", /*auto_exit_on_stop=*/false);
  std::string id = Submit(Spec(0));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  FakeAgent* a = &agent;
  a->Exit(id, 1, 0, 3, 0, "Traceback: boom\n");
  // Rank 0 dies of its own (SIGSEGV) while being stopped: named as well.
  a->Exit(id, 0, 0, -1, SIGSEGV);
  ASSERT_TRUE(WaitState(id, v1::FAILED));
  EXPECT_GE(agent.Stops(id), 1);
  auto j = Get(id);
  EXPECT_NE(j.job().message().find("rank 1 on node n1 exited with code 3"), std::string::npos)
      << j.job().message();
  EXPECT_NE(j.job().message().find("boom"), std::string::npos);
  EXPECT_NE(j.job().message().find("other ranks: rank 0 on node n1 was killed by signal 11"),
            std::string::npos) << j.job().message();
  bool saw_exit = false;
  for (const auto& e : j.events()) saw_exit |= e.kind() == "rank_exit";
  EXPECT_TRUE(saw_exit);
  // Its exit: the first rank that failed on its own, with its code.
  EXPECT_TRUE(j.job().exit().failed());
  EXPECT_EQ(j.job().exit().rank(), 1);
  EXPECT_EQ(j.job().exit().code(), 3);
  EXPECT_EQ(j.job().exit().signal(), 0);
  EXPECT_EQ(j.job().ranks(0).signal(), SIGSEGV);
  EXPECT_FALSE(j.job().has_final_loss());
}

TEST_F(ServerTest, RestartFromCheckpointThenSucceed) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  std::string id = Submit(Spec(1));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  // A checkpoint exists: the restarted attempt resumes from it.
  std::string ckpt = server_->state_dir() + "/jobs/" + id + "/checkpoints";
  ASSERT_EQ(system(("mkdir -p " + ckpt + "/step-00000004").c_str()), 0);
  std::ofstream(ckpt + "/latest") << "step-00000004\n";
  agent.Exit(id, 0, 0, -1, SIGKILL);
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 1).size() == 2; }));
  EXPECT_GE(agent.Stops(id), 1);
  auto j = Get(id);
  EXPECT_EQ(j.job().state(), v1::RUNNING);
  EXPECT_EQ(j.job().restarts(), 1);
  auto ctx = Ctx(server_->RankToken(id, 1));
  v1::GetAssignmentRequest req;
  req.set_job_id(id);
  req.set_attempt(1);
  v1::GetAssignmentResponse a;
  ASSERT_TRUE(rank_->GetAssignment(ctx.get(), req, &a).ok());
  EXPECT_EQ(a.attempt(), 1);
  EXPECT_EQ(a.resume_from(), ckpt + "/step-00000004");
  // Late exit reports of attempt 0 are ignored.
  agent.Exit(id, 1, 0, 1);
  agent.Exit(id, 0, 1, 0);
  agent.Exit(id, 1, 1, 0);
  ASSERT_TRUE(WaitState(id, v1::SUCCEEDED));
  bool saw_restart = false;
  auto done = Get(id);
  for (const auto& e : done.events()) saw_restart |= e.kind() == "restart";
  EXPECT_TRUE(saw_restart);
  EXPECT_NE(server_->metrics()->Serialize().find("dgca_rank_restarts_total{job=\"" + id + "\"} 1"),
            std::string::npos);
}

// An agent that comes back without the ranks the coordinator placed on its
// node (it was killed while they trained on) is asked to adopt them; one
// that lists them is not.
TEST_F(ServerTest, ARestartedAgentIsAskedToAdoptItsRanks) {
  StartServer();
  std::string id;
  {
    FakeAgent first(server_->address(), server_->agent_token(), "n1");
    id = Submit(Spec(0, 2));
    ASSERT_TRUE(WaitUntil([&] { return first.Launches(id, 0).size() == 2; }));
    EXPECT_TRUE(first.Adopts(id).empty());
  }
  FakeAgent again(server_->address(), server_->agent_token(), "n1");
  ASSERT_TRUE(WaitUntil([&] { return again.Adopts(id).size() == 2; }));
  for (const auto& r : again.Adopts(id)) EXPECT_EQ(r.attempt(), 0);
  EXPECT_EQ(State(id), v1::RUNNING);
  // Listing its ranks at registration: nothing to adopt.
  v1::RunningRank r0, r1;
  r0.set_job_id(id);
  r0.set_rank(0);
  r1.set_job_id(id);
  r1.set_rank(1);
  FakeAgent listed(server_->address(), server_->agent_token(), "n1", true, {r0, r1});
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE(listed.Adopts(id).empty());
  listed.Exit(id, 0, 0, 0);
  listed.Exit(id, 1, 0, 0);
  ASSERT_TRUE(WaitState(id, v1::SUCCEEDED));
}

// A restart due while its node is away (the agent restarting: often what
// made the ranks fail) waits for the node (up to restart_node_wait_s) instead
// of failing the job with "cannot restart".
TEST_F(ServerTest, ARestartWaitsForItsNodeToComeBack) {
  StartServer();
  // n1's agent goes; rank 1 never reports: the stop ends at its deadline.
  const std::string id = LoseANodeWithARestartDue();
  ASSERT_TRUE(WaitUntil([&] { return State(id) == v1::PLANNING; }, milliseconds(15000)))
      << Get(id).job().message();
  const v1::GetJobResponse waiting = Get(id);
  EXPECT_NE(waiting.job().message().find(
                "waiting for capacity: node n1 (rank 0) is not connected; restart 1 of 1 waits "
                "for it"),
            std::string::npos)
      << waiting.job().message();
  EXPECT_EQ(waiting.job().restarts(), 1);  // counted; its event comes with the launch
  for (const auto& e : waiting.events()) EXPECT_NE(e.kind(), "restart") << e.message();
  {
    auto store = JobStore::Open(dir_ + "/dgca.db");  // stored too
    ASSERT_TRUE(store.ok());
    EXPECT_EQ((*store)->GetJob(id)->job.restarts(), 1);
  }
  FakeAgent back(server_->address(), server_->agent_token(), "n1");
  ASSERT_TRUE(WaitUntil([&] { return back.Launches(id, 1).size() == 2; }));
  // Rank 1 of attempt 0 never reported its end: the agent is asked to adopt
  // it and to stop that attempt.
  const auto adopts = back.Adopts(id);
  ASSERT_EQ(adopts.size(), 1u);
  EXPECT_EQ(adopts[0].rank(), 1);
  EXPECT_EQ(adopts[0].attempt(), 0);
  EXPECT_GE(back.Stops(id), 1);
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  const v1::GetJobResponse running = Get(id);
  EXPECT_EQ(running.job().restarts(), 1);
  bool saw_restart = false;
  for (const auto& e : running.events()) {
    saw_restart |= e.kind() == "restart" && e.message().rfind("restart 1 of 1 (attempt 1)", 0) == 0;
  }
  EXPECT_TRUE(saw_restart);
  back.Exit(id, 0, 1, 0);
  back.Exit(id, 1, 1, 0);
  ASSERT_TRUE(WaitState(id, v1::SUCCEEDED));
}

// A node that does not come back within restart_node_wait_s: the job fails
// "cannot restart" (it used to wait forever).
TEST_F(ServerTest, ARestartGivesUpOnANodeThatStaysAway) {
  StartServer(/*heartbeat_timeout_s=*/30, /*restart_node_wait_s=*/1.0);
  const std::string id = LoseANodeWithARestartDue();
  ASSERT_TRUE(WaitUntil([&] { return State(id) == v1::PLANNING; }, milliseconds(15000)));
  ASSERT_TRUE(WaitState(id, v1::FAILED));
  const std::string msg = Get(id).job().message();
  EXPECT_NE(msg.find("cannot restart after: rank 0 on node n1 was killed by signal 9"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("waiting for capacity: node n1 (rank 0) is not connected for 1 s"),
            std::string::npos)
      << msg;
}


TEST_F(ServerTest, StalledRankFailsTheJob) {
  StartServer(/*heartbeat_timeout_s=*/1.0);
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  std::string id = Submit(Spec(0, 1));
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  ASSERT_TRUE(WaitState(id, v1::FAILED, milliseconds(8000)));
  EXPECT_NE(Get(id).job().message().find("made no progress"), std::string::npos)
      << Get(id).job().message();
  EXPECT_GE(agent.Stops(id), 1);
}

TEST_F(ServerTest, CancelStopsRanksAndWatchEnds) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  std::string id = Submit(Spec());
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  // Watch from the start in a thread.
  std::vector<v1::WatchJobResponse> seen;
  grpc::Status watch_status;
  std::thread watcher([&] {
    auto ctx = Ctx();
    v1::WatchJobRequest req;
    req.set_job_id(id);
    auto r = coord_->WatchJob(ctx.get(), req);
    v1::WatchJobResponse u;
    while (r->Read(&u)) seen.push_back(u);
    watch_status = r->Finish();
  });
  std::this_thread::sleep_for(milliseconds(300));
  auto ctx = Ctx();
  v1::CancelJobRequest req;
  req.set_job_id(id);
  v1::CancelJobResponse resp;
  ASSERT_TRUE(coord_->CancelJob(ctx.get(), req, &resp).ok());
  EXPECT_EQ(resp.job().state(), v1::CANCELLED);
  EXPECT_GE(agent.Stops(id), 1);
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(seen.front().has_event());
  EXPECT_EQ(seen.front().event().seq(), 1);
  EXPECT_TRUE(seen.back().has_snapshot());
  EXPECT_EQ(seen.back().snapshot().state(), v1::CANCELLED);
  int64_t last = 0;
  for (const auto& u : seen) {
    if (!u.has_event()) continue;
    EXPECT_GT(u.event().seq(), last);  // no duplicates, in order
    last = u.event().seq();
  }
  // Cancel again: already ended, which is no error; the response says so.
  auto ctx2 = Ctx();
  resp.Clear();
  EXPECT_EQ(coord_->CancelJob(ctx2.get(), req, &resp).error_code(), grpc::StatusCode::OK);
  EXPECT_TRUE(resp.already_ended());
  EXPECT_EQ(resp.job().state(), v1::CANCELLED);
  // A pending job is cancelled at once.
  server_->Shutdown();
}

TEST_F(ServerTest, CancelPendingAndUnknownJobs) {
  StartServer();
  std::string id = Submit(Spec());
  auto ctx = Ctx();
  v1::CancelJobRequest req;
  req.set_job_id(id);
  v1::CancelJobResponse resp;
  ASSERT_TRUE(coord_->CancelJob(ctx.get(), req, &resp).ok());
  EXPECT_EQ(resp.job().state(), v1::CANCELLED);
  req.set_job_id("j-999999-0000");
  auto ctx2 = Ctx();
  EXPECT_EQ(coord_->CancelJob(ctx2.get(), req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::GetJobRequest g;
  g.set_job_id("nope");
  v1::GetJobResponse gr;
  auto ctx3 = Ctx();
  EXPECT_EQ(coord_->GetJob(ctx3.get(), g, &gr).error_code(), grpc::StatusCode::NOT_FOUND);
}

// A job id that cannot name a job is INVALID_ARGUMENT, and an overlong one
// is not echoed back: a 9 KB "no job <id>" status message overflowed the
// client's metadata limit and read as a transport error.
TEST_F(ServerTest, AnOverlongJobIdIsInvalidNotATransportError) {
  StartServer();
  const std::string long_id(9000, 'a');
  v1::GetJobRequest g;
  g.set_job_id(long_id);
  v1::GetJobResponse gr;
  auto ctx = Ctx();
  grpc::Status s = coord_->GetJob(ctx.get(), g, &gr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message().substr(0, 200);
  EXPECT_NE(s.error_message().find("at most 128"), std::string::npos) << s.error_message().substr(0, 200);
  EXPECT_LT(s.error_message().size(), 1000u);
  v1::CancelJobRequest c;
  c.set_job_id(long_id);
  v1::CancelJobResponse cr;
  auto ctx2 = Ctx();
  EXPECT_EQ(coord_->CancelJob(ctx2.get(), c, &cr).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::DiagnoseJobRequest d;
  d.set_job_id("j-1\nx");
  v1::DiagnoseJobResponse dr;
  auto ctx3 = Ctx();
  EXPECT_EQ(coord_->DiagnoseJob(ctx3.get(), d, &dr).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// gRPC sets SO_REUSEPORT by default: a second coordinator (another state
// dir) on a port in use started and took half the connections.
TEST_F(ServerTest, ASecondServerOnTheSamePortFailsToStart) {
  StartServer();
  CoordinatorServerOptions o;
  o.listen = server_->address();
  o.metrics_listen = "";
  o.state_dir = TempDir();
  o.local_agent = false;
  auto second = CoordinatorServer::Start(o);
  ASSERT_FALSE(second.ok()) << "a second coordinator listens on " << (*second)->address();
  EXPECT_NE(second.status().message().find("cannot listen on " + server_->address()),
            std::string::npos)
      << second.status();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status();
  // The first one still answers.
  auto ctx = Ctx();
  v1::ListJobsResponse resp;
  EXPECT_TRUE(coord_->ListJobs(ctx.get(), v1::ListJobsRequest(), &resp).ok());
}

TEST(CoordinatorStart, RefusesBadAddressesAndAStateDirThatIsAFile) {
  const std::string dir = TempDir();
  CoordinatorServerOptions o;
  o.metrics_listen = "";
  o.state_dir = dir;
  o.local_agent = false;
  // Ports out of range wrapped silently (99999 -> 34463).
  for (const std::string& bad : {"127.0.0.1:99999", "127.0.0.1", "127.0.0.1:-1", "127.0.0.1:x"}) {
    o.listen = bad;
    auto s = CoordinatorServer::Start(o);
    ASSERT_FALSE(s.ok()) << bad << " listens on " << (*s)->address();
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find("--listen"), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("HOST:PORT"), std::string::npos) << s.status();
  }
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:70000";
  auto m = CoordinatorServer::Start(o);
  ASSERT_FALSE(m.ok()) << "metrics on " << (*m)->metrics_address();
  EXPECT_NE(m.status().message().find("--metrics-listen"), std::string::npos) << m.status();
  // A regular file as the state dir: it is not a directory (it said
  // "another dgca-coordinator is using state dir").
  o.metrics_listen = "";
  o.state_dir = dir + "/a-file";
  std::ofstream(o.state_dir) << "x";
  auto f = CoordinatorServer::Start(o);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("is not a directory"), std::string::npos) << f.status();
  EXPECT_EQ(f.status().message().find("another dgca-coordinator"), std::string::npos) << f.status();
}

// ForgetNode: refused for unknown names, connected agents and nodes that
// still hold an active job's ranks; then the node leaves ListNodes and its
// dgca_worker_* series leave /metrics.
TEST_F(ServerTest, ForgetNodeDropsOnlyAGoneNode) {
  StartServer();
  auto forget = [&](const std::string& node) {
    auto ctx = Ctx();
    v1::ForgetNodeRequest req;
    req.set_node(node);
    v1::ForgetNodeResponse resp;
    return coord_->ForgetNode(ctx.get(), req, &resp);
  };
  auto nodes = [&] {
    auto ctx = Ctx();
    v1::ListNodesResponse resp;
    EXPECT_TRUE(coord_->ListNodes(ctx.get(), v1::ListNodesRequest(), &resp).ok());
    return resp;
  };
  const std::string series = "dgca_worker_connected{node=\"n1\"}";
  auto agent = std::make_unique<FakeAgent>(server_->address(), server_->agent_token(), "n1");
  std::string id = Submit(Spec());
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  ASSERT_TRUE(WaitUntil([&] { return server_->metrics()->Serialize().find(series) !=
                                     std::string::npos; }));

  grpc::Status s = forget("");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  s = forget("zz");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_NE(s.error_message().find("known: n1"), std::string::npos) << s.error_message();
  s = forget("n1");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("is connected"), std::string::npos) << s.error_message();

  agent.reset();  // the agent goes away; the job's ranks there are not yet known to be gone
  ASSERT_TRUE(WaitUntil([&] {
    auto r = nodes();
    return r.nodes_size() == 1 && !r.nodes(0).connected();
  }));
  s = forget("n1");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("still has ranks of active job(s) " + id), std::string::npos)
      << s.error_message();
  EXPECT_EQ(nodes().nodes_size(), 1);

  {
    auto ctx = Ctx();
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::CancelJobResponse resp;
    ASSERT_TRUE(coord_->CancelJob(ctx.get(), req, &resp).ok());
  }
  ASSERT_TRUE(WaitState(id, v1::CANCELLED));
  s = forget("n1");
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(nodes().nodes_size(), 0);
  // Gone from /metrics, and not put back by the next ticks.
  std::this_thread::sleep_for(milliseconds(500));
  const std::string text = server_->metrics()->Serialize();
  EXPECT_EQ(text.find(series), std::string::npos) << text;
  EXPECT_EQ(text.find("dgca_worker_heartbeat_age_seconds{node=\"n1\"}"), std::string::npos)
      << text;
  EXPECT_EQ(forget("n1").error_code(), grpc::StatusCode::NOT_FOUND);

  // An agent of that name that comes back registers afresh.
  FakeAgent again(server_->address(), server_->agent_token(), "n1");
  ASSERT_TRUE(WaitUntil([&] {
    auto r = nodes();
    return r.nodes_size() == 1 && r.nodes(0).connected();
  }));
}

TEST_F(ServerTest, LogsNodesTopology) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  std::string id = Submit(Spec());
  ASSERT_TRUE(WaitState(id, v1::RUNNING));
  std::string logdir = server_->state_dir() + "/jobs/" + id;
  ASSERT_EQ(system(("mkdir -p " + logdir).c_str()), 0);
  std::ofstream(logdir + "/rank-1.log") << "hello from rank 1\n";
  {
    auto ctx = Ctx();
    v1::GetLogsRequest req;
    req.set_job_id(id);
    req.set_rank(1);
    auto r = coord_->GetLogs(ctx.get(), req);
    v1::GetLogsResponse c;
    std::string all;
    bool eof = false;
    while (r->Read(&c)) {
      all += c.data();
      eof = c.eof();
    }
    ASSERT_TRUE(r->Finish().ok());
    EXPECT_EQ(all, "hello from rank 1\n");
    EXPECT_TRUE(eof);
  }
  {
    auto ctx = Ctx();
    v1::GetLogsRequest req;
    req.set_job_id(id);
    req.set_rank(0);
    auto r = coord_->GetLogs(ctx.get(), req);
    v1::GetLogsResponse c;
    while (r->Read(&c)) {}
    EXPECT_EQ(r->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // follow: streams appended data and ends with eof when the job finishes.
  {
    auto ctx = Ctx();
    v1::GetLogsRequest req;
    req.set_job_id(id);
    req.set_rank(1);
    req.set_offset(6);
    req.set_follow(true);
    auto r = coord_->GetLogs(ctx.get(), req);
    std::thread t([&] {
      std::this_thread::sleep_for(milliseconds(300));
      std::ofstream(logdir + "/rank-1.log", std::ios::app) << "more\n";
      std::this_thread::sleep_for(milliseconds(300));
      agent.Exit(id, 0, 0, 0);
      agent.Exit(id, 1, 0, 0);
    });
    v1::GetLogsResponse c;
    std::string all;
    bool eof = false;
    while (r->Read(&c)) {
      all += c.data();
      eof = c.eof();
    }
    t.join();
    ASSERT_TRUE(r->Finish().ok());
    EXPECT_EQ(all, "from rank 1\nmore\n");
    EXPECT_TRUE(eof);
  }
  auto ctx = Ctx();
  v1::ListNodesResponse nodes;
  ASSERT_TRUE(coord_->ListNodes(ctx.get(), v1::ListNodesRequest(), &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), 1);
  EXPECT_EQ(nodes.nodes(0).name(), "n1");
  EXPECT_TRUE(nodes.nodes(0).connected());
  EXPECT_EQ(nodes.nodes(0).topology().cpu_count(), 8);
  auto ctx2 = Ctx();
  v1::GetTopologyRequest tr;
  tr.set_node("zz");
  v1::GetTopologyResponse tresp;
  EXPECT_EQ(coord_->GetTopology(ctx2.get(), tr, &tresp).error_code(), grpc::StatusCode::NOT_FOUND);
  auto ctx3 = Ctx();
  v1::PlanJobRequest pr;
  pr.set_spec_yaml(Spec());
  v1::PlanJobResponse presp;
  ASSERT_TRUE(coord_->PlanJob(ctx3.get(), pr, &presp).ok());
  EXPECT_EQ(presp.plan().ranks(), 2);
  EXPECT_GT(presp.plan().decisions_size(), 0);
}

// 200+ mutated specs through SubmitJob: every answer is OK or
// INVALID_ARGUMENT with problems, and the server keeps serving. (Non-UTF-8
// bytes cannot cross a proto3 string; the parser's own fuzz covers them.)
TEST_F(ServerTest, MutatedSpecsNeverCrashTheServer) {
  StartServer();
  const std::string base =
      "name: fuzz\nmodel: {preset: tiny, heads: {candidate: {top_k: 4}}}\n"
      "data: {train: a.txt, mft: {rate: 0.3}}\n"
      "train: {steps: 10, optimizer: {lr: 1.0e-4}}\nresources: {ranks: 2, device: cpu}\n"
      "comm: {env: {NCCL_DEBUG: WARN}}\n";
  std::mt19937 rng(7);
  auto rnd = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int ok = 0, invalid = 0;
  for (int i = 0; i < 220; ++i) {
    std::string t = base;
    for (int m = 0; m < 3; ++m) {
      size_t p = rnd(t.size());
      switch (rnd(5)) {
        case 0: t.erase(p, 1); break;
        case 1: t.insert(p, 1, "{}[]:,-\n\t\"'&*!|>#%@`~"[rnd(22)]); break;
        case 2: t.insert(p, std::to_string(rng())); break;
        case 3: std::swap(t[p], t[rnd(t.size())]); break;
        default: t.insert(p, std::string(rnd(300), '[')); break;
      }
    }
    v1::SubmitJobRequest req;
    req.set_spec_yaml(t);
    req.set_spec_path("fuzz.yaml");
    req.set_validate_only(i % 2 == 0);
    v1::SubmitJobResponse resp;
    auto ctx = Ctx();
    grpc::Status st = coord_->SubmitJob(ctx.get(), req, &resp);
    if (st.ok()) {
      ++ok;
    } else {
      ASSERT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
      v1::SubmitJobResponse d;
      ASSERT_TRUE(d.ParseFromString(st.error_details()));
      EXPECT_GT(d.problems_size(), 0);
      ++invalid;
    }
  }
  EXPECT_EQ(ok + invalid, 220);
  EXPECT_GT(invalid, 50);
  // Requests over 4 MiB are refused by the transport.
  v1::SubmitJobRequest big;
  big.set_spec_yaml(std::string(5 << 20, '#'));
  v1::SubmitJobResponse resp;
  auto ctx = Ctx();
  EXPECT_EQ(coord_->SubmitJob(ctx.get(), big, &resp).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  auto ctx2 = Ctx();
  v1::ListJobsResponse list;
  ASSERT_TRUE(coord_->ListJobs(ctx2.get(), v1::ListJobsRequest(), &list).ok());
}

// The embedded local agent (W1's Agent) launching real processes: a stand-in
// rank script whose behaviour the spec's comm.env (OMP_* is allow-listed)
// selects.
TEST_F(ServerTest, LocalAgentRunsRealProcesses) {
  CoordinatorServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.state_dir = dir_;
  o.local_agent = true;
  o.node_name = "local";
  o.stop_grace_s = 1;
  o.rank_argv_override = {"/bin/sh", "-c",
                          "echo \"rank {rank} of {job} says boom\" >&2; "
                          "sleep ${OMP_TEST_SLEEP:-30}; exit ${OMP_TEST_EXIT:-0}",
                          "{job}"};
  auto started = CoordinatorServer::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  server_ = std::move(*started);
  channel_ = MakeChannel(server_->address());
  coord_ = v1::Coordinator::NewStub(channel_);
  auto spec = [](const std::string& env) {
    return "name: local\ntrain: {steps: 10}\nresources: {ranks: 2, device: cpu}\n"
           "comm: {env: {" + env + "}}\n";
  };
  // 1. Both ranks exit 0.
  std::string ok = Submit(spec("OMP_TEST_SLEEP: '0.2'"));
  ASSERT_TRUE(WaitState(ok, v1::SUCCEEDED)) << Get(ok).job().message();
  std::ifstream log(server_->state_dir() + "/jobs/" + ok + "/rank-1.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("rank 1 of " + ok + " says boom"), std::string::npos) << text;
  // 2. A failing rank: FAILED naming the rank, the code and its output.
  std::string bad = Submit(spec("OMP_TEST_SLEEP: '0.1', OMP_TEST_EXIT: '3'"));
  ASSERT_TRUE(WaitState(bad, v1::FAILED)) << Get(bad).job().message();
  std::string msg = Get(bad).job().message();
  EXPECT_NE(msg.find("exited with code 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("says boom"), std::string::npos) << msg;
  // 3. Cancel a running job: every rank process is gone within 5 s.
  std::string run = Submit(spec("OMP_TEST_SLEEP: '30'"));
  ASSERT_TRUE(WaitState(run, v1::RUNNING));
  std::vector<int> pids;
  ASSERT_TRUE(WaitUntil([&] {
    pids.clear();
    auto j = Get(run);
    for (const auto& r : j.job().ranks()) {
      if (r.pid() > 0) pids.push_back(r.pid());
    }
    return pids.size() == 2;
  }));
  auto t0 = std::chrono::steady_clock::now();
  auto ctx = Ctx();
  v1::CancelJobRequest req;
  req.set_job_id(run);
  v1::CancelJobResponse resp;
  ASSERT_TRUE(coord_->CancelJob(ctx.get(), req, &resp).ok());
  EXPECT_EQ(resp.job().state(), v1::CANCELLED);
  EXPECT_TRUE(WaitUntil([&] {
    for (int pid : pids) {
      if (kill(pid, 0) == 0) return false;
    }
    return true;
  }, milliseconds(5000)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(5));
  auto ctx2 = Ctx();
  v1::ListNodesResponse nodes;
  ASSERT_TRUE(coord_->ListNodes(ctx2.get(), v1::ListNodesRequest(), &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), 1);
  EXPECT_EQ(nodes.nodes(0).name(), "local");
}

// A stand-in for a rank a killed coordinator left behind: `sleep 30` in its
// own process group, its command line naming the job (what KillOrphan
// checks). Returns its pid (the caller reaps it), -1 on failure.
pid_t SpawnOrphanRank(const std::string& job_id) {
  pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", "sleep 30", job_id.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  if (child < 0) return -1;
  setpgid(child, child);
  std::this_thread::sleep_for(milliseconds(100));  // past the exec
  return child;
}

// A job the store holds as RUNNING (as after kill -9) whose ranks cannot be
// re-adopted (here: no plan stored) is FAILED "coordinator restarted; cannot
// re-adopt: ..." on start, its recorded orphan rank process is killed, and
// its history is kept.
TEST_F(ServerTest, RestartFailsJobsItCannotReadoptAndKillsOrphans) {
  std::string id;
  pid_t child = -1;
  {
    auto store = JobStore::Open(dir_ + "/dgca.db");
    ASSERT_TRUE(store.ok());
    v1::JobSpec spec;
    spec.set_name("old");
    auto j = (*store)->CreateJob(spec, "name: old\n");
    ASSERT_TRUE(j.ok());
    id = j->id();
    ASSERT_TRUE((*store)->SetState(id, v1::RUNNING, "running 1 ranks").ok());
    auto done = (*store)->CreateJob(spec, "name: done\n");
    ASSERT_TRUE((*store)->SetState(done->id(), v1::SUCCEEDED, "ok").ok());
    child = SpawnOrphanRank(id);
    ASSERT_GT(child, 0);
    ASSERT_TRUE((*store)->RecordRank({id, 0, 0, "n1", child, child}).ok());
  }
  StartServer();
  auto j = Get(id);
  EXPECT_EQ(j.job().state(), v1::FAILED);
  EXPECT_EQ(j.job().message(), "coordinator restarted; cannot re-adopt: no plan stored");
  ASSERT_GE(j.events_size(), 3);
  EXPECT_EQ(j.events(0).message(), "submitted");
  EXPECT_EQ(j.events(1).state(), v1::RUNNING);
  EXPECT_EQ(j.events(j.events_size() - 1).message(),
            "coordinator restarted; cannot re-adopt: no plan stored");
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  auto ctx = Ctx();
  v1::ListJobsResponse list;
  ASSERT_TRUE(coord_->ListJobs(ctx.get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 2);
  // Its state series says FAILED (the DgcaJobFailed alert), never RUNNING.
  const std::string metrics = server_->metrics()->Serialize();
  EXPECT_NE(metrics.find("dgca_job_state{job=\"" + id + "\",state=\"FAILED\"} 1"), std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("dgca_job_state{job=\"" + id + "\",state=\"RUNNING\"}"), std::string::npos);
}

// What the store holds after a coordinator died (kill -9) while attempt
// `attempt` of a 2-rank job ran on node n1: the plan, both ranks recorded,
// progress persisted at step 7 (`rank_states` per rank), plus `events`
// (kind, message) appended after "running 2 ranks".
std::string StoreRunningJob(const std::string& dir, int max_restarts, int attempt,
                            const std::vector<std::pair<std::string, std::string>>& events = {},
                            const std::vector<std::string>& rank_states = {"running", "running"}) {
  auto store = JobStore::Open(dir + "/dgca.db");
  EXPECT_TRUE(store.ok()) << store.status();
  auto parsed = ParseJobSpec(Spec(max_restarts, 2), "job.yaml");
  EXPECT_TRUE(parsed.ok() && parsed->ok());
  auto j = (*store)->CreateJob(parsed->spec, Spec(max_restarts, 2));
  EXPECT_TRUE(j.ok());
  const std::string id = j->id();
  v1::Plan plan;
  plan.set_ranks(2);
  plan.set_device("cpu");
  plan.set_backend("gloo");
  plan.add_rank_nodes("n1");
  plan.add_rank_nodes("n1");
  EXPECT_TRUE((*store)->SetPlan(id, plan).ok());
  EXPECT_TRUE((*store)->SetState(id, v1::RUNNING, "running 2 ranks").ok());
  EXPECT_TRUE((*store)->SetRestarts(id, attempt).ok());
  v1::Job progress;
  progress.set_step(7);
  for (int r = 0; r < 2; ++r) {
    v1::RankProgress* p = progress.add_ranks();
    p->set_rank(r);
    p->set_node("n1");
    p->set_step(7);
    p->set_state(rank_states[r]);
    EXPECT_TRUE((*store)->RecordRank({id, r, attempt, "n1", 0, 0}).ok());
  }
  EXPECT_TRUE((*store)->SetProgress(id, progress).ok());
  for (const auto& [kind, message] : events) {
    EXPECT_TRUE((*store)->AppendEvent(id, kind, message).ok());
  }
  return id;
}

std::vector<v1::RunningRank> Running(const std::string& job, int attempt,
                                     const std::vector<int>& ranks) {
  std::vector<v1::RunningRank> out;
  for (int r : ranks) {
    v1::RunningRank x;
    x.set_job_id(job);
    x.set_rank(r);
    x.set_attempt(attempt);
    x.set_pid(4200 + r);
    out.push_back(x);
  }
  return out;
}

// After kill -9 a RUNNING job keeps running: same attempt, restarts and
// progress; its ranks' heartbeats are welcome (an older attempt's are not);
// the agent that re-registers with the ranks gets no stop and no launch;
// their exits end the job as usual.
TEST_F(ServerTest, RestartReadoptsARunningJobThatThenFinishes) {
  const std::string id = StoreRunningJob(dir_, 1, 1);
  StartServer();
  auto j = Get(id);
  EXPECT_EQ(j.job().state(), v1::RUNNING) << j.job().message();
  EXPECT_EQ(j.job().restarts(), 1);
  EXPECT_EQ(j.job().step(), 7);
  ASSERT_EQ(j.job().ranks_size(), 2);
  EXPECT_EQ(j.job().ranks(0).state(), "recovering");
  EXPECT_NE(server_->metrics()->Serialize().find("dgca_job_state{job=\"" + id + "\",state=\"RUNNING\"} 1"),
            std::string::npos);
  ASSERT_GE(j.events_size(), 1);
  EXPECT_EQ(j.events(j.events_size() - 1).message().rfind(
                "coordinator restarted; re-adopting attempt 1 (rank@node:pid 0@n1:0 1@n1:0)", 0),
            0u)
      << j.events(j.events_size() - 1).message();

  auto heartbeat = [&](int attempt, int64_t step) {
    v1::RankHeartbeatRequest hb;
    hb.set_job_id(id);
    hb.set_rank(0);
    hb.set_attempt(attempt);
    hb.set_step(step);
    v1::RankHeartbeatResponse hr;
    auto ctx = Ctx(server_->RankToken(id, attempt));
    EXPECT_TRUE(rank_->Heartbeat(ctx.get(), hb, &hr).ok());
    return hr;
  };
  EXPECT_FALSE(heartbeat(1, 8).stop());
  EXPECT_TRUE(heartbeat(0, 8).stop());
  EXPECT_EQ(Get(id).job().ranks(0).state(), "running");
  EXPECT_EQ(Get(id).job().ranks(0).step(), 8);

  FakeAgent agent(server_->address(), server_->agent_token(), "n1", true, Running(id, 1, {0, 1}));
  ASSERT_TRUE(WaitUntil([&] { return Get(id).job().ranks(1).pid() == 4201; }));
  EXPECT_EQ(agent.Stops(id), 0);
  EXPECT_TRUE(agent.Launches(id, 1).empty());
  EXPECT_TRUE(agent.Launches(id, 2).empty());
  agent.Exit(id, 0, 1, 0);
  agent.Exit(id, 1, 1, 0);
  ASSERT_TRUE(WaitUntil([&] { return Get(id).job().state() == v1::SUCCEEDED; }));
  EXPECT_EQ(Get(id).job().message(), "all 2 ranks exited 0");
  EXPECT_EQ(Get(id).job().restarts(), 1);
  const std::string metrics = server_->metrics()->Serialize();
  EXPECT_NE(metrics.find("dgca_job_state{job=\"" + id + "\",state=\"SUCCEEDED\"} 1"), std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("dgca_job_state{job=\"" + id + "\",state=\"RUNNING\"}"), std::string::npos);
}

// A rank's clean exit is stored at once, so a restarted coordinator does not
// wait for it again: the other rank's exit finishes the job.
TEST_F(ServerTest, RestartDoesNotWaitForARankThatHadExited) {
  const std::string id = StoreRunningJob(dir_, 0, 0, {}, {"running", "exited"});
  StartServer();
  EXPECT_EQ(Get(id).job().ranks(1).state(), "exited");
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", true, Running(id, 0, {0}));
  agent.Exit(id, 0, 0, 0);
  ASSERT_TRUE(WaitUntil([&] { return Get(id).job().state() == v1::SUCCEEDED; }))
      << Get(id).job().message();
}

// The exit is persisted when it happens (not 5 s later with the progress):
// a live server's store shows it before the other rank ends.
TEST_F(ServerTest, ACleanRankExitIsStoredAtOnce) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  const std::string id = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  agent.Exit(id, 1, 0, 0);
  ASSERT_TRUE(WaitUntil([&] {
    auto store = JobStore::Open(dir_ + "/dgca.db");
    if (!store.ok()) return false;
    auto stored = (*store)->GetJob(id);
    return stored.ok() && stored->job.ranks_size() == 2 &&
           stored->job.ranks(1).state() == "exited";
  }, milliseconds(3000)));
  agent.Exit(id, 0, 0, 0);
  ASSERT_TRUE(WaitUntil([&] { return Get(id).job().state() == v1::SUCCEEDED; }));
}

// A start that fails half-way (here: --tls-cert without --tls-key, found
// after the store is read and the jobs recovered) leaves the recovered jobs
// as they were: the next good start re-adopts them. (It used to end them
// FAILED "coordinator shut down" on its way out.)
TEST_F(ServerTest, AFailedStartLeavesTheRecoveredJobsAlone) {
  const std::string id = StoreRunningJob(dir_, 0, 0);
  {
    CoordinatorServerOptions o;
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "";
    o.state_dir = dir_;
    o.local_agent = false;
    o.tls_cert = dir_ + "/cert.pem";  // and no key
    auto s = CoordinatorServer::Start(o);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("--tls-cert and --tls-key go together"),
              std::string::npos)
        << s.status();
  }
  {
    auto store = JobStore::Open(dir_ + "/dgca.db");
    ASSERT_TRUE(store.ok()) << store.status();
    auto stored = (*store)->GetJob(id);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->job.state(), v1::RUNNING) << stored->job.message();
    // (Recovering wrote its "re-adopting" note; nothing ended the job.)
    auto ev = (*store)->ListEvents(id, 0);
    ASSERT_TRUE(ev.ok());
    ASSERT_FALSE(ev->empty());
    for (const auto& e : *ev) EXPECT_EQ(e.message().find("shut"), std::string::npos) << e.message();
    EXPECT_EQ(ev->back().state(), v1::RUNNING) << ev->back().message();
  }
  StartServer();
  EXPECT_EQ(State(id), v1::RUNNING);
}

// A cancel under way when the coordinator died is carried on: the ranks'
// heartbeats are told to stop, the agent gets StopRanks when it registers
// again, and the job ends CANCELLED.
TEST_F(ServerTest, RestartCarriesOnAnInterruptedCancel) {
  const std::string id = StoreRunningJob(dir_, 1, 0, {{"stop", "stopping ranks on n1 (cancel)"}});
  StartServer();
  auto j = Get(id);
  EXPECT_EQ(j.job().state(), v1::RUNNING);
  EXPECT_NE(j.events(j.events_size() - 1).message().find("while stopping the job (cancel)"),
            std::string::npos);
  v1::RankHeartbeatRequest hb;
  hb.set_job_id(id);
  hb.set_rank(0);
  v1::RankHeartbeatResponse hr;
  auto ctx = Ctx(server_->RankToken(id, 0));
  ASSERT_TRUE(rank_->Heartbeat(ctx.get(), hb, &hr).ok());
  EXPECT_TRUE(hr.stop());
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", true, Running(id, 0, {0, 1}));
  ASSERT_TRUE(WaitUntil([&] { return Get(id).job().state() == v1::CANCELLED; }))
      << Get(id).job().message();
  EXPECT_EQ(Get(id).job().message(), "cancelled by user");
  EXPECT_GE(agent.Stops(id), 1);
  EXPECT_TRUE(agent.Launches(id, 1).empty());
}

// A restart under way when the coordinator died is carried on: the rank
// whose failure started it (stored at once) is not waited for nor reported
// again; once the other has stopped, attempt 2 is launched, and its ranks'
// fresh states replace the old attempt's in the store.
TEST_F(ServerTest, RestartCarriesOnAnInterruptedRestart) {
  const std::string id =
      StoreRunningJob(dir_, 3, 1,
                      {{"rank_exit", "rank 1 on node n1 exited with code 1"},
                       {"stop", "stopping ranks on n1 (restart)"}},
                      {"running", "failed"});
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", true, Running(id, 1, {0}));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 2).size() == 2; }))
      << Get(id).job().message();
  auto j = Get(id);
  EXPECT_EQ(j.job().state(), v1::RUNNING);
  EXPECT_EQ(j.job().restarts(), 2);
  EXPECT_EQ(j.events(j.events_size() - 1).message(),
            "restart 2 of 3 (attempt 2) after: rank 1 on node n1 exited with code 1");
  auto store = JobStore::Open(dir_ + "/dgca.db");
  ASSERT_TRUE(store.ok());
  auto stored = (*store)->GetJob(id);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->job.ranks_size(), 2);
  EXPECT_EQ(stored->job.ranks(1).state(), "starting");
  EXPECT_EQ((*store)->ListRanks(id)->at(1).attempt, 2);
}

// A failure stored just before the coordinator died, without the stop it
// led to, still restarts the job.
TEST_F(ServerTest, RestartStartsTheStopOfAStoredFailure) {
  const std::string id = StoreRunningJob(dir_, 3, 0, {}, {"running", "failed"});
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", true, Running(id, 0, {0}));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 1).size() == 2; }))
      << Get(id).job().message();
  auto j = Get(id);
  EXPECT_EQ(j.events(j.events_size() - 1).message(),
            "restart 1 of 3 (attempt 1) after: rank 1 on node n1 failed (exit code 0) just "
            "before the coordinator restarted");
}

// Ranks nobody vouches for (the node came back without them) stall out after
// the heartbeat timeout and the job restarts, as after any failure.
TEST_F(ServerTest, RestartRestartsAJobWhoseRanksAreGone) {
  const std::string id = StoreRunningJob(dir_, 2, 1);
  StartServer(/*heartbeat_timeout_s=*/1);
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 2).size() == 2; }, milliseconds(15000)))
      << Get(id).job().message();
  bool stalled = false;
  const v1::GetJobResponse j = Get(id);
  for (const auto& e : j.events()) {
    stalled |= e.kind() == "rank_exit" && e.message().find("made no progress") != std::string::npos;
  }
  EXPECT_TRUE(stalled);
}

// An adopted rank that ended without an exit record fails the job with a
// message saying so (not "exited with code -1").
TEST_F(ServerTest, AnAdoptedRankWithNoExitStatusFailsTheJobClearly) {
  const std::string id = StoreRunningJob(dir_, 0, 0);
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", true, Running(id, 0, {0, 1}));
  agent.ExitUnknown(id, 0, 0);
  ASSERT_TRUE(WaitUntil([&] { return Get(id).job().state() == v1::FAILED; }));
  EXPECT_EQ(Get(id).job().message().rfind(
                "rank 0 on node n1 (adopted after a restart of its agent or the coordinator) "
                "ended without an exit "
                "status (killed by a signal or crashed)",
                0),
            0u)
      << Get(id).job().message();
}

// PLANNING (nothing launched yet) comes back PENDING and is planned and
// launched once an agent connects.
TEST_F(ServerTest, RestartQueuesAPlanningJobAgain) {
  std::string id;
  {
    auto store = JobStore::Open(dir_ + "/dgca.db");
    ASSERT_TRUE(store.ok());
    auto parsed = ParseJobSpec(Spec(0, 2), "job.yaml");
    ASSERT_TRUE(parsed.ok());
    auto j = (*store)->CreateJob(parsed->spec, Spec(0, 2));
    ASSERT_TRUE(j.ok());
    id = j->id();
    ASSERT_TRUE((*store)->SetState(id, v1::PLANNING, "planning").ok());
  }
  StartServer();
  auto j = Get(id);
  EXPECT_EQ(j.job().state(), v1::PENDING);
  EXPECT_EQ(j.job().message(), "coordinator restarted; queued again");
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  EXPECT_EQ(Get(id).job().state(), v1::RUNNING);
}

// The test as a trial's ranks: the assignment of `attempt`, and steps
// 1..steps of every rank at `step_seconds` each.
v1::GetAssignmentResponse Assignment(v1::RankService::Stub* rank, const std::string& token,
                                     const std::string& job, int attempt) {
  grpc::ClientContext ctx;
  AddAuth(&ctx, token);
  v1::GetAssignmentRequest req;
  req.set_job_id(job);
  req.set_rank(0);
  req.set_attempt(attempt);
  v1::GetAssignmentResponse resp;
  grpc::Status s = rank->GetAssignment(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

void StreamSteps(v1::RankService::Stub* rank, const std::string& token, const std::string& job,
                 int attempt, int ranks, int steps, double step_seconds,
                 double exposed_seconds = 0, double data_wait_seconds = 0,
                 double host_memory_peak_bytes = -1, double gpu_memory_used_bytes = -1,
                 const std::string& attention_kernels = "") {
  grpc::ClientContext ctx;
  AddAuth(&ctx, token);
  v1::StreamMetricsResponse resp;
  auto w = rank->StreamMetrics(&ctx, &resp);
  for (int step = 1; step <= steps; ++step) {
    for (int r = 0; r < ranks; ++r) {
      v1::MetricSample s;
      auto* m = s.mutable_step();
      m->set_job_id(job);
      m->set_rank(r);
      m->set_step(step);
      m->set_total_steps(steps);
      m->set_step_seconds(step_seconds);
      m->set_exposed_comm_seconds(exposed_seconds);
      m->set_data_wait_seconds(data_wait_seconds);
      m->set_host_memory_peak_bytes(host_memory_peak_bytes);
      m->set_gpu_memory_used_bytes(gpu_memory_used_bytes);
      m->set_attention_kernels(attention_kernels);
      m->set_attempt(attempt);
      EXPECT_TRUE(w->Write(s));
    }
  }
  w->WritesDone();
  EXPECT_TRUE(w->Finish().ok());
}

std::string TrialSpecYaml(int ranks) {
  return "name: tuned\ntrain: {steps: 10, global_batch: 64}\nresources: {ranks: " +
         std::to_string(ranks) + ", device: cpu}\ntuning: {mode: trial, budget_s: 60}\n";
}

// tuning.mode trial: each of the planner's candidates runs as a short
// attempt of the job (its spec cut to a few steps, no eval, no checkpoints,
// the candidate's plan); the measured fastest is kept and the job itself
// runs it at the next attempt, its trials in the stored plan.
TEST_F(ServerTest, TrialModeTimesCandidatesOnTheRanksAndKeepsTheFastest) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  const std::string id = Submit(TrialSpecYaml(2));
  std::vector<v1::Plan> candidates;
  int attempt = 0;
  for (; attempt < 10; ++attempt) {
    ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, attempt).size() == 2; }))
        << "attempt " << attempt << ": " << Get(id).job().message();
    v1::GetAssignmentResponse a = Assignment(rank_.get(), server_->RankToken(id, attempt), id, attempt);
    if (a.spec().train().steps() == 10) break;  // the job itself
    EXPECT_EQ(Get(id).job().state(), v1::PLANNING);
    EXPECT_EQ(a.spec().train().steps(), 6);
    EXPECT_TRUE(a.spec().data().eval().empty());
    EXPECT_EQ(a.spec().train().checkpoint_every(), 0);
    EXPECT_TRUE(a.checkpoint_dir().empty());
    candidates.push_back(a.plan());
    // The second candidate is the fastest.
    StreamSteps(rank_.get(), server_->RankToken(id, attempt), id, attempt, 2, 6, attempt == 1 ? 0.1 : 0.4);
    agent.Exit(id, 0, attempt, 0);
    agent.Exit(id, 1, attempt, 0);
  }
  ASSERT_GE(candidates.size(), 2u) << "the planner offered fewer than two candidates";
  ASSERT_TRUE(WaitUntil([&] { return Get(id).job().state() == v1::RUNNING; }));
  auto j = Get(id);
  ASSERT_EQ(j.plan().trials_size(), static_cast<int>(candidates.size()));
  EXPECT_NE(j.plan().trials(1).note().find("kept (fastest)"), std::string::npos)
      << j.plan().trials(1).note();
  EXPECT_DOUBLE_EQ(j.plan().trials(1).measured_step_seconds(), 0.1);
  EXPECT_DOUBLE_EQ(j.plan().trials(0).measured_step_seconds(), 0.4);
  EXPECT_EQ(j.plan().micro_batch(), candidates[1].micro_batch());
  EXPECT_EQ(j.plan().accumulation(), candidates[1].accumulation());
  EXPECT_EQ(j.plan().bucket_mb(), candidates[1].bucket_mb());
  v1::GetAssignmentResponse real = Assignment(rank_.get(), server_->RankToken(id, attempt), id, attempt);
  EXPECT_EQ(real.plan().micro_batch(), candidates[1].micro_batch());
  EXPECT_FALSE(real.checkpoint_dir().empty());
  int trial_events = 0;
  for (const auto& e : j.events()) trial_events += e.kind() == "trial";
  EXPECT_EQ(trial_events, 2 * static_cast<int>(candidates.size()));  // start and result
  EXPECT_EQ(j.job().restarts(), 0);

  // The trials' measurements feed later plans of the same model on these
  // nodes: a model-only plan now predicts a step time and cites them.
  v1::PlanJobRequest preq;
  std::string yaml = TrialSpecYaml(2);
  yaml.replace(yaml.find("mode: trial"), 11, "mode: model");
  preq.set_spec_yaml(yaml);
  v1::PlanJobResponse presp;
  auto pctx = Ctx();
  ASSERT_TRUE(coord_->PlanJob(pctx.get(), preq, &presp).ok());
  EXPECT_GT(presp.plan().predicted_step_seconds(), 0);
  bool cited = false;
  for (const auto& d : presp.plan().decisions()) {
    cited |= d.reason().find(id + "/trial-2") != std::string::npos;
  }
  EXPECT_TRUE(cited) << presp.plan().DebugString();
}

// A trial whose rank fails (e.g. out of memory at that micro-batch) is
// logged as failed with the rank's last output, and the others go on.
TEST_F(ServerTest, AFailedTrialIsLoggedAndSkipped) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  const std::string id = Submit(TrialSpecYaml(2));
  int attempt = 0;
  for (; attempt < 10; ++attempt) {
    ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, attempt).size() == 2; }))
        << Get(id).job().message();
    if (Assignment(rank_.get(), server_->RankToken(id, attempt), id, attempt).spec().train().steps() == 10) break;
    if (attempt == 0) {
      agent.Exit(id, 1, attempt, 1, 0, "error: cudaMalloc: out of memory");
      continue;  // the trial stops rank 0 (FakeAgent exits it on StopRanks)
    }
    StreamSteps(rank_.get(), server_->RankToken(id, attempt), id, attempt, 2, 6, 0.2);
    agent.Exit(id, 0, attempt, 0);
    agent.Exit(id, 1, attempt, 0);
  }
  auto j = Get(id);
  ASSERT_GE(j.plan().trials_size(), 2);
  EXPECT_NE(j.plan().trials(0).note().find("rank 1 on node n1 exited with code 1"),
            std::string::npos)
      << j.plan().trials(0).note();
  EXPECT_NE(j.plan().trials(0).note().find("out of memory"), std::string::npos);
  EXPECT_EQ(j.plan().trials(0).measured_step_seconds(), 0);
  EXPECT_NE(j.plan().trials(1).note().find("kept (fastest)"), std::string::npos);
}

// Cancelling while a trial runs stops its ranks; no more trials, no launch.
TEST_F(ServerTest, CancelDuringATrialStopsItsRanks) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  const std::string id = Submit(TrialSpecYaml(2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  v1::CancelJobRequest req;
  req.set_job_id(id);
  v1::CancelJobResponse resp;
  auto ctx = Ctx();
  ASSERT_TRUE(coord_->CancelJob(ctx.get(), req, &resp).ok());
  EXPECT_EQ(resp.job().state(), v1::CANCELLED);
  EXPECT_TRUE(WaitUntil([&] { return agent.Stops(id) >= 1; }));
  // The planning thread gives up: no further trial, no plan, no launch.
  agent.Exit(id, 0, 0, -1, SIGTERM);
  agent.Exit(id, 1, 0, -1, SIGTERM);
  std::this_thread::sleep_for(milliseconds(800));
  EXPECT_TRUE(agent.Launches(id, 1).empty());
  auto j = Get(id);
  EXPECT_EQ(j.job().state(), v1::CANCELLED);
  for (const auto& e : j.events()) EXPECT_NE(e.kind(), "plan") << e.message();
  EXPECT_EQ(j.events(j.events_size() - 1).message(), "cancelled by user");
}

// The plan is re-checked from live metrics once enough steady steps are in
// (40 rank-steps, 10 s of steps per rank): exposed communication above the
// 10% target names the global batch that would meet it (exposed time per
// step is fixed, compute grows with the samples per step); under it, the
// plan holds, unless another stage limits (here a starved loader); a rank
// above its memory target is named.
TEST_F(ServerTest, LiveCheckSaysWhatWouldMeetTheCommTarget) {
  StartServer();
  // Its jobs run side by side: a node big enough for all their plans' memory.
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", true, {}, 0, 512ull << 30);
  auto live = [&](const std::string& id) {
    const v1::GetJobResponse j = Get(id);
    for (const auto& e : j.events()) {
      if (e.kind() == "plan" && e.message().rfind("live check", 0) == 0) return e.message();
    }
    return std::string();
  };
  const std::string slow = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(slow, 0).size() == 2; }));
  const v1::Plan plan = Get(slow).plan();
  const int global = 2 * plan.micro_batch() * plan.accumulation();
  // 20 one-second steps per rank: 36 steady rank-steps, under the 40 needed.
  StreamSteps(rank_.get(), server_->RankToken(slow, 0), slow, 0, 2, 20, 1.0, 0.4);
  EXPECT_EQ(live(slow), "");
  StreamSteps(rank_.get(), server_->RankToken(slow, 0), slow, 0, 2, 5, 1.0, 0.4);
  ASSERT_TRUE(WaitUntil([&] { return !live(slow).empty(); }));
  const std::string text = live(slow);
  EXPECT_NE(text.find("step 1.0000 s; exposed communication 40.0% of the step (target 10%)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("raise train.global_batch to >= " + std::to_string(6 * global) +
                      " (now " + std::to_string(global) + ")"),
            std::string::npos)
      << text;
  // Once per job.
  StreamSteps(rank_.get(), server_->RankToken(slow, 0), slow, 0, 2, 30, 1.0, 0.4);
  int checks = 0;
  const v1::GetJobResponse after = Get(slow);
  for (const auto& e : after.events()) checks += e.message().rfind("live check", 0) == 0;
  EXPECT_EQ(checks, 1);


  // 0.1 s steps: 46 rank-steps are 2.3 s per rank, under the 10 s needed;
  // 100 more steps per rank make 12.3 s.
  const std::string fine = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(fine, 0).size() == 2; }));
  StreamSteps(rank_.get(), server_->RankToken(fine, 0), fine, 0, 2, 25, 0.1, 0.005);
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(live(fine), "");
  StreamSteps(rank_.get(), server_->RankToken(fine, 0), fine, 0, 2, 100, 0.1, 0.005);
  ASSERT_TRUE(WaitUntil([&] { return !live(fine).empty(); }));
  EXPECT_NE(live(fine).find("exposed communication 5.0% of the step (target 10%), data wait "
                            "0.0%; compute-bound: the plan holds"),
            std::string::npos)
      << live(fine);

  // A starved loader: the live check names it, not "the plan holds".
  const std::string starved = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(starved, 0).size() == 2; }));
  StreamSteps(rank_.get(), server_->RankToken(starved, 0), starved, 0, 2, 25, 1.0, 0.05, 0.3);
  ASSERT_TRUE(WaitUntil([&] { return !live(starved).empty(); }));
  EXPECT_NE(live(starved).find("data wait 30.0%; limiting stage: data; fix: "), std::string::npos)
      << live(starved);
  EXPECT_NE(live(starved).find("fix: the loader starves the trainer (about +43% samples/s without "
                              "the wait): raise data.loader.threads"),
            std::string::npos)
      << live(starved);
  EXPECT_EQ(live(starved).find("the plan holds"), std::string::npos) << live(starved);
  EXPECT_EQ(live(starved).find("memory"), std::string::npos) << live(starved);

  // A rank above the memory target (its peak resident set past 70% of the
  // node's memory per rank) is named, with the smaller micro-batch.
  const std::string swollen = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(swollen, 0).size() == 2; }));
  const v1::Plan sp = Get(swollen).plan();
  ASSERT_GT(sp.memory_target_bytes(), 0);
  StreamSteps(rank_.get(), server_->RankToken(swollen, 0), swollen, 0, 2, 25, 1.0, 0.05, 0,
              1.5 * sp.memory_target_bytes());
  ASSERT_TRUE(WaitUntil([&] { return !live(swollen).empty(); }));
  EXPECT_NE(live(swollen).find("; memory above its target: rank 0"), std::string::npos)
      << live(swollen);
}

// A finished job's peak memory is stored for the next plan of the same
// model, and that plan's memory line cites it; a failed job's is not (one
// that ran out of memory died before reporting what it needed).
TEST_F(ServerTest, OnlyAJobThatDidNotFailTeachesThePlannerItsMemory) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  auto plan_memory_reason = [&] { return PlanReason(Spec(0, 2), "predicted.memory_bytes"); };
  auto plan_event = [&](const std::string& id) { return EventText(id, "plan"); };
  // 25 steps of both ranks (enough to store), then rank 1 fails.
  const std::string failed = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(failed, 0).size() == 2; }));
  StreamSteps(rank_.get(), server_->RankToken(failed, 0), failed, 0, 2, 25, 0.1, 0.01, 0, 3e8);
  agent.Exit(failed, 1, 0, 1, 0, "error: out of memory");
  ASSERT_TRUE(WaitState(failed, v1::FAILED));
  ASSERT_TRUE(WaitUntil([&] { return !plan_event(failed).empty(); }));
  EXPECT_NE(plan_event(failed).find("peak memory 286.1 MiB not stored (a failed job"),
            std::string::npos)
      << plan_event(failed);
  EXPECT_EQ(plan_memory_reason().find(failed), std::string::npos) << plan_memory_reason();

  const std::string done = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(done, 0).size() == 2; }));
  StreamSteps(rank_.get(), server_->RankToken(done, 0), done, 0, 2, 10, 0.1, 0.01, 0, 3e8);
  agent.Exit(done, 0, 0, 0);
  agent.Exit(done, 1, 0, 0);
  ASSERT_TRUE(WaitState(done, v1::SUCCEEDED));
  ASSERT_TRUE(WaitUntil([&] { return !plan_event(done).empty(); }));
  EXPECT_NE(plan_event(done).find("and peak memory 286.1 MiB at micro-batch"), std::string::npos)
      << plan_event(done);
  const std::string why = plan_memory_reason();
  EXPECT_NE(why.find("job " + done + " held 286.1 MiB"), std::string::npos) << why;
  EXPECT_EQ(why.find(failed), std::string::npos) << why;
}

// train.attention auto on a GPU: the ranks report which kernels they kept.
// A job whose ranks kept the GEMM attention stores its peak under "gemm", so
// the next auto plan (whose memory line is the fused kernels') does not read
// it as the fused kernels' peak, but predicts the GEMM version's memory
// through it; a plan with the GEMM attention set reads it too.
TEST_F(ServerTest, AnAutoJobsPeakIsFiledUnderTheAttentionItsRanksKept) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", true, {}, /*gpus=*/1);
  auto spec = [](const std::string& attention) {
    return "name: g\ntrain: {steps: 10, global_batch: 64, precision: bf16, attention: " + attention +
           "}\nresources: {ranks: 1, device: cuda}\n";
  };
  auto memory_reason = [&](const std::string& yaml) { return PlanReason(yaml, "predicted.memory_bytes"); };
  const std::string id = Submit(spec("auto"));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 1; }));
  ASSERT_EQ(Get(id).plan().attention(), "auto") << Get(id).plan().ShortDebugString();
  StreamSteps(rank_.get(), server_->RankToken(id, 0), id, 0, 1, 10, 0.1, 0, 0, -1, 12e9, "gemm");
  agent.Exit(id, 0, 0, 0);
  ASSERT_TRUE(WaitState(id, v1::SUCCEEDED));
  const std::string events = EventText(id);
  EXPECT_NE(events.find("and peak memory 11.18 GiB at micro-batch"), std::string::npos) << events;
  EXPECT_NE(events.find("(gemm attention, which the ranks kept)"), std::string::npos) << events;
  // The next auto plan predicts the GEMM version's memory (a rank may keep
  // it again) through that peak, and the fused kernels' line without it:
  // the job is cited once, as the GEMM version's.
  const std::string auto_why = memory_reason(spec("auto"));
  const std::string gemm_cite = "the line through the GEMM version's own peaks (job " + id +
                                " held 11.18 GiB at micro-batch 64 with the GEMM attention";
  const size_t at = auto_why.find(gemm_cite);
  ASSERT_NE(at, std::string::npos) << auto_why;
  EXPECT_EQ(auto_why.find("job " + id), at + gemm_cite.find("job ")) << auto_why;
  EXPECT_EQ(auto_why.find("job " + id, at + gemm_cite.size()), std::string::npos) << auto_why;
  const std::string gemm_why = memory_reason(spec("gemm"));
  EXPECT_NE(gemm_why.find("job " + id + " held 11.18 GiB"), std::string::npos) << gemm_why;

  // Ranks that ran both kernels over a job (a restarted attempt timed the
  // attention again and kept the other): its peak is neither's, not stored.
  const std::string mixed = Submit(spec("auto"));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(mixed, 0).size() == 1; }));
  StreamSteps(rank_.get(), server_->RankToken(mixed, 0), mixed, 0, 1, 6, 0.1, 0, 0, -1, 20e9, "gemm");
  StreamSteps(rank_.get(), server_->RankToken(mixed, 0), mixed, 0, 1, 6, 0.1, 0, 0, -1, 9e9, "fused");
  agent.Exit(mixed, 0, 0, 0);
  ASSERT_TRUE(WaitState(mixed, v1::SUCCEEDED));
  const std::string mixed_events = EventText(mixed);
  EXPECT_NE(mixed_events.find("not stored (the ranks ran both attention kernels"), std::string::npos)
      << mixed_events;
  EXPECT_EQ(memory_reason(spec("auto")).find("job " + mixed), std::string::npos);
  EXPECT_EQ(memory_reason(spec("gemm")).find("job " + mixed), std::string::npos);
}

// A killed rank's last step samples can arrive after its exit: it stays
// "failed" in dgca status (it used to turn "running" again).
TEST_F(ServerTest, ALateSampleDoesNotReviveAnExitedRank) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1", /*auto_exit_on_stop=*/false);
  const std::string id = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  agent.Exit(id, 0, 0, -1, SIGKILL);
  ASSERT_TRUE(WaitUntil([&] {
    const auto j = Get(id).job();
    return j.ranks_size() == 2 && j.ranks(0).state() == "failed";
  }));
  StreamSteps(rank_.get(), server_->RankToken(id, 0), id, 0, 1, 3, 0.1);  // rank 0, steps 1..3
  ASSERT_TRUE(WaitUntil([&] { return Get(id).job().ranks(0).step() == 3; }));
  EXPECT_EQ(Get(id).job().ranks(0).state(), "failed");
}

// dgca diagnose JOB over the real service: refused until there are enough
// steady-state steps; from a running job's steps, then (after the job ends
// and the coordinator restarts) from the breakdown stored with its plan
// check. A starved loader is named, and its wait is not stored as compute.
TEST_F(ServerTest, DiagnoseJobLiveAndAfterARestart) {
  StartServer();
  auto diagnose = [&](const std::string& id, v1::DiagnoseJobResponse* out) {
    v1::DiagnoseJobRequest req;
    req.set_job_id(id);
    auto ctx = Ctx();
    return coord_->DiagnoseJob(ctx.get(), req, out);
  };
  v1::DiagnoseJobResponse d;
  EXPECT_EQ(diagnose("", &d).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(diagnose("j-none", &d).error_code(), grpc::StatusCode::NOT_FOUND);
  std::string id;
  {
    FakeAgent agent(server_->address(), server_->agent_token(), "n1");
    id = Submit(Spec(0, 2));
    ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
    grpc::Status early = diagnose(id, &d);
    EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(early.error_message().find("0 steady-state rank-step(s) so far"), std::string::npos)
        << early.error_message();
    // 0.1 s steps: 0.03 s waiting for data, 0.01 s exposed all-reduce.
    StreamSteps(rank_.get(), server_->RankToken(id, 0), id, 0, 2, 8, 0.1, 0.01, 0.03);
    ASSERT_TRUE(WaitUntil([&] { return diagnose(id, &d).ok() && d.breakdown().samples() == 12; }))
        << d.ShortDebugString();
    EXPECT_TRUE(d.live());
    EXPECT_EQ(d.state(), v1::RUNNING);
    EXPECT_EQ(d.limiting_stage(), "data");
    EXPECT_NEAR(d.breakdown().compute_seconds(), 0.06, 1e-9);
    ASSERT_EQ(d.breakdown().ranks_size(), 2);
    EXPECT_EQ(d.breakdown().ranks(1).node(), "n1");
    EXPECT_EQ(d.plan().ranks(), 2);
    agent.Exit(id, 0, 0, 0);
    agent.Exit(id, 1, 0, 0);
    ASSERT_TRUE(WaitState(id, v1::SUCCEEDED));
  }
  // The plan check stores compute per micro-step without the data wait.
  const v1::GetJobResponse done = Get(id);
  ASSERT_GT(done.plan().accumulation(), 0);
  EXPECT_NEAR(done.job().plan_check().measured_compute_seconds(),
              0.06 / done.plan().accumulation(), 1e-9);
  server_->Shutdown();
  server_.reset();
  StartServer();
  v1::DiagnoseJobResponse after;
  ASSERT_TRUE(diagnose(id, &after).ok());
  EXPECT_FALSE(after.live());
  EXPECT_EQ(after.state(), v1::SUCCEEDED);
  EXPECT_EQ(after.breakdown().samples(), 12);
  EXPECT_EQ(after.limiting_stage(), "data");
  EXPECT_NEAR(after.breakdown().data_wait_seconds(), 0.03, 1e-9);
  EXPECT_EQ(after.plan().ranks(), 2);
}

// The diagnosis of a long job is of its latest steps: the coordinator keeps
// the newest 20000 rank-steps (a ring), not the first.
TEST_F(ServerTest, DiagnoseReadsTheLatestSteps) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  const std::string id = Submit(Spec(0, 2));
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  auto diagnose = [&](v1::DiagnoseJobResponse* out) {
    v1::DiagnoseJobRequest req;
    req.set_job_id(id);
    auto ctx = Ctx();
    return coord_->DiagnoseJob(ctx.get(), req, out).ok();
  };
  // 2 x 10002 steps at 0.1 s (20000 kept), then 2 x 6000 at 0.3 s: the
  // newest 20000 are 12000 at 0.3 s and 8000 at 0.1 s.
  StreamSteps(rank_.get(), server_->RankToken(id, 0), id, 0, 2, 10002, 0.1);
  v1::DiagnoseJobResponse d;
  ASSERT_TRUE(WaitUntil([&] { return diagnose(&d) && d.breakdown().samples() == 20000; }))
      << d.ShortDebugString();
  EXPECT_DOUBLE_EQ(d.breakdown().step_seconds(), 0.1);
  StreamSteps(rank_.get(), server_->RankToken(id, 0), id, 0, 2, 6000, 0.3);
  ASSERT_TRUE(WaitUntil([&] { return diagnose(&d) && d.breakdown().step_seconds() == 0.3; }))
      << d.breakdown().ShortDebugString();
  EXPECT_EQ(d.breakdown().samples(), 20000);
}

// A coordinator killed during the trials: the job is queued again, the
// trial's orphaned rank is killed, and the trials start over at a later
// attempt (never reusing one the agents may still report on; the attempts
// stay recorded for a second restart).
TEST_F(ServerTest, RestartKillsOrphanedTrialRanksAndTimesAgain) {
  std::string id;
  pid_t child = -1;
  {
    auto store = JobStore::Open(dir_ + "/dgca.db");
    ASSERT_TRUE(store.ok());
    auto parsed = ParseJobSpec(TrialSpecYaml(2), "job.yaml");
    ASSERT_TRUE(parsed.ok());
    auto j = (*store)->CreateJob(parsed->spec, TrialSpecYaml(2));
    ASSERT_TRUE(j.ok());
    id = j->id();
    ASSERT_TRUE((*store)->SetState(id, v1::PLANNING, "trial 2: ...", "trial").ok());
    child = SpawnOrphanRank(id);
    ASSERT_GT(child, 0);
    ASSERT_TRUE((*store)->RecordRank({id, 0, 1, "n1", child, child}).ok());
    ASSERT_TRUE((*store)->RecordRank({id, 1, 1, "n1", 0, 0}).ok());
  }
  StartServer();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(Get(id).job().state(), v1::PENDING);
  {
    // Its attempts stay recorded (without pids) for a second restart.
    auto store = JobStore::Open(dir_ + "/dgca.db");
    ASSERT_TRUE(store.ok());
    auto rows = (*store)->ListRanks(id);
    ASSERT_TRUE(rows.ok());
    ASSERT_EQ(rows->size(), 2u);
    EXPECT_EQ((*rows)[0].attempt, 1);
    EXPECT_EQ((*rows)[0].pid, 0);
  }
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 2).size() == 2; }))
      << Get(id).job().message();
  EXPECT_TRUE(agent.Launches(id, 0).empty());
  EXPECT_TRUE(agent.Launches(id, 1).empty());
}

// A trial whose ranks never end is stopped when tuning.budget_s runs out,
// and the job goes on with the model's plan.
TEST_F(ServerTest, ATrialIsStoppedAtTheBudget) {
  StartServer();
  FakeAgent agent(server_->address(), server_->agent_token(), "n1");
  const std::string id = Submit(
      "name: slow\ntrain: {steps: 10, global_batch: 64}\nresources: {ranks: 2, device: cpu}\n"
      "tuning: {mode: trial, budget_s: 1}\n");
  ASSERT_TRUE(WaitUntil([&] { return agent.Launches(id, 0).size() == 2; }));
  ASSERT_TRUE(WaitUntil([&] { return agent.Stops(id) >= 1; }, milliseconds(8000)));
  int real = -1;
  ASSERT_TRUE(WaitUntil([&] {
    for (int a = 1; a < 5; ++a) {
      if (agent.Launches(id, a).size() == 2) real = a;
    }
    return real > 0 && Get(id).job().state() == v1::RUNNING;
  }, milliseconds(15000)))
      << Get(id).job().message();
  auto j = Get(id);
  EXPECT_NE(j.plan().trials(0).note().find("tuning.budget_s ran out"), std::string::npos)
      << j.plan().trials(0).note();
  bool warned = false;
  for (const auto& w : j.plan().warnings()) warned |= w.find("every tuning trial failed") != std::string::npos;
  EXPECT_TRUE(warned);
}

// A --listen or --metrics-listen port out of range is a usage error
// (exit 2) naming the flag, not a silently wrapped port.
TEST(CoordinatorBinary, BadListenAddressesExit2) {
  const char* build = getenv("DGCA_BUILD_DIR");
  std::string bin = std::string(build ? build : "build") + "/coordinator/dgca-coordinator";
  if (access(bin.c_str(), X_OK) != 0) GTEST_SKIP() << bin << " is not built";
  const std::string dir = TempDir();
  auto run = [&](const std::string& listen, const std::string& metrics, std::string* err,
                 std::vector<std::string> extra = {}) {
    const std::string err_path = dir + "/stderr";
    std::vector<std::string> args = {bin, "--listen", listen, "--metrics-listen", metrics, "--state-dir",
                                     dir + "/state", "--no-local-agent"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 2);
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    int status = 0;
    // A coordinator that did start is stopped after a moment.
    if (!WaitUntil([&] { return waitpid(pid, &status, WNOHANG) == pid; }, milliseconds(5000))) {
      kill(pid, SIGTERM);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::ifstream in(err_path);
    err->assign((std::istreambuf_iterator<char>(in)), {});
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::string err;
  EXPECT_EQ(run("127.0.0.1:99999", "", &err), 2) << err;
  EXPECT_NE(err.find("--listen '127.0.0.1:99999': port 99999 is out of range"), std::string::npos)
      << err;
  EXPECT_EQ(run("127.0.0.1:0", "127.0.0.1:65536", &err), 2) << err;
  EXPECT_NE(err.find("--metrics-listen"), std::string::npos) << err;
  // A bad number of seconds says what is valid in a line (CLI11's own
  // check printed DBL_MAX written out in 300 digits).
  EXPECT_NE(run("127.0.0.1:0", "", &err, {"--heartbeat-timeout", "-1"}), 0) << err;
  EXPECT_NE(err.find("--heartbeat-timeout: expected a number of seconds > 0, got '-1'"), std::string::npos) << err;
  EXPECT_LT(err.size(), 200u) << err;
  EXPECT_NE(run("127.0.0.1:0", "", &err, {"--restart-node-wait", "x"}), 0) << err;
  EXPECT_NE(err.find("--restart-node-wait: expected a number of seconds >= 0, got 'x'"), std::string::npos) << err;
}

TEST(CoordinatorBinary, Kill9RestartKeepsJobs) {
  const char* build = getenv("DGCA_BUILD_DIR");
  std::string bin = std::string(build ? build : "build") + "/coordinator/dgca-coordinator";
  if (access(bin.c_str(), X_OK) != 0) GTEST_SKIP() << bin << " is not built";
  std::string dir = TempDir();
  auto start = [&]() {
    unlink((dir + "/coordinator.json").c_str());
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open("/dev/null", O_WRONLY);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(bin.c_str(), bin.c_str(), "--listen", "127.0.0.1:0", "--metrics-listen", "",
            "--state-dir", dir.c_str(), "--no-local-agent", static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  };
  auto address = [&]() {
    std::string json;
    WaitUntil([&] {
      std::ifstream in(dir + "/coordinator.json");
      json.assign((std::istreambuf_iterator<char>(in)), {});
      return !json.empty();
    });
    size_t a = json.find("\"listen\": \"") + 11;
    return json.substr(a, json.find('"', a) - a);
  };
  pid_t pid = start();
  std::string addr = address();
  ASSERT_FALSE(addr.empty());
  auto token = ReadTokenFile(dir + "/token");
  ASSERT_TRUE(token.ok());
  auto stub = v1::Coordinator::NewStub(MakeChannel(addr));
  v1::SubmitJobRequest req;
  req.set_spec_yaml(Spec());
  v1::SubmitJobResponse resp;
  {
    grpc::ClientContext ctx;
    AddAuth(&ctx, *token);
    ASSERT_TRUE(stub->SubmitJob(&ctx, req, &resp).ok());
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  pid = start();
  addr = address();
  stub = v1::Coordinator::NewStub(MakeChannel(addr));
  v1::GetJobRequest g;
  g.set_job_id(resp.job_id());
  v1::GetJobResponse gr;
  {
    grpc::ClientContext ctx;
    AddAuth(&ctx, *token);
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    grpc::Status s = stub->GetJob(&ctx, g, &gr);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // Nothing had been launched (no agent): queued again, not lost.
  EXPECT_EQ(gr.job().state(), v1::PENDING);
  EXPECT_EQ(gr.job().message(), "coordinator restarted; queued again");
  EXPECT_EQ(gr.events(0).message(), "submitted");
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace dgca
