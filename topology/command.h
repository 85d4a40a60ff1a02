// Running a program and reading what it prints: how the probe gets the
// facts only a program can measure (the CPU's GEMM rate, `dgca-worker
// gemm-rate`: topology/probe.h ProbeOptions.gemm_rate_command) and how the
// coordinator calls a cluster scheduler's command-line tools
// (coordinator/slurm.h).
//
// Thread-safety: RunCommand may be called from any thread; it forks, so the
// child only execs (nothing else runs between fork and exec).
#ifndef DGCA_TOPOLOGY_COMMAND_H_
#define DGCA_TOPOLOGY_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dgca {

struct CommandResult {
  int exit_code = -1;   // the program's exit code; -1 when a signal ended it
  int signal = 0;       // the signal that ended it, 0 when it exited
  std::string out;      // stdout, at most 1 MiB
  std::string err;      // stderr, at most 1 MiB
};

// Runs argv[0] (found through PATH) with argv and this process's environment,
// stdin from /dev/null, for at most `timeout_s` (then SIGKILL). NOT_FOUND
// when the program does not exist; DEADLINE_EXCEEDED when it ran too long;
// an exit code other than 0 is a result, not an error.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, double timeout_s);

// "sbatch --parsable FILE" as a shell would show it (for messages).
std::string CommandLine(const std::vector<std::string>& argv);

}  // namespace dgca

#endif  // DGCA_TOPOLOGY_COMMAND_H_
