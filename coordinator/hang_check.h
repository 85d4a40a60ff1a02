// The progress timeout (train.progress_timeout_s; docs/operations.md
// "Hangs"): from the phases the ranks report in their heartbeats, whether
// the job has stopped advancing, which rank is stuck and what the others
// are doing, in one message.
//
// A rank's "stuck" time is the time since its last progress (a phase change,
// an eval batch) as it reported, plus the time since that heartbeat: a rank
// that stops sending heartbeats (SIGSTOP, a frozen node) keeps ageing in its
// last reported phase.
//
// Who is to blame (the "stuck" rank; the others are "waiting"), in order:
//   1. ranks that have gone silent (no heartbeat for longer than
//      SilentAfterSeconds of their interval): frozen;
//   2. else ranks outside a collective (data, forward, backward, optimizer,
//      checkpoint, eval): the collective's other ranks wait for them;
//   3. else (all that reported wait in collectives) the ranks that have
//      not reported a phase yet, if any; else those behind the rest (the
//      lowest step, then phase, then all-reduce index); if all are in the
//      same one, all of them: the collective itself does not complete.
// It fires when a blamed rank has been stuck for the timeout, or any rank
// for twice the timeout (a blame that would never fire cannot hide a hang).
//
// Thread-safety: plain functions over caller-guarded state.
#ifndef DGCA_COORDINATOR_HANG_CHECK_H_
#define DGCA_COORDINATOR_HANG_CHECK_H_

#include <string>
#include <vector>

#include "coordinator/clock.h"
#include "coordinator/job_runtime.h"
#include "dgca/v1/job.pb.h"

namespace dgca {

// One running rank as the check sees it.
struct RankHangView {
  int rank = 0;
  std::string node;
  bool has_phase = false;       // it reported one (it is then in `phase`)
  v1::RankPhase phase;          // seconds: stuck for that long as of now
  double heartbeat_age_s = 0;   // since its last heartbeat (no phase: its last contact)
  bool silent = false;          // heartbeat_age_s past SilentAfterSeconds
  // A silent rank whose step metrics came after its last phase report: the
  // step it finished last (phase.seconds then counts from that step's
  // report); 0 = its phase report is its latest news.
  int64_t finished_step = 0;
};

// A rank is silent after missing about two heartbeats: 2.5 intervals, at
// least interval + 3 s (interval <= 0 counts as the ranks' default, 2 s).
double SilentAfterSeconds(double heartbeat_interval_s);

// The message when the job has stopped advancing (see above), "" when not.
// `views` are the ranks that have not ended; timeout_s > 0.
std::string DescribeHang(const std::vector<RankHangView>& views, double timeout_s);

// The running ranks of rt's current attempt as of `now`.
std::vector<RankHangView> HangViewsOf(const JobRt& rt, Clock::TimePoint now);

// DescribeHang over rt's ranks; "" when timeout_s <= 0.
std::string ProgressStallOf(const JobRt& rt, Clock::TimePoint now, double timeout_s);

// For the message of a rank that failed (a collective's timeout, typically
// "gloo allreduce timed out" after comm.timeout_s) while another is stuck,
// whose failure it mostly is: "; meanwhile rank 1 (node a) stuck 60 s
// waiting for data (loader) in step 6" when, among rt's ranks that have not
// ended, one has made no progress for kHangContextSeconds (blamed as
// DescribeHang does); "" otherwise. So the default progress timeout (300 s,
// longer than the collective's 60 s) still gets the stuck rank named.
inline constexpr double kHangContextSeconds = 10;
std::string HangContextOf(const JobRt& rt, Clock::TimePoint now);

// The phase rank `r` of rt last reported, aged to `now` ("" when it
// reported none): ", last in forward of step 31 (no progress for 12 s)",
// for the heartbeat timeout's message.
std::string LastPhaseOf(const JobRt& rt, size_t r, Clock::TimePoint now);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_HANG_CHECK_H_
