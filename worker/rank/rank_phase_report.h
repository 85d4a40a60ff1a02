// What a rank tells the coordinator of its training thread's phase
// (model/train/train_phase.h -> RankHeartbeatRequest.phase), and the
// test-only data-stall hook (docs/operations.md "Hangs").
//
// Thread-safety: plain functions.
#ifndef DGCA_WORKER_RANK_RANK_PHASE_REPORT_H_
#define DGCA_WORKER_RANK_RANK_PHASE_REPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "dgca/v1/job.pb.h"
#include "model/train/train_phase.h"

namespace dgca {

// The heartbeat's RankPhase for a snapshot (UNSPECIFIED for kUnknown).
v1::RankPhase RankPhaseOf(const PhaseSnapshot& s);

// DGCA_TEST_DATA_STALL=RANK:STEP:SECONDS (test-only, harmless: it only
// sleeps): rank RANK, about to run the first micro-batch of optimizer step
// STEP, waits SECONDS more with its phase still "data", as a loader that
// cannot keep up would (the loader works from memory, so a real stall
// cannot be provoked in a test). The wait ends early when the rank is
// asked to stop.
struct DataStallHook {
  int rank = -1;      // -1: no hook
  int64_t step = 0;
  double seconds = 0;
};
// "" (unset) is no hook; anything else not of that form is INVALID_ARGUMENT
// naming the variable and the form.
absl::StatusOr<DataStallHook> ParseDataStallHook(const std::string& value);

}  // namespace dgca

#endif  // DGCA_WORKER_RANK_RANK_PHASE_REPORT_H_
