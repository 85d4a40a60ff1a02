// WatchJob's fan-out: each subscriber of a job gets its events, metric
// samples and snapshots through a bounded queue of its own, so one slow
// `dgca watch` never holds up the scheduler or the other watchers.
//
// Thread-safety: all methods are thread-safe. WatchFanout's lock is taken
// inside the scheduler's (the scheduler publishes while holding its own);
// never the other way round.
#ifndef DGCA_COORDINATOR_WATCH_FANOUT_H_
#define DGCA_COORDINATOR_WATCH_FANOUT_H_

#include <chrono>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "dgca/v1/coordinator.pb.h"

namespace dgca {

// A WatchJob subscription: a bounded queue of updates. When it is full the
// oldest metric sample is dropped; events are never dropped.
class WatchSubscription {
 public:
  // Blocks up to `timeout` for the next update; false when none.
  bool Next(v1::WatchJobResponse* out, std::chrono::milliseconds timeout);
  void Push(v1::WatchJobResponse u);

 private:
  static constexpr size_t kMaxQueued = 4096;
  absl::Mutex mu_;
  std::deque<v1::WatchJobResponse> q_ ABSL_GUARDED_BY(mu_);
};

class WatchFanout {
 public:
  std::shared_ptr<WatchSubscription> Subscribe(const std::string& job);
  void Unsubscribe(const std::string& job, const std::shared_ptr<WatchSubscription>& sub);
  // Atomically with respect to Publish: `from` leaves the job's list, what
  // it still holds moves to `to`, and `to` joins the list (a replay queue
  // taking over a subscription that buffered live updates meanwhile).
  void HandOver(const std::string& job, const std::shared_ptr<WatchSubscription>& from,
                const std::shared_ptr<WatchSubscription>& to);
  void Publish(const std::string& job, const v1::WatchJobResponse& u);
  bool HasWatchers(const std::string& job);

 private:
  absl::Mutex mu_;
  std::map<std::string, std::list<std::shared_ptr<WatchSubscription>>> watchers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_WATCH_FANOUT_H_
