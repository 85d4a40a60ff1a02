// Exit codes of every dgca program, in one place (docs/cli.md lists them
// per command):
//   dgca                      0 ok, 1 the job failed or was cancelled
//                             (submit --wait, watch), 2 bad usage or an
//                             invalid spec, 3 cannot reach or authenticate
//                             with the coordinator
//   dgca-coordinator          0 clean shutdown, 1 could not start, 2 bad usage
//   dgca-worker agent         0 stopped, 2 bad usage, 3 cannot reach or
//                             authenticate with the coordinator
//   dgca-worker rank          0 trained to the end, 1 training failed, 2 bad
//                             assignment or configuration, 3 the coordinator
//                             unreachable or refusing, 5 stopped on request
//                             (a heartbeat's stop, SIGTERM/SIGINT); the code
//                             is also written to DGCA_EXIT_FILE
//   dgca-worker train,
//   dgca-train                0 trained, 1 training failed, 2 bad usage or an
//                             invalid spec or data
// The coordinator reads a rank's kExitStopped as "stopped", not "failed".
#ifndef DGCA_MODEL_CORE_EXIT_CODES_H_
#define DGCA_MODEL_CORE_EXIT_CODES_H_

namespace dgca {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;
inline constexpr int kExitStopped = 5;

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_EXIT_CODES_H_
