#include "spec/slurm_values.h"

#include <gtest/gtest.h>

namespace dgca {
namespace {

TEST(SlurmName, LettersDigitsDotUnderscoreDash) {
  EXPECT_TRUE(SlurmName("gpu-a100"));
  EXPECT_TRUE(SlurmName("lab.nlp_2"));
  EXPECT_FALSE(SlurmName(""));
  EXPECT_FALSE(SlurmName("gpu a100"));
  EXPECT_FALSE(SlurmName("gpu;id"));
  EXPECT_FALSE(SlurmName(std::string(65, 'a')));
}

TEST(SlurmTime, EverySlurmFormatAndNothingElse) {
  for (const char* t : {"30", "30:00", "12:30:00", "1-12", "1-12:30", "2-00:00:00"}) {
    EXPECT_TRUE(SlurmTime(t)) << t;
  }
  for (const char* t : {"", "soon", "1:2:3:4", "-5", "1-", "1-1:2:3:4", "1h", "12:3x"}) {
    EXPECT_FALSE(SlurmTime(t)) << t;
  }
}

TEST(SbatchArgProblem, AcceptsPlainLongOptions) {
  EXPECT_EQ(SbatchArgProblem("--exclusive"), "");
  EXPECT_EQ(SbatchArgProblem("--constraint=a100"), "");
  EXPECT_EQ(SbatchArgProblem("--mem-per-cpu=4G"), "");
}

TEST(SbatchArgProblem, SaysWhyOthersAreRefused) {
  EXPECT_NE(SbatchArgProblem("-N2").find("expected a long option"), std::string::npos);
  EXPECT_NE(SbatchArgProblem("--Exclusive").find("not an sbatch option name"), std::string::npos);
  EXPECT_NE(SbatchArgProblem("--comment=a;b").find("without quotes"), std::string::npos);
  EXPECT_NE(SbatchArgProblem("--comment=$(id)").find("without quotes"), std::string::npos);
  EXPECT_NE(SbatchArgProblem("--signal=USR2@60").find("set by the coordinator"), std::string::npos);
  EXPECT_NE(SbatchArgProblem("--requeue").find("set by the coordinator"), std::string::npos);
  EXPECT_NE(SbatchArgProblem("--gpus-per-node=2").find("use resources.slurm.gpus_per_node"),
            std::string::npos);
}

}  // namespace
}  // namespace dgca
