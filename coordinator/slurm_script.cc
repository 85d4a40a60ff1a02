#include "coordinator/slurm_script.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/core/strings.h"

namespace dgca {

std::string SbatchScriptPath(const std::string& state_dir, const std::string& job_id,
                             int attempt) {
  return absl::StrCat(state_dir, "/jobs/", job_id, "/slurm-attempt-", attempt, ".sbatch");
}

std::string SlurmTimeLimit(double seconds) {
  int64_t minutes = static_cast<int64_t>(std::ceil(std::max(60.0, seconds) / 60.0));
  const int64_t days = minutes / (24 * 60);
  minutes -= days * 24 * 60;
  if (days > 0) return absl::StrFormat("%d-%02d:%02d:00", days, minutes / 60, minutes % 60);
  return absl::StrFormat("%02d:%02d:00", minutes / 60, minutes % 60);
}

std::string SbatchScript(const v1::SlurmSpec& slurm, const SbatchOptions& o) {
  const int nodes = slurm.nodes() > 0 ? slurm.nodes() : 1;
  std::string s = absl::StrCat(
      "#!/bin/bash\n",
      "# dgca job ", o.job_id, ", attempt ", o.attempt, ": one dgca-worker agent per node, bound\n",
      "# to the job; written and submitted by dgca-coordinator (docs/slurm.md).\n",
      "#SBATCH --job-name=dgca-", o.job_id, "\n",
      "#SBATCH --nodes=", nodes, "\n",
      "#SBATCH --ntasks-per-node=1\n");
  if (!slurm.partition().empty()) absl::StrAppend(&s, "#SBATCH --partition=", slurm.partition(), "\n");
  if (!slurm.account().empty()) absl::StrAppend(&s, "#SBATCH --account=", slurm.account(), "\n");
  if (!slurm.qos().empty()) absl::StrAppend(&s, "#SBATCH --qos=", slurm.qos(), "\n");
  if (slurm.gpus_per_node() > 0) {
    absl::StrAppend(&s, "#SBATCH --gpus-per-node=", slurm.gpus_per_node(), "\n");
  }
  if (!o.time.empty()) absl::StrAppend(&s, "#SBATCH --time=", o.time, "\n");
  absl::StrAppend(&s, "#SBATCH --signal=USR1@", kSlurmSignalLeadSeconds, "\n",
                  "#SBATCH --no-requeue\n",
                  "#SBATCH --output=", o.state_dir, "/jobs/", o.job_id, "/slurm-%j.out\n",
                  "#SBATCH --open-mode=append\n");
  for (const std::string& a : slurm.extra_args()) absl::StrAppend(&s, "#SBATCH ", a, "\n");
  std::vector<std::string> agent = {
      ShellQuote(o.worker_binary), "agent",        "--coordinator", ShellQuote(o.coordinator),
      "--token-file",              ShellQuote(o.token_file), "--bound-job", ShellQuote(o.job_id),
      "--state-dir",               ShellQuote(o.state_dir)};
  if (!o.tls_ca_file.empty()) {
    agent.push_back("--tls-ca");
    agent.push_back(ShellQuote(o.tls_ca_file));
  }
  absl::StrAppend(&s,
                  "# srun starts the agents and forwards Slurm's signals to them; an agent\n",
                  "# exits 0 when the coordinator releases it, which ends the allocation.\n",
                  "exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\\n    ",
                  absl::StrJoin(agent, " "), "\n");
  return s;
}

}  // namespace dgca
