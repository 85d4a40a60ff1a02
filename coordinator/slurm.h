// Slurm through its command-line tools (sbatch, squeue, scancel, sinfo),
// with their machine-readable output: no libslurm, whose ABI changes every
// release. Each call runs the tool once (topology/command.h) and turns
// what it printed into a status that names the command and relays Slurm's
// own message ("sbatch --parsable F exited 1: sbatch: error: invalid
// partition specified: gpu").
//
// Thread-safety: thread-safe (no state besides the options). The calls
// block for as long as the tools take (bounded by timeout_s): never call
// them with the scheduler's mutex held (coordinator/slurm_launcher.h runs
// them on a thread of its own).
#ifndef DGCA_COORDINATOR_SLURM_H_
#define DGCA_COORDINATOR_SLURM_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dgca {

// What squeue says of one job.
struct SlurmJobInfo {
  std::string id;
  std::string state;   // PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, TIMEOUT, ...
  std::string reason;  // why it waits (Resources, Priority, ...), "None" when it does not
  std::string nodes;   // the allocated node list once running
};

// Whether a Slurm job in `state` still holds or waits for its allocation.
bool SlurmJobActive(const std::string& state);

// Parses squeue lines printed with -o "%i|%T|%r|%N" (one job per line).
std::map<std::string, SlurmJobInfo> ParseSqueue(const std::string& out);

struct SlurmOptions {
  // Directory of sbatch/squeue/scancel/sinfo; "" = found on PATH. Their
  // SLURM_CONF comes from this process's environment.
  std::string bin_dir;
  double timeout_s = 30;
};

class Slurm {
 public:
  explicit Slurm(SlurmOptions options) : opt_(std::move(options)) {}

  // sbatch --parsable SCRIPT: the new job's id.
  absl::StatusOr<std::string> Submit(const std::string& script_path) const;
  // The jobs of `ids` that squeue still knows (finished ones stay listed for
  // the cluster's MinJobAge, then are gone).
  absl::StatusOr<std::map<std::string, SlurmJobInfo>> Query(
      const std::vector<std::string>& ids) const;
  // scancel ID (a job that has ended already is fine).
  absl::Status Cancel(const std::string& id) const;
  // The number of nodes in `partition` ("" = the default partition), from
  // sinfo; NOT_FOUND naming the partitions that exist when it does not.
  absl::StatusOr<int> PartitionNodes(const std::string& partition) const;

 private:
  std::string Tool(const std::string& name) const;
  SlurmOptions opt_;
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_SLURM_H_
