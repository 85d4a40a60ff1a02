// What a coordinator started on an existing state dir finds (after kill -9,
// a crash or an upgrade), read from the job store: for every job that was
// active, whether it is queued again, re-adopted with its running ranks, or
// failed because its ranks cannot be known. The scheduler applies the
// result (events, /metrics, the embedded agent's adoptions);
// docs/operations.md tells the whole story.
//
// Thread-safety: the functions take no locks; the job store is thread-safe.
#ifndef DGCA_COORDINATOR_RECOVERY_H_
#define DGCA_COORDINATOR_RECOVERY_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/clock.h"
#include "coordinator/job_runtime.h"
#include "coordinator/job_store.h"

namespace dgca {

// A stop under way when the coordinator died, read back from the events:
// the newest of the events that start a stop ("stop") or show the job
// running ("restart", "state"); its reason is the newest "rank_exit" before
// it.
struct InterruptedStop {
  StopAction action = StopAction::kNone;
  std::string message;
};
std::optional<InterruptedStop> InterruptedStopOf(const std::vector<v1::JobEvent>& events);

// Kills the process group of a recorded rank when /proc/PID/cmdline still
// mentions its job id (so a reused pid is never hit). True when it killed.
bool KillOrphan(const StoredRank& r);

// Kills the recorded rank processes of a job that cannot go on, an "info"
// event per kill ("killed orphaned WHAT R (pid P, attempt A)"), and forgets
// the records.
void KillOrphans(JobStore* store, const std::string& job_id, const std::vector<StoredRank>& ranks,
                 const std::string& what);

struct RecoveredJob {
  enum Kind {
    kRequeue,  // PENDING or PLANNING: queued again, planned afresh (trial ranks killed)
    kReadopt,  // RUNNING with every rank known: its ranks are re-adopted
    kFail,     // RUNNING but its ranks cannot be known: FAILED with fail_message
  };
  Kind kind = kRequeue;
  v1::JobState stored_state = v1::PENDING;
  std::unique_ptr<JobRt> rt;      // kRequeue, kReadopt
  v1::Job stored;                 // kFail: the job as stored
  std::string fail_message;       // kFail
  std::string fail_reason;        // kFail: why it cannot be re-adopted
  std::vector<StoredRank> adopted;  // kReadopt: ranks that have not exited
  // kReadopt: a stop that was under way (cancel, failure, restart), or a
  // rank failure stored without the stop it led to.
  std::optional<InterruptedStop> stop;
};

// Every job that was PENDING, PLANNING or RUNNING, in submission order.
// Kills orphaned trial ranks and unadoptable ranks on the way (KillOrphans)
// and stores FAILED for kFail jobs. `now` starts re-adopted ranks' heartbeat
// clocks.
absl::StatusOr<std::vector<RecoveredJob>> RecoverJobs(JobStore* store, Clock::TimePoint now);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_RECOVERY_H_
