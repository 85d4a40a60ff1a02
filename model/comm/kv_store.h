// KeyValueStore: the tiny rendezvous store a communicator needs to exchange
// bootstrap data (the NCCL unique id). model/ stays free of Gloo and gRPC:
// the worker adapts its store (gloo::rendezvous::Store over the coordinator's
// gRPC store; model/comm/gloo_kv_store.h) and tests use MemoryKeyValueStore.
//
// Keys are plain strings; values are bytes. A key is written once per
// communicator (callers use a fresh key space per job attempt).
//
// Thread-safety: implementations must be thread-safe.
#ifndef DGCA_MODEL_COMM_KV_STORE_H_
#define DGCA_MODEL_COMM_KV_STORE_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <string>

#include "model/core/mutex.h"
#include "model/core/status.h"

namespace dgca {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists (DEADLINE_EXCEEDED after `timeout`), then
  // returns its value.
  virtual StatusOr<std::string> Wait(const std::string& key,
                                     std::chrono::milliseconds timeout) = 0;
};

// In-process store (tests; ranks that are threads of one process).
class MemoryKeyValueStore : public KeyValueStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    MutexLock l(&mu_);
    values_[key] = value;
    cv_.notify_all();
    return OkStatus();
  }
  StatusOr<std::string> Wait(const std::string& key,
                             std::chrono::milliseconds timeout) override {
    MutexLock l(&mu_);
    if (!mu_.WaitFor(cv_, timeout, [&]() DGCA_REQUIRES(mu_) { return values_.count(key) > 0; })) {
      return DeadlineExceededError("key '" + key + "' did not appear in the store within " +
                                      std::to_string(timeout.count()) + " ms");
    }
    return values_[key];
  }

 private:
  Mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_ DGCA_GUARDED_BY(mu_);
};

}  // namespace dgca

#endif  // DGCA_MODEL_COMM_KV_STORE_H_
