// The parts of the Slurm client that need no cluster; the client against
// real slurmctld/slurmd daemons is tests/integration/slurm_test.cc.
#include <gtest/gtest.h>

#include "coordinator/slurm.h"

namespace dgca {
namespace {

// What squeue -h -t all -o "%i|%T|%r|%N" printed for three jobs on the
// one-node test cluster (tools/slurm-local.sh): one running, one waiting
// for the node, one ended.
TEST(ParseSqueue, ReadsStateReasonAndNodes) {
  const auto jobs = ParseSqueue(
      "14|RUNNING|None|vm\n"
      "15|PENDING|Resources|\n"
      "13|CANCELLED|None|vm\n");
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs.at("14").state, "RUNNING");
  EXPECT_EQ(jobs.at("14").reason, "");
  EXPECT_EQ(jobs.at("14").nodes, "vm");
  EXPECT_EQ(jobs.at("15").state, "PENDING");
  EXPECT_EQ(jobs.at("15").reason, "Resources");
  EXPECT_EQ(jobs.at("15").nodes, "");
  EXPECT_EQ(jobs.at("13").state, "CANCELLED");
}

TEST(ParseSqueue, SkipsBlankAndMalformedLinesAndNullFields) {
  const auto jobs = ParseSqueue("\n  \ngarbage\n|RUNNING|None|vm\n7|PENDING|(null)|(null)\n");
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs.at("7").reason, "");
  EXPECT_EQ(jobs.at("7").nodes, "");
}

TEST(ParseSqueue, KeepsPipesInsideTheNodeList) {
  // The node field is last, so a split stops before it.
  const auto jobs = ParseSqueue("9|RUNNING|None|gpu[01-02]|x\n");
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs.at("9").nodes, "gpu[01-02]|x");
}

TEST(SlurmJobActive, WaitingAndRunningAreActiveEndedAreNot) {
  for (const char* s : {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}) {
    EXPECT_TRUE(SlurmJobActive(s)) << s;
  }
  for (const char* s : {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                        "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", ""}) {
    EXPECT_FALSE(SlurmJobActive(s)) << s;
  }
}

// Without Slurm's tools the client says which tool is missing and how to
// install it (run with a bin_dir where none exist).
TEST(Slurm, MissingToolsAreNamed) {
  Slurm slurm(SlurmOptions{"/nonexistent-slurm-bin", 5});
  auto id = slurm.Submit("/tmp/x.sbatch");
  ASSERT_FALSE(id.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(id.status())) << id.status();
  EXPECT_NE(id.status().message().find("/nonexistent-slurm-bin/sbatch is not installed"),
            std::string::npos)
      << id.status();
  EXPECT_NE(id.status().message().find("apt-get install slurm-client"), std::string::npos);
  auto q = slurm.Query({"1"});
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("squeue"), std::string::npos);
  EXPECT_TRUE(slurm.Query({})->empty()) << "no ids: no call";
}

}  // namespace
}  // namespace dgca
