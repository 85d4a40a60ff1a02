// What a RankProgress.state (proto/dgca/v1/job.proto) says about the rank,
// in one place for the coordinator and the CLI.
#ifndef DGCA_PROTO_RPC_RANK_STATE_H_
#define DGCA_PROTO_RPC_RANK_STATE_H_

#include <string_view>

namespace dgca {

// True for the states of a rank that has ended: "exited", "failed",
// "cancelled", "stopped".
inline bool RankStateEnded(std::string_view state) {
  return state == "exited" || state == "failed" || state == "cancelled" || state == "stopped";
}

}  // namespace dgca

#endif  // DGCA_PROTO_RPC_RANK_STATE_H_
