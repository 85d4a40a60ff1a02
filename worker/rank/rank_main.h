// The rank runtime: `dgca-worker rank` (started by an agent, never by hand).
//
// RunRank: GetAssignment (retried while the coordinator is briefly
// unreachable) -> TrainConfig -> communicator (world 1: local; otherwise Gloo
// over the coordinator's rendezvous store, GrpcStore) -> dgca::Train, with an
// observer that
//   - streams StepMetrics / EvalMetrics / log lines over StreamMetrics from a
//     background sender thread through a bounded queue (training never
//     blocks; the oldest step samples are dropped when the queue is full and
//     the drop is counted in the log),
//   - prints progress to stderr (the agent appends it to the rank's log),
//   - stops training when a heartbeat answer says stop, on SIGTERM, or when
//     the coordinator has been unreachable for longer than its outage limit
//     (GetAssignmentResponse.coordinator_outage_limit_seconds; before the
//     assignment, and from a coordinator that sends none,
//     heartbeat_timeout_s); until then it trains on.
// Heartbeats go every heartbeat_interval_s on their own thread.
//
// Exit codes (model/core/exit_codes.h): kExitOk trained to the end;
// kExitFailed training failed; kExitUsage bad assignment or configuration;
// kExitUnreachable cannot reach or authenticate with the coordinator;
// kExitStopped stopped on request (a heartbeat's stop, SIGTERM/SIGINT).
// `dgca-worker rank` writes the code to DGCA_EXIT_FILE as it exits
// (worker/agent/rank_process.h), for an agent that adopted the rank and so
// gets no wait status.
//
// Thread-safety: RunRank is meant to be the only thing its process does.
#ifndef DGCA_WORKER_RANK_RANK_MAIN_H_
#define DGCA_WORKER_RANK_RANK_MAIN_H_

#include <string>

#include "model/core/exit_codes.h"

namespace dgca {

struct RankArgs {
  std::string coordinator;   // host:port
  std::string token_file;
  std::string tls_ca_file;   // "" = plaintext
  std::string job_id;
  int rank = 0;
  int attempt = 0;
  double heartbeat_interval_s = 2;
  double heartbeat_timeout_s = 30;
};

int RunRank(const RankArgs& args);

// SIGTERM/SIGINT: the first one asks training to stop at the next step (a
// second one kills as usual). Call once from main before RunRank.
void InstallRankSignalHandlers();

}  // namespace dgca

#endif  // DGCA_WORKER_RANK_RANK_MAIN_H_
