// tuning.mode trial through the coordinator (docs/planner.md,
// "Trial mode"): the planner's best candidates run as short attempts of the job on
// its real rank processes (Gloo over loopback), the measured fastest is kept,
// the job trains with it and succeeds, and `dgca status` shows the trials.
// Real programs on loopback.
#include <gtest/gtest.h>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

TEST(TrialModeTest, TimesCandidatesOnTheRanksThenTrainsTheFastest) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("trial-mode");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start());
  std::string spec = dir + "/tuned.yaml";
  WriteFile(spec,
            "name: tuned\n"
            "model: {preset: tiny}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  eval: " + SharedData() + "/ecspell/test_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: 60, global_batch: 32, eval_every: 0, checkpoint_every: 0,\n"
            "        optimizer: {lr: 1.0e-3}}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n"
            "tuning: {mode: trial, budget_s: 90}\n");
  Result sub = Dgca(coord, {"submit", spec, "--wait"}, 180s);
  ASSERT_EQ(sub.code, 0) << sub.out << sub.err << coord.Log();
  std::string job = sub.out.substr(0, sub.out.find('\n'));

  Result st = Dgca(coord, {"status", "--json", job});
  ASSERT_EQ(st.code, 0) << st.err;
  auto doc = Json(st.out);
  ASSERT_TRUE(doc.ok()) << st.out;
  const JsonValue* plan = doc->Find("plan");
  ASSERT_NE(plan, nullptr);
  const JsonValue* trials = plan->Find("trials");
  ASSERT_NE(trials, nullptr);
  ASSERT_TRUE(trials->is_array());
  ASSERT_GE(trials->array.size(), 2u) << st.out;
  int kept = -1;
  for (size_t i = 0; i < trials->array.size(); ++i) {
    const JsonValue& t = trials->array[i];
    const JsonValue* measured = t.Find("measured_step_seconds");
    ASSERT_TRUE(measured && measured->is_number()) << st.out;
    EXPECT_GT(measured->number, 0) << "trial " << i << ": " << JsonStr(t.Find("note"));
    if (JsonStr(t.Find("note")).find("kept (fastest)") != std::string::npos) kept = i;
  }
  ASSERT_GE(kept, 0) << st.out;
  const JsonValue& best = trials->array[kept];
  EXPECT_EQ(JsonInt(plan->Find("micro_batch")), JsonInt(best.Find("micro_batch")));
  EXPECT_EQ(JsonInt(plan->Find("accumulation")), JsonInt(best.Find("accumulation")));
  for (const auto& t : trials->array) {
    EXPECT_LE(best.Find("measured_step_seconds")->number /
                  (JsonInt(best.Find("micro_batch")) * JsonInt(best.Find("accumulation"))),
              t.Find("measured_step_seconds")->number /
                  (JsonInt(t.Find("micro_batch")) * JsonInt(t.Find("accumulation"))))
        << "the kept trial is not the fastest per sample";
  }
  // The job itself ran after the trials (at a later attempt), to the end.
  EXPECT_EQ(JsonStr(doc->Find("job")->Find("state")), "SUCCEEDED");
  EXPECT_NE(st.out.find("\"kind\": \"trial\""), std::string::npos);
  Result logs = Dgca(coord, {"logs", job, "--rank", "0"});
  EXPECT_NE(logs.out.find("attempt " + std::to_string(trials->array.size())), std::string::npos)
      << logs.out;
  EXPECT_NE(logs.out.find("step 60/60"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("6 steps"), std::string::npos) << "a trial's run" << logs.out;
  // `dgca status` shows them as a table.
  Result text = Dgca(coord, {"status", job});
  EXPECT_NE(text.out.find("tuning trials:"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("kept (fastest)"), std::string::npos) << text.out;
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
