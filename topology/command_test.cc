#include "topology/command.h"

#include <gtest/gtest.h>

#include <chrono>

namespace dgca {
namespace {

TEST(RunCommand, CollectsStdoutStderrAndExitCode) {
  auto r = RunCommand({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, "out\n");
  EXPECT_EQ(r->err, "err\n");
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->signal, 0);
}

TEST(RunCommand, StdinIsDevNull) {
  // cat would wait forever on an inherited terminal or pipe.
  auto r = RunCommand({"cat"}, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_EQ(r->out, "");
}

TEST(RunCommand, AMissingProgramIsNotFound) {
  auto r = RunCommand({"dgca-no-such-program-xyz", "--help"}, 10);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("dgca-no-such-program-xyz is not installed"),
            std::string::npos);
}

TEST(RunCommand, ATooSlowProgramIsKilledAtTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  auto r = RunCommand({"sleep", "30"}, 0.3);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("sleep 30 did not finish within 0.3 s"), std::string::npos)
      << r.status();
  EXPECT_LT(took, 10.0);
}

TEST(RunCommand, ASignalIsReported) {
  auto r = RunCommand({"/bin/sh", "-c", "kill -TERM $$"}, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, -1);
  EXPECT_EQ(r->signal, 15);
}

TEST(CommandLine, QuotesOnlyWhatAShellWouldSplit) {
  EXPECT_EQ(CommandLine({"sbatch", "--parsable", "/tmp/a b.sbatch"}),
            "sbatch --parsable '/tmp/a b.sbatch'");
  EXPECT_EQ(CommandLine({"squeue", "-o", "%i|%T"}), "squeue -o '%i|%T'");
  EXPECT_EQ(CommandLine({"echo", ""}), "echo ''");
}

}  // namespace
}  // namespace dgca
