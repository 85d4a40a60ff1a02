// GrpcStore: a gloo::rendezvous::Store backed by the coordinator's rendezvous
// key-value store (RankService StoreSet / StoreGet / StoreWait). The
// coordinator namespaces keys per job and attempt, so a restarted attempt
// never sees an earlier attempt's keys.
//
// Gloo reports store failures as exceptions: every failure (coordinator
// unreachable, timeout, authentication) throws gloo::IoException with the
// gRPC status in its message. MakeGlooCommunicator catches them.
//
// Thread-safety: thread-safe (each call is an independent RPC on a shared
// channel).
#ifndef DGCA_WORKER_RANK_GRPC_STORE_H_
#define DGCA_WORKER_RANK_GRPC_STORE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "dgca/v1/rank.grpc.pb.h"

namespace dgca {

class GrpcStore : public gloo::rendezvous::Store {
 public:
  // `timeout`: the bound for wait() without a timeout and for get(); set()
  // and get()'s own call have 10 s each.
  GrpcStore(std::shared_ptr<grpc::Channel> channel, std::string token, std::string job_id,
            int attempt, std::chrono::milliseconds timeout = std::chrono::seconds(60));

  void set(const std::string& key, const std::vector<char>& data) override;
  // Blocks until the key exists (at most the timeout), then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::unique_ptr<v1::RankService::Stub> stub_;
  std::string token_;
  std::string job_id_;
  int attempt_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dgca

#endif  // DGCA_WORKER_RANK_GRPC_STORE_H_
