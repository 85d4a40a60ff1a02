#include "coordinator/rendezvous_store.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace dgca {

absl::Status RendezvousStore::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("rendezvous key must not be empty");
  if (key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous key of ", key.size(),
                                                   " bytes; at most ", limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

RendezvousStore::Space* RendezvousStore::GetOrCreate(const Ns& ns) {
  auto it = spaces_.find(ns);
  if (it != spaces_.end()) return &it->second;
  if (spaces_.size() >= limits_.max_namespaces) return nullptr;
  return &spaces_[ns];
}

absl::Status RendezvousStore::Set(const std::string& job, int32_t attempt, const std::string& key,
                                  std::string value) {
  absl::Status s = CheckKey(key);
  if (!s.ok()) return s;
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous value for '", key, "' is ",
                                                   value.size(), " bytes; at most ",
                                                   limits_.max_value_bytes));
  }
  {
    absl::MutexLock lock(&mu_);
    Space* sp = GetOrCreate({job, attempt});
    if (sp == nullptr) return absl::ResourceExhaustedError("too many rendezvous namespaces");
    auto it = sp->kv.find(key);
    size_t old = it == sp->kv.end() ? 0 : it->first.size() + it->second.size();
    size_t add = key.size() + value.size();
    if (it == sp->kv.end() && sp->kv.size() >= limits_.max_keys_per_namespace) {
      return absl::ResourceExhaustedError(absl::StrCat("rendezvous namespace of job ", job,
                                                       " is full (", sp->kv.size(), " keys)"));
    }
    if (sp->bytes - old + add > limits_.max_bytes_per_namespace) {
      return absl::ResourceExhaustedError(
          absl::StrCat("rendezvous namespace of job ", job, " would exceed ",
                       limits_.max_bytes_per_namespace, " bytes"));
    }
    sp->bytes = sp->bytes - old + add;
    sp->kv[key] = std::move(value);
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> RendezvousStore::Get(const std::string& job,
                                                                int32_t attempt,
                                                                const std::string& key) {
  absl::Status s = CheckKey(key);
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto sp = spaces_.find({job, attempt});
  if (sp == spaces_.end()) return std::optional<std::string>();
  auto it = sp->second.kv.find(key);
  if (it == sp->second.kv.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& job, int32_t attempt,
                                             const std::string& key, int64_t delta) {
  absl::Status s = CheckKey(key);
  if (!s.ok()) return s;
  int64_t result;
  {
    absl::MutexLock lock(&mu_);
    Space* sp = GetOrCreate({job, attempt});
    if (sp == nullptr) return absl::ResourceExhaustedError("too many rendezvous namespaces");
    auto it = sp->kv.find(key);
    int64_t cur = 0;
    if (it != sp->kv.end()) {
      errno = 0;
      char* end = nullptr;
      cur = std::strtoll(it->second.c_str(), &end, 10);
      if (it->second.empty() || *end != '\0' || errno != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("rendezvous key '", key, "' holds a non-numeric value; Add needs an integer"));
      }
    } else if (sp->kv.size() >= limits_.max_keys_per_namespace) {
      return absl::ResourceExhaustedError("rendezvous namespace is full");
    }
    result = cur + delta;
    std::string v = std::to_string(result);
    size_t old = it == sp->kv.end() ? 0 : key.size() + it->second.size();
    sp->bytes = sp->bytes - old + key.size() + v.size();
    sp->kv[key] = std::move(v);
  }
  cv_.SignalAll();
  return result;
}

absl::Status RendezvousStore::Wait(const std::string& job, int32_t attempt,
                                   const std::vector<std::string>& keys,
                                   std::chrono::milliseconds timeout,
                                   const std::function<bool()>& cancelled) {
  for (const auto& k : keys) {
    absl::Status s = CheckKey(k);
    if (!s.ok()) return s;
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  absl::MutexLock lock(&mu_);
  const uint64_t start_gen = cleared_at_.count(job) ? cleared_at_[job] : 0;
  while (true) {
    std::vector<std::string> missing;
    auto sp = spaces_.find({job, attempt});
    for (const auto& k : keys) {
      if (sp == spaces_.end() || sp->second.kv.count(k) == 0) missing.push_back(k);
    }
    if (missing.empty()) return absl::OkStatus();
    auto cg = cleared_at_.find(job);
    if (cg != cleared_at_.end() && cg->second != start_gen) {
      return absl::AbortedError(absl::StrCat("job ", job, " ended while waiting for keys"));
    }
    if (cancelled && cancelled()) return absl::CancelledError("client went away");
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous keys not set within ", timeout.count() / 1000.0, " s: ",
          absl::StrJoin(missing, ", "), " (job ", job, ", attempt ", attempt, ")"));
    }
    auto slice = std::min<std::chrono::steady_clock::duration>(deadline - now,
                                                               std::chrono::milliseconds(200));
    cv_.WaitWithTimeout(&mu_, absl::FromChrono(slice));
  }
}

void RendezvousStore::ClearJob(const std::string& job) {
  {
    absl::MutexLock lock(&mu_);
    for (auto it = spaces_.begin(); it != spaces_.end();) {
      it = it->first.first == job ? spaces_.erase(it) : std::next(it);
    }
    cleared_at_[job] = ++clear_generation_;
  }
  cv_.SignalAll();
}

void RendezvousStore::ClearAttemptsBefore(const std::string& job, int32_t attempt) {
  absl::MutexLock lock(&mu_);
  for (auto it = spaces_.begin(); it != spaces_.end();) {
    bool drop = it->first.first == job && it->first.second < attempt;
    it = drop ? spaces_.erase(it) : std::next(it);
  }
}

size_t RendezvousStore::NamespaceCount() {
  absl::MutexLock lock(&mu_);
  return spaces_.size();
}

}  // namespace dgca
