// The sbatch script of a launcher: slurm job (docs/slurm.md): one
// `dgca-worker agent` per allocated node, started by srun and bound to the
// job, which registers with the coordinator, runs the ranks it is given and
// exits when the coordinator releases it; the allocation ends with it.
//
// Thread-safety: pure functions.
#ifndef DGCA_COORDINATOR_SLURM_SCRIPT_H_
#define DGCA_COORDINATOR_SLURM_SCRIPT_H_

#include <string>

#include "dgca/v1/job.pb.h"

namespace dgca {

// Seconds before the time limit at which Slurm sends SIGUSR1 to the agents,
// which pass it to their ranks: each saves a checkpoint at its next step.
inline constexpr int kSlurmSignalLeadSeconds = 120;

struct SbatchOptions {
  std::string job_id;        // the dgca job
  int attempt = 0;           // the attempt this allocation is for
  std::string coordinator;   // HOST:PORT the agents call back on
  std::string token_file;    // the token the agents (and their ranks) present
  std::string tls_ca_file;   // "" = plaintext
  std::string worker_binary; // dgca-worker on the compute nodes
  std::string state_dir;     // the coordinator's state dir (rank logs, slurm-%j.out)
  std::string time;          // --time ("" = none: the partition's default)
};

// The script's text. Values go into #SBATCH lines and shell words quoted;
// the spec's fields are validated by spec/spec.h.
std::string SbatchScript(const v1::SlurmSpec& slurm, const SbatchOptions& options);

// Slurm's --time value for `seconds` of run time: whole minutes, rounded up
// ("D-HH:MM:SS" past a day).
std::string SlurmTimeLimit(double seconds);

// The script's file: STATE_DIR/jobs/JOB/slurm-attempt-A.sbatch.
std::string SbatchScriptPath(const std::string& state_dir, const std::string& job_id, int attempt);

}  // namespace dgca

#endif  // DGCA_COORDINATOR_SLURM_SCRIPT_H_
