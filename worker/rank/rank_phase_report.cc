#include "worker/rank/rank_phase_report.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dgca {

v1::RankPhase RankPhaseOf(const PhaseSnapshot& s) {
  v1::RankPhase p;
  v1::RankPhaseKind k = v1::RANK_PHASE_UNSPECIFIED;
  switch (s.phase) {
    case TrainPhase::kUnknown: k = v1::RANK_PHASE_UNSPECIFIED; break;
    case TrainPhase::kStarting: k = v1::RANK_PHASE_STARTING; break;
    case TrainPhase::kRendezvous: k = v1::RANK_PHASE_RENDEZVOUS; break;
    case TrainPhase::kBroadcast: k = v1::RANK_PHASE_BROADCAST; break;
    case TrainPhase::kData: k = v1::RANK_PHASE_DATA; break;
    case TrainPhase::kForward: k = v1::RANK_PHASE_FORWARD; break;
    case TrainPhase::kBackward: k = v1::RANK_PHASE_BACKWARD; break;
    case TrainPhase::kForwardBackward: k = v1::RANK_PHASE_FORWARD_BACKWARD; break;
    case TrainPhase::kAllReduce: k = v1::RANK_PHASE_ALL_REDUCE; break;
    case TrainPhase::kOptimizer: k = v1::RANK_PHASE_OPTIMIZER; break;
    case TrainPhase::kCheckpoint: k = v1::RANK_PHASE_CHECKPOINT; break;
    case TrainPhase::kCheckpointBarrier: k = v1::RANK_PHASE_CHECKPOINT_BARRIER; break;
    case TrainPhase::kEval: k = v1::RANK_PHASE_EVAL; break;
    case TrainPhase::kFinishing: k = v1::RANK_PHASE_FINISHING; break;
  }
  if (k == v1::RANK_PHASE_UNSPECIFIED) return p;
  p.set_kind(k);
  p.set_step(s.step);
  p.set_index(s.index);
  p.set_count(s.count);
  p.set_bytes(s.bytes);
  p.set_seconds(s.seconds);
  p.set_progress(s.progress);
  return p;
}

absl::StatusOr<DataStallHook> ParseDataStallHook(const std::string& value) {
  DataStallHook h;
  if (value.empty()) return h;
  std::vector<std::string> parts = absl::StrSplit(value, ':');
  int rank = -1;
  int64_t step = 0;
  double seconds = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &rank) || rank < 0 ||
      !absl::SimpleAtoi(parts[1], &step) || step < 1 || !absl::SimpleAtod(parts[2], &seconds) ||
      !(seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DGCA_TEST_DATA_STALL: expected RANK:STEP:SECONDS (rank >= 0, step >= 1, "
                     "seconds > 0; test-only), got '", value, "'"));
  }
  h.rank = rank;
  h.step = step;
  h.seconds = seconds;
  return h;
}

}  // namespace dgca
