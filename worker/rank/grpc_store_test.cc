#include "worker/rank/grpc_store.h"

#include <gloo/common/error.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "model/comm/gloo_communicator.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace {

using namespace std::chrono_literals;

// The coordinator's rendezvous store in miniature: keys namespaced by job and
// attempt, StoreWait blocks until every key exists or the timeout.
class FakeRankService final : public v1::RankService::Service {
 public:
  grpc::Status StoreSet(grpc::ServerContext* ctx, const v1::StoreSetRequest* req,
                        v1::StoreSetResponse*) override {
    if (!IsAuthorized(*ctx, "tok")) return Unauthenticated();
    std::lock_guard<std::mutex> l(mu_);
    kv_[Key(req->job_id(), req->attempt(), req->key())] = req->value();
    cv_.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status StoreGet(grpc::ServerContext* ctx, const v1::StoreGetRequest* req,
                        v1::StoreGetResponse* resp) override {
    if (!IsAuthorized(*ctx, "tok")) return Unauthenticated();
    std::lock_guard<std::mutex> l(mu_);
    auto it = kv_.find(Key(req->job_id(), req->attempt(), req->key()));
    resp->set_found(it != kv_.end());
    if (it != kv_.end()) resp->set_value(it->second);
    return grpc::Status::OK;
  }
  grpc::Status StoreWait(grpc::ServerContext* ctx, const v1::StoreWaitRequest* req,
                         v1::StoreWaitResponse*) override {
    if (!IsAuthorized(*ctx, "tok")) return Unauthenticated();
    std::unique_lock<std::mutex> l(mu_);
    bool ok = cv_.wait_for(l, std::chrono::duration<double>(req->timeout_seconds()), [&] {
      for (const auto& k : req->keys()) {
        if (!kv_.count(Key(req->job_id(), req->attempt(), k))) return false;
      }
      return true;
    });
    if (!ok) return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "keys did not appear");
    return grpc::Status::OK;
  }

 private:
  static std::string Key(const std::string& j, int a, const std::string& k) {
    return j + "/" + std::to_string(a) + "/" + k;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

class GrpcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = MakeChannel("127.0.0.1:" + std::to_string(port_));
  }
  void TearDown() override { server_->Shutdown(); }
  std::shared_ptr<GrpcStore> Store(const std::string& job, int attempt,
                                   const std::string& token = "tok",
                                   std::chrono::milliseconds timeout = 5s) {
    return std::make_shared<GrpcStore>(channel_, token, job, attempt, timeout);
  }

  FakeRankService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(GrpcStoreTest, SetThenGet) {
  auto s = Store("j", 0);
  std::vector<char> v = {'a', '\0', 'b'};
  s->set("k", v);
  EXPECT_EQ(s->get("k"), v);
}

TEST_F(GrpcStoreTest, GetBlocksUntilSet) {
  auto reader = Store("j", 0);
  auto writer = Store("j", 0);
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    writer->set("late", {'x'});
  });
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(reader->get("late"), std::vector<char>{'x'});
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 150ms);
  t.join();
}

TEST_F(GrpcStoreTest, AttemptsAreSeparate) {
  Store("j", 0)->set("k", {'0'});
  EXPECT_THROW(Store("j", 1, "tok", 200ms)->get("k"), gloo::IoException);
}

TEST_F(GrpcStoreTest, WaitTimesOutWithIoException) {
  auto s = Store("j", 0);
  try {
    s->wait({"never"}, 200ms);
    FAIL() << "wait returned";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
}

TEST_F(GrpcStoreTest, WrongTokenThrows) {
  auto s = Store("j", 0, "bad");
  try {
    s->set("k", {'1'});
    FAIL() << "set succeeded";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("token"), std::string::npos) << e.what();
  }
}

TEST_F(GrpcStoreTest, UnreachableCoordinatorThrows) {
  auto ch = MakeChannel("127.0.0.1:1");
  GrpcStore s(ch, "tok", "j", 0, 500ms);
  EXPECT_THROW(s.set("k", {'1'}), gloo::IoException);
}

// Two Gloo ranks rendezvous through the gRPC store and all-reduce.
TEST_F(GrpcStoreTest, GlooRendezvousOverGrpc) {
  const int world = 2;
  std::vector<std::vector<float>> data(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.timeout = 10s;
      auto comm = MakeGlooCommunicator(Store("gloo-job", 3), r, world, o);
      if (!comm.ok()) {
        errors[r] = comm.status().ToString();
        return;
      }
      data[r] = {1.0f + r, 10.0f * (r + 1)};
      Status s = (*comm)->AllReduce(data[r].data(), data[r].size(), ReduceOp::kSum);
      if (!s.ok()) errors[r] = s.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(data[r].size(), 2u);
    EXPECT_FLOAT_EQ(data[r][0], 3.0f);
    EXPECT_FLOAT_EQ(data[r][1], 30.0f);
  }
}

}  // namespace
}  // namespace dgca
