#include "spec/spec_overrides.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "spec/spec.h"

namespace dgca {
namespace {

const char kSpec[] =
    "name: base\n"
    "model: {preset: tiny}\n"
    "train:\n"
    "  steps: 100\n"
    "  global_batch: 8\n"
    "resources: {ranks: 2, device: cpu}\n";

v1::JobSpec Parsed(const std::string& yaml) {
  auto r = ParseJobSpec(yaml, "merged.yaml");
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r->ok()) << (r->problems.empty() ? "" : r->problems[0].message());
  return r->spec;
}

TEST(SpecOverridesTest, NoSetsLeaveTheTextAsItIs) {
  SpecOverrideResult r = ApplySpecOverrides(kSpec, "a.yaml", {});
  EXPECT_TRUE(r.problems.empty());
  EXPECT_EQ(r.yaml, kSpec);
}

TEST(SpecOverridesTest, ValuesReplaceAndAddFieldsInBlockAndFlowMappings) {
  SpecOverrideResult r = ApplySpecOverrides(
      kSpec, "a.yaml",
      {"train.steps=200", "resources.ranks=1", "train.optimizer.lr=0.002", "name=other",
       "comm.env.NCCL_DEBUG=INFO"});
  ASSERT_TRUE(r.problems.empty()) << r.problems[0].message();
  EXPECT_TRUE(absl::StartsWith(r.yaml, "# a.yaml with --set train.steps=200 --set ")) << r.yaml;
  const v1::JobSpec spec = Parsed(r.yaml);
  EXPECT_EQ(spec.train().steps(), 200);
  EXPECT_EQ(spec.train().global_batch(), 8);  // untouched
  EXPECT_EQ(spec.resources().ranks(), 1);
  EXPECT_EQ(spec.resources().device(), "cpu");
  EXPECT_DOUBLE_EQ(spec.train().optimizer().lr(), 0.002);
  EXPECT_EQ(spec.name(), "other");
  EXPECT_EQ(spec.model().preset(), "tiny");
  EXPECT_EQ(spec.comm().env().at("NCCL_DEBUG"), "INFO");
}

TEST(SpecOverridesTest, ABadValueIsNamedAtItsFlag) {
  SpecOverrideResult r = ApplySpecOverrides(kSpec, "a.yaml", {"train.steps=abc"});
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_TRUE(r.yaml.empty());
  EXPECT_EQ(FormatProblem(r.problems[0]),
            "--set train.steps=abc: train.steps: expected an integer, got 'abc'\n");
}

TEST(SpecOverridesTest, AnUnknownFieldAMalformedFlagAndAPathThroughAValueAreRefused) {
  SpecOverrideResult r = ApplySpecOverrides(
      kSpec, "a.yaml", {"train.stepz=5", "steps", "=3", "model.preset.x=1", "a..b=1"});
  ASSERT_EQ(r.problems.size(), 5u);
  EXPECT_EQ(r.problems[0].file(), "--set train.stepz=5");
  EXPECT_TRUE(absl::StrContains(r.problems[0].message(), "unknown field")) << r.problems[0].message();
  EXPECT_TRUE(absl::StrContains(r.problems[1].message(), "expected KEY=VALUE"));
  EXPECT_TRUE(absl::StrContains(r.problems[2].message(), "expected KEY=VALUE"));
  EXPECT_EQ(r.problems[3].file(), "--set model.preset.x=1");
  EXPECT_TRUE(absl::StrContains(r.problems[4].message(), "expected KEY=VALUE"));
}

TEST(SpecOverridesTest, AValueIsCheckedAmongTheFilesValues) {
  // micro_batch 16 breaks a rule with the file's global_batch 8: named at
  // the flag, with the file's number (not the default's).
  SpecOverrideResult r = ApplySpecOverrides(kSpec, "a.yaml", {"train.micro_batch=16"});
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].file(), "--set train.micro_batch=16");
  EXPECT_TRUE(absl::StrContains(r.problems[0].message(), "larger than global_batch 8"))
      << r.problems[0].message();
  EXPECT_TRUE(r.yaml.empty());
  // And a value valid with the file's values is taken, though a default
  // spec would refuse it (micro_batch 256 > the default global_batch 128).
  const std::string big = std::string(kSpec).replace(std::string(kSpec).find("global_batch: 8"),
                                                     15, "global_batch: 1024");
  SpecOverrideResult ok = ApplySpecOverrides(big, "a.yaml", {"train.micro_batch=256"});
  ASSERT_TRUE(ok.problems.empty()) << ok.problems[0].message();
  EXPECT_EQ(Parsed(ok.yaml).train().micro_batch(), 256);
}

}  // namespace
}  // namespace dgca
