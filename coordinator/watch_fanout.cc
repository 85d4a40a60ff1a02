#include "coordinator/watch_fanout.h"

#include <algorithm>
#include <utility>

#include "absl/time/time.h"

namespace dgca {

bool WatchSubscription::Next(v1::WatchJobResponse* out, std::chrono::milliseconds timeout) {
  absl::MutexLock l(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !q_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout))) return false;
  *out = std::move(q_.front());
  q_.pop_front();
  return true;
}

void WatchSubscription::Push(v1::WatchJobResponse u) {
  absl::MutexLock l(&mu_);
  if (q_.size() >= kMaxQueued) {
    // Drop the oldest metric sample (events are never dropped).
    auto it = std::find_if(q_.begin(), q_.end(),
                           [](const v1::WatchJobResponse& x) { return !x.has_event(); });
    if (it != q_.end()) q_.erase(it);
  }
  q_.push_back(std::move(u));
}

std::shared_ptr<WatchSubscription> WatchFanout::Subscribe(const std::string& job) {
  auto sub = std::make_shared<WatchSubscription>();
  absl::MutexLock l(&mu_);
  watchers_[job].push_back(sub);
  return sub;
}

void WatchFanout::Unsubscribe(const std::string& job,
                              const std::shared_ptr<WatchSubscription>& sub) {
  absl::MutexLock l(&mu_);
  auto it = watchers_.find(job);
  if (it == watchers_.end()) return;
  it->second.remove(sub);
  if (it->second.empty()) watchers_.erase(it);
}

void WatchFanout::HandOver(const std::string& job, const std::shared_ptr<WatchSubscription>& from,
                           const std::shared_ptr<WatchSubscription>& to) {
  absl::MutexLock l(&mu_);
  auto& list = watchers_[job];
  list.remove(from);
  v1::WatchJobResponse u;
  while (from->Next(&u, std::chrono::milliseconds(0))) to->Push(std::move(u));
  list.push_back(to);
}

void WatchFanout::Publish(const std::string& job, const v1::WatchJobResponse& u) {
  absl::MutexLock l(&mu_);
  auto it = watchers_.find(job);
  if (it == watchers_.end()) return;
  for (auto& w : it->second) w->Push(u);
}

bool WatchFanout::HasWatchers(const std::string& job) {
  absl::MutexLock l(&mu_);
  return watchers_.count(job) > 0;
}

}  // namespace dgca
