#include "worker/rank/grpc_store.h"

#include <gloo/common/error.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace {

constexpr auto kRpcSlack = std::chrono::seconds(10);

[[noreturn]] void Throw(const std::string& what, const grpc::Status& s) {
  throw ::gloo::IoException(absl::StrCat("rendezvous store ", what, ": ",
                                         static_cast<int>(s.error_code()), " ",
                                         s.error_message()));
}

}  // namespace

GrpcStore::GrpcStore(std::shared_ptr<grpc::Channel> channel, std::string token,
                     std::string job_id, int attempt, std::chrono::milliseconds timeout)
    : stub_(v1::RankService::NewStub(channel)),
      token_(std::move(token)),
      job_id_(std::move(job_id)),
      attempt_(attempt),
      timeout_(timeout) {}

void GrpcStore::set(const std::string& key, const std::vector<char>& data) {
  grpc::ClientContext ctx;
  AddAuth(&ctx, token_);
  // One quick call, like get's; the store's timeout is for waits. A rank
  // reporting a failed collective (GlooCommunicator::ErrorFor) while the
  // coordinator does not answer must not sit out the whole comm timeout.
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcSlack);
  v1::StoreSetRequest req;
  req.set_job_id(job_id_);
  req.set_attempt(attempt_);
  req.set_key(key);
  req.set_value(std::string(data.begin(), data.end()));
  v1::StoreSetResponse resp;
  grpc::Status s = stub_->StoreSet(&ctx, req, &resp);
  if (!s.ok()) Throw(absl::StrCat("set ", key), s);
}

std::vector<char> GrpcStore::get(const std::string& key) {
  wait({key}, timeout_);
  grpc::ClientContext ctx;
  AddAuth(&ctx, token_);
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcSlack);
  v1::StoreGetRequest req;
  req.set_job_id(job_id_);
  req.set_attempt(attempt_);
  req.set_key(key);
  v1::StoreGetResponse resp;
  grpc::Status s = stub_->StoreGet(&ctx, req, &resp);
  if (!s.ok()) Throw(absl::StrCat("get ", key), s);
  if (!resp.found()) {
    Throw(absl::StrCat("get ", key),
          grpc::Status(grpc::StatusCode::NOT_FOUND, "key vanished after wait"));
  }
  return std::vector<char>(resp.value().begin(), resp.value().end());
}

void GrpcStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GrpcStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  grpc::ClientContext ctx;
  AddAuth(&ctx, token_);
  ctx.set_deadline(std::chrono::system_clock::now() + timeout + kRpcSlack);
  v1::StoreWaitRequest req;
  req.set_job_id(job_id_);
  req.set_attempt(attempt_);
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_seconds(timeout.count() / 1000.0);
  v1::StoreWaitResponse resp;
  grpc::Status s = stub_->StoreWait(&ctx, req, &resp);
  if (!s.ok()) Throw(absl::StrCat("wait [", absl::StrJoin(keys, ", "), "]"), s);
}

}  // namespace dgca
