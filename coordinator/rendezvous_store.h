// In-memory rendezvous key-value store that ranks use (through RankService)
// to exchange the NCCL unique id or to build a Gloo context. Keys live in a
// namespace per (job, attempt), so a restarted attempt never sees the stale
// keys of the one before; ClearJob drops every attempt of a job when it ends.
//
// Semantics (what RankService exposes):
//  - Set overwrites. Get returns nullopt when absent.
//  - Add treats the value as a decimal int64 (absent = 0), adds delta and
//    returns the new value; FAILED_PRECONDITION when the value is not a number.
//  - Wait blocks until every key exists: OK; DEADLINE_EXCEEDED after
//    `timeout` naming the missing keys; ABORTED when the namespace is cleared
//    while waiting (the job ended); CANCELLED when `cancelled()` turns true
//    (the client went away).
//  - Bounds: key <= 512 bytes, value <= 1 MiB, <= 4096 keys and <= 64 MiB per
//    namespace, <= 4096 namespaces: RESOURCE_EXHAUSTED / INVALID_ARGUMENT.
//
// Thread-safety: all methods are thread-safe.
#ifndef DGCA_COORDINATOR_RENDEZVOUS_STORE_H_
#define DGCA_COORDINATOR_RENDEZVOUS_STORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dgca {

class RendezvousStore {
 public:
  struct Limits {
    size_t max_key_bytes = 512;
    size_t max_value_bytes = 1 << 20;
    size_t max_keys_per_namespace = 4096;
    size_t max_bytes_per_namespace = 64 << 20;
    size_t max_namespaces = 4096;
  };
  RendezvousStore() = default;
  explicit RendezvousStore(Limits limits) : limits_(limits) {}

  absl::Status Set(const std::string& job, int32_t attempt, const std::string& key,
                   std::string value);
  absl::StatusOr<std::optional<std::string>> Get(const std::string& job, int32_t attempt,
                                                 const std::string& key);
  absl::StatusOr<int64_t> Add(const std::string& job, int32_t attempt, const std::string& key,
                              int64_t delta);
  absl::Status Wait(const std::string& job, int32_t attempt, const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout,
                    const std::function<bool()>& cancelled = nullptr);

  // Drops every namespace of `job` and wakes its waiters (ABORTED).
  void ClearJob(const std::string& job);
  // Drops the namespaces of `job` with attempt < `attempt`.
  void ClearAttemptsBefore(const std::string& job, int32_t attempt);
  size_t NamespaceCount();

 private:
  using Ns = std::pair<std::string, int32_t>;
  struct Space {
    std::map<std::string, std::string> kv;
    size_t bytes = 0;
  };
  absl::Status CheckKey(const std::string& key) const;
  // Returns the namespace, creating it; nullptr when there are too many.
  Space* GetOrCreate(const Ns& ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Limits limits_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // a key was set or a job cleared
  std::map<Ns, Space> spaces_ ABSL_GUARDED_BY(mu_);
  uint64_t clear_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // job -> generation of its last clear
  std::map<std::string, uint64_t> cleared_at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_RENDEZVOUS_STORE_H_
