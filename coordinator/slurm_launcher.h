// The allocations of launcher: slurm jobs (docs/slurm.md), driven from a
// thread of its own so that the scheduler never waits for Slurm's tools:
// the scheduler asks (Request, Cancel, Release) and reads what is known
// (Get), the thread writes the sbatch scripts, submits them, records each
// allocation in the job store (so a restarted coordinator finds it again),
// polls squeue, cancels, and calls `changed` whenever something moved.
//
// One allocation per (job, attempt): a restart whose allocation is gone
// gets a new one; one whose allocation still runs goes on in it.
//
// Thread-safety: all methods are thread-safe. `changed` is called without
// the launcher's lock held, so it may take the scheduler's (which is taken
// before the launcher's when the scheduler calls in).
#ifndef DGCA_COORDINATOR_SLURM_LAUNCHER_H_
#define DGCA_COORDINATOR_SLURM_LAUNCHER_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_store.h"
#include "coordinator/slurm.h"

namespace dgca {

class SlurmLauncher {
 public:
  SlurmLauncher(Slurm slurm, JobStore* store, std::function<void()> changed,
                double poll_s = 2);
  ~SlurmLauncher();
  void Start();

  // What is known of one allocation.
  struct Allocation {
    std::string id;          // Slurm's job id ("" until sbatch returned)
    std::string script;      // the sbatch script's path
    std::string state;       // squeue's state; "" before the first poll
    std::string reason;      // why it waits
    std::string nodes;       // its node list once running
    std::string error;       // sbatch failed (Slurm's message), or squeue lost it
    bool submitted = false;  // sbatch returned an id
    bool gone = false;       // Slurm no longer lists it, or it has ended
  };

  // Asks for an allocation for (job, attempt): writes `script` to
  // `script_path` and submits it. Nothing happens when one was asked for
  // already.
  void Request(const std::string& job, int attempt, const std::string& script_path,
               const std::string& script);
  // An allocation the job store remembers (a restarted coordinator): polled,
  // not submitted again.
  void Track(const std::string& job, int attempt, const std::string& allocation_id,
             const std::string& script_path);
  // scancel of (job, attempt)'s allocation (once it has an id).
  void Cancel(const std::string& job, int attempt);
  // The job is over: after `delay_s` (time for released agents to end on
  // their own) every allocation of it still active is cancelled, and the
  // job is forgotten.
  void Release(const std::string& job, double delay_s);
  std::optional<Allocation> Get(const std::string& job, int attempt) const;
  // Cancels now (blocking, without waiting for the thread) the allocations
  // of every job released so far, and forgets them: a coordinator that
  // shuts its jobs down leaves nothing queued or running in Slurm.
  void CancelAll();

 private:
  using Key = std::pair<std::string, int>;
  struct Entry {
    Allocation a;
    std::string text;          // the script, until written and submitted
    bool cancel = false;       // scancel once submitted
    bool cancelled = false;
  };
  void Loop();
  // One pass: submit, cancel, poll, release. Returns whether anything changed.
  bool Pass();

  const Slurm slurm_;
  JobStore* const store_;
  const std::function<void()> changed_;
  const double poll_s_;

  mutable absl::Mutex mu_;
  std::map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> releases_ ABSL_GUARDED_BY(mu_);  // job -> monotonic deadline (s)
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_SLURM_LAUNCHER_H_
