#include "coordinator/slurm_script.h"

#include <gtest/gtest.h>

namespace dgca {
namespace {

SbatchOptions Options() {
  SbatchOptions o;
  o.job_id = "j-0007";
  o.attempt = 2;
  o.coordinator = "head:50051";
  o.token_file = "/srv/dgca state/token";
  o.worker_binary = "/opt/dgca/bin/dgca-worker";
  o.state_dir = "/srv/dgca state";
  o.time = "00:42:00";
  return o;
}

TEST(SbatchScript, EverySpecFieldBecomesAnSbatchLine) {
  v1::SlurmSpec slurm;
  slurm.set_partition("gpu");
  slurm.set_account("nlp");
  slurm.set_qos("high");
  slurm.set_nodes(2);
  slurm.set_gpus_per_node(4);
  slurm.add_extra_args("--exclusive");
  const std::string s = SbatchScript(slurm, Options());
  EXPECT_EQ(s.rfind("#!/bin/bash\n", 0), 0u) << s;
  for (const char* line :
       {"#SBATCH --job-name=dgca-j-0007\n", "#SBATCH --nodes=2\n",
        "#SBATCH --ntasks-per-node=1\n", "#SBATCH --partition=gpu\n", "#SBATCH --account=nlp\n",
        "#SBATCH --qos=high\n", "#SBATCH --gpus-per-node=4\n", "#SBATCH --time=00:42:00\n",
        "#SBATCH --signal=USR1@120\n", "#SBATCH --no-requeue\n", "#SBATCH --exclusive\n"}) {
    EXPECT_NE(s.find(line), std::string::npos) << line << " missing from\n" << s;
  }
  // The agent line: paths with spaces quoted, the job bound, srun ending
  // the step when one agent fails.
  EXPECT_NE(s.find("exec srun --ntasks-per-node=1 --kill-on-bad-exit=1"), std::string::npos) << s;
  EXPECT_NE(s.find("'/opt/dgca/bin/dgca-worker' agent --coordinator 'head:50051' --token-file "
                   "'/srv/dgca state/token' --bound-job 'j-0007' --state-dir '/srv/dgca state'"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("--tls-ca"), std::string::npos);
  // Every #SBATCH line comes before the first command: sbatch stops reading
  // them there.
  EXPECT_LT(s.rfind("#SBATCH"), s.find("exec srun"));
}

TEST(SbatchScript, DefaultsLeaveSlurmsOwn) {
  SbatchOptions o = Options();
  o.time.clear();
  o.tls_ca_file = "/etc/dgca/ca.pem";
  const std::string s = SbatchScript(v1::SlurmSpec(), o);
  EXPECT_NE(s.find("#SBATCH --nodes=1\n"), std::string::npos);
  for (const char* absent : {"--partition", "--account", "--qos", "--gpus-per-node", "--time"}) {
    EXPECT_EQ(s.find(absent), std::string::npos) << absent << " in\n" << s;
  }
  EXPECT_NE(s.find("--tls-ca '/etc/dgca/ca.pem'"), std::string::npos) << s;
}

TEST(SlurmTimeLimit, RoundsUpToWholeMinutesWithAMinuteAtLeast) {
  EXPECT_EQ(SlurmTimeLimit(0), "00:01:00");
  EXPECT_EQ(SlurmTimeLimit(59), "00:01:00");
  EXPECT_EQ(SlurmTimeLimit(61), "00:02:00");
  EXPECT_EQ(SlurmTimeLimit(3600), "01:00:00");
  EXPECT_EQ(SlurmTimeLimit(24 * 3600 - 1), "1-00:00:00");
  EXPECT_EQ(SlurmTimeLimit(2 * 86400 + 3 * 3600 + 30), "2-03:01:00");
}

TEST(SbatchScriptPath, OneFilePerAttempt) {
  EXPECT_EQ(SbatchScriptPath("/s", "j-1", 0), "/s/jobs/j-1/slurm-attempt-0.sbatch");
  EXPECT_NE(SbatchScriptPath("/s", "j-1", 0), SbatchScriptPath("/s", "j-1", 1));
}

}  // namespace
}  // namespace dgca
