// The rank runtime against an in-process stand-in for the coordinator's
// RankService: assignment, real (tiny) training, streamed metrics,
// heartbeats, stop requests, lost coordinator, bad token.
#include "worker/rank/rank_main.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "spec/spec.h"
#include "dgca/v1/rank.grpc.pb.h"
#include "model/core/core_test_util.h"
#include "proto/rpc/rpc_util.h"
#include "worker/rank/train_config.h"

namespace dgca {
namespace {

using namespace std::chrono_literals;

class FakeRankService final : public v1::RankService::Service {
 public:
  explicit FakeRankService(v1::GetAssignmentResponse asg) : asg_(std::move(asg)) {}

  grpc::Status GetAssignment(grpc::ServerContext* ctx, const v1::GetAssignmentRequest* req,
                             v1::GetAssignmentResponse* resp) override {
    if (!IsAuthorized(*ctx, "tok")) return Unauthenticated();
    if (req->job_id() != "job-1") return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
    *resp = asg_;
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::RankHeartbeatRequest* req,
                         v1::RankHeartbeatResponse* resp) override {
    if (!IsAuthorized(*ctx, "tok")) return Unauthenticated();
    heartbeats_++;
    last_step_ = req->step();
    if (stop_) {
      resp->set_stop(true);
      resp->set_reason("job cancelled by the test");
    }
    return grpc::Status::OK;
  }
  grpc::Status StreamMetrics(grpc::ServerContext* ctx, grpc::ServerReader<v1::MetricSample>* r,
                             v1::StreamMetricsResponse* resp) override {
    if (!IsAuthorized(*ctx, "tok")) return Unauthenticated();
    v1::MetricSample s;
    int64_t n = 0;
    while (r->Read(&s)) {
      std::lock_guard<std::mutex> l(mu_);
      samples_.push_back(s);
      ++n;
    }
    resp->set_received(n);
    return grpc::Status::OK;
  }

  std::vector<v1::MetricSample> samples() {
    std::lock_guard<std::mutex> l(mu_);
    return samples_;
  }
  std::atomic<bool> stop_{false};
  std::atomic<int> heartbeats_{0};
  std::atomic<int64_t> last_step_{0};

 private:
  v1::GetAssignmentResponse asg_;
  std::mutex mu_;
  std::vector<v1::MetricSample> samples_;
};

class RankMainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* data = std::getenv("DGCA_SHARED_DATA");
    data_ = data ? data : "../shared/data";
    if (access((data_ + "/ecspell/train_law.txt").c_str(), R_OK) != 0) {
      GTEST_SKIP() << "no ECSpell data under " << data_;
    }
    dir_ = testutil::MakeTempDir("rank_main_test");
    ASSERT_FALSE(dir_.empty());
    std::ofstream(dir_ + "/token") << "tok\n";
    std::ofstream(dir_ + "/bad-token") << "nope\n";
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + 1s);
  }
  void StartServer(int64_t steps) {
    auto parsed = ParseJobSpec("name: r\nmodel: {preset: tiny}\n"
                               "data: {train: " + data_ + "/ecspell/train_law.txt, eval: " +
                                   data_ + "/ecspell/test_law.txt, max_seq_len: 24}\n"
                               "train: {steps: " + std::to_string(steps) +
                                   ", global_batch: 4, eval_every: 0, checkpoint_every: 0}\n"
                               "resources: {ranks: 1, device: cpu, threads_per_rank: 1}\n",
                               "r.yaml");
    ASSERT_TRUE(parsed.ok() && parsed->ok());
    v1::GetAssignmentResponse asg;
    *asg.mutable_spec() = parsed->spec;
    *asg.mutable_plan() = SimplePlan(parsed->spec, 1);
    asg.set_rank(0);
    asg.set_world_size(1);
    service_ = std::make_unique<FakeRankService>(asg);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  RankArgs Args() {
    RankArgs a;
    a.coordinator = "127.0.0.1:" + std::to_string(port_);
    a.token_file = dir_ + "/token";
    a.job_id = "job-1";
    a.rank = 0;
    a.heartbeat_interval_s = 0.1;
    a.heartbeat_timeout_s = 2;
    return a;
  }

  std::string data_, dir_;
  int port_ = 0;
  std::unique_ptr<FakeRankService> service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(RankMainTest, TrainsAndStreamsMetrics) {
  StartServer(3);
  EXPECT_EQ(RunRank(Args()), 0);
  auto samples = service_->samples();
  int steps = 0, evals = 0, logs = 0;
  int64_t last_step = 0;
  for (const auto& s : samples) {
    if (s.has_step()) {
      ++steps;
      EXPECT_EQ(s.step().job_id(), "job-1");
      EXPECT_EQ(s.step().total_steps(), 3);
      EXPECT_GT(s.step().loss(), 0);
      EXPECT_GT(s.step().time_unix_ms(), 0);
      last_step = s.step().step();
    }
    if (s.has_eval()) {
      ++evals;
      EXPECT_TRUE(s.eval().metrics().count("sentence_correction_f1"));
    }
    logs += s.has_log_line();
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(last_step, 3);
  EXPECT_EQ(evals, 1);
  EXPECT_GT(logs, 0);
}

TEST_F(RankMainTest, HeartbeatStopEndsTraining) {
  StartServer(1000000);
  std::thread t([&] {
    for (int i = 0; i < 600 && service_->last_step_ < 2; ++i) std::this_thread::sleep_for(50ms);
    service_->stop_ = true;
  });
  auto t0 = std::chrono::steady_clock::now();
  int rc = RunRank(Args());
  t.join();
  EXPECT_EQ(rc, kExitStopped);
  EXPECT_GE(service_->last_step_.load(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 40s);
}

TEST_F(RankMainTest, LostCoordinatorStopsTheRank) {
  StartServer(1000000);
  std::thread t([&] {
    for (int i = 0; i < 600 && service_->last_step_ < 2; ++i) std::this_thread::sleep_for(50ms);
    server_->Shutdown(std::chrono::system_clock::now());
  });
  int rc = RunRank(Args());
  t.join();
  EXPECT_EQ(rc, 3);
}

TEST_F(RankMainTest, UnreachableCoordinatorExits3) {
  RankArgs a;
  a.coordinator = "127.0.0.1:1";
  a.token_file = dir_ + "/token";
  a.job_id = "job-1";
  a.heartbeat_timeout_s = 0.5;
  EXPECT_EQ(RunRank(a), 3);
}

TEST_F(RankMainTest, BadTokenOrUnknownJob) {
  StartServer(1);
  RankArgs a = Args();
  a.token_file = dir_ + "/bad-token";
  EXPECT_EQ(RunRank(a), 3);
  a.token_file = dir_ + "/missing-token";
  EXPECT_EQ(RunRank(a), 3);
  a = Args();
  a.job_id = "other";
  EXPECT_EQ(RunRank(a), 2);
}

}  // namespace
}  // namespace dgca
