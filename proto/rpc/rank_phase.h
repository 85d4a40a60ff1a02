// A RankPhase (proto/dgca/v1/job.proto: what a rank's training thread is
// doing, from its heartbeats) in words, in one place for the coordinator's
// hang messages and the CLI's PHASE column (docs/operations.md "Hangs").
#ifndef DGCA_PROTO_RPC_RANK_PHASE_H_
#define DGCA_PROTO_RPC_RANK_PHASE_H_

#include <cstdint>
#include <string>

#include "dgca/v1/job.pb.h"

namespace dgca {

// True for the phases where a rank waits for its peers (rendezvous,
// broadcast, all-reduce, checkpoint barrier, finishing): a rank stuck there
// is usually waiting for one that is stuck elsewhere.
bool RankPhaseWaits(v1::RankPhaseKind kind);

// "all-reduce", "data", "checkpoint barrier"...; "" for UNSPECIFIED.
const char* RankPhaseKindName(v1::RankPhaseKind kind);

// The short form: "all-reduce 3/4", "eval 2/10", "data", "backward"; "" for
// UNSPECIFIED.
std::string RankPhaseLabel(const v1::RankPhase& p);

// The status column: the label and its seconds, "all-reduce 3/4 12 s",
// "backward 0.2 s"; "-" for UNSPECIFIED.
std::string RankPhaseColumn(const v1::RankPhase& p);

// For a sentence "rank 1 stuck 40 s <this>": "in all-reduce 7/25 of step
// 4412 (98 MB)", "waiting for data (loader) in step 3", "in forward of step
// 12", "writing the checkpoint of step 500", "in eval batch 3/10 (step
// 100)", "in the rendezvous", "starting (data, model, init)"...
std::string RankPhaseDescription(const v1::RankPhase& p);

// The same place: kind, step and index (two ranks in "the same" all-reduce).
bool RankPhaseSamePlace(const v1::RankPhase& a, const v1::RankPhase& b);

// "98 MB", "1.5 MB", "512 KB", "64 B" (powers of 1000).
std::string FormatPhaseBytes(int64_t bytes);
// "0.2 s", "9.5 s", "62 s", "4m05s".
std::string FormatPhaseSeconds(double seconds);

}  // namespace dgca

#endif  // DGCA_PROTO_RPC_RANK_PHASE_H_
