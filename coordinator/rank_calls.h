// What ranks and agents report about ranks, applied to a job's runtime
// state (coordinator/job_runtime.h): assignments, heartbeats, step metrics
// and exits. The scheduler calls these with its mutex held and acts on what
// they return (events, stops, the live plan check, /metrics).
//
// Thread-safety: plain functions over caller-guarded state.
#ifndef DGCA_COORDINATOR_RANK_CALLS_H_
#define DGCA_COORDINATOR_RANK_CALLS_H_

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/clock.h"
#include "coordinator/job_runtime.h"
#include "dgca/v1/agent.pb.h"
#include "dgca/v1/metrics.pb.h"
#include "dgca/v1/rank.pb.h"

namespace dgca {

// GetAssignment for a rank of `rt`: the spec and plan (a trial's while a
// tuning trial runs), the checkpoint dir and the step directory to resume
// from. FAILED_PRECONDITION when the job is not taking ranks, is stopping
// or the attempt is stale; INVALID_ARGUMENT for a rank outside the world.
absl::StatusOr<v1::GetAssignmentResponse> AssignRank(JobRt* rt,
                                                     const v1::GetAssignmentRequest& req,
                                                     Clock::TimePoint now,
                                                     const std::string& checkpoint_dir);

// The step directory `checkpoint_dir/latest` names, when it is a plain
// step-directory name (no '/', '..' or NUL) of an existing directory; ""
// otherwise. `latest` is read bounded (4 KiB).
std::string ResumePointOf(const std::string& checkpoint_dir);

// A rank heartbeat: stop=true (with the reason) when the job is not taking
// ranks, is stopping, or the attempt is stale; otherwise the rank's
// progress is refreshed.
v1::RankHeartbeatResponse HeartbeatRank(JobRt* rt, const v1::RankHeartbeatRequest& req,
                                        Clock::TimePoint now);

// A step of a rank, applied to its progress.
enum class StepUse {
  kIgnored,  // another attempt's, or a rank outside the world
  kTrial,    // a tuning trial's step (timed into rt->trials after the warm-up)
  kJob,      // the job's own step
};
struct StepApplied {
  StepUse use = StepUse::kIgnored;
  bool live_check_due = false;  // the live plan check should run now
};
StepApplied ApplyStep(JobRt* rt, const v1::StepMetrics& m, Clock::TimePoint now);

// How a rank ended, in words: "rank R on node N exited with code C", "...
// was killed by signal S (name)", "... was stopped (exit code 5: ...)", or
// an adopted rank's unknown end.
std::string DescribeRankExit(const std::string& node, const v1::RankExited& e);

// Whether a rank stopped because it lost this coordinator for longer than
// its outage limit while it trained: exit code 3 (kExitUnreachable) from a
// rank that had reported steps of this attempt. Exit code 3 before any step
// (a token it cannot read, an assignment refused) is a failure like any
// other: resuming would only meet it again.
bool LostCoordinator(const RankRt& rr, const v1::RankExited& e);

// Whether a rank's end while its job is being stopped is our own StopRanks
// at work: SIGTERM, the rank's "stopped" exit code, or SIGKILL (or an
// adopted rank's unknown end) after most of the grace.
bool EndedByOurStop(const v1::RankExited& e, Clock::TimePoint stop_started, Clock::TimePoint now,
                    double stop_grace_s);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_RANK_CALLS_H_
