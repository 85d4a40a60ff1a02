// The re-plan of a running job (coordinator/replan.h), with the real
// programs on loopback: a 2-rank CPU job whose plan was made with a wrong
// link prior (dgca-coordinator --link-prior-busbw 1e12: a terabyte per
// second, so the plan expects no communication and puts all gradients in one
// bucket) measures its first steps, the live check finds the exposed
// communication off the prediction, the planner is asked again with the
// job's own measurements, and the job moves to the new plan (smaller
// buckets) at a checkpoint every rank writes: no restart counted, global
// batch and learning rate unchanged, and the steps after the move are
// reviewed against the new plan's prediction: its exposed communication
// within 10 points, its step within 25% once the host's own drift in compute
// between the two windows is taken out.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "absl/strings/str_format.h"
#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

double Num(const JsonValue* v) {
  if (v == nullptr) return 0;  // proto3 JSON omits zeros
  if (v->is_number()) return v->number;
  if (v->is_string()) return std::atof(v->string.c_str());
  return 0;
}

TEST(ReplanTest, AWrongLinkPriorIsCorrectedAtACheckpoint) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("replan");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--link-prior-busbw", "1e12"}));
  ASSERT_TRUE(WaitForAgent(coord)) << coord.Log();
  std::string spec = dir + "/replan.yaml";
  WriteFile(spec,
            "name: replan\n"
            "model: {preset: tiny, hidden: 64}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: 2500, global_batch: 4, eval_every: 0, checkpoint_every: 0,\n"
            "        optimizer: {lr: 1.0e-3}}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n"
            "tuning: {mode: auto}\n");
  Result plan = Dgca(coord, {"plan", spec, "--json"}, 60s);
  ASSERT_EQ(plan.code, 0) << plan.out << plan.err;
  auto pj = Json(plan.out);
  ASSERT_TRUE(pj.ok()) << plan.out;
  const double first_bucket = Num(pj->Find("bucket_mb"));
  EXPECT_LT(Num(pj->Find("predicted_comm_share")), 0.01) << plan.out;
  EXPECT_NE(plan.out.find("set by the operator (dgca-coordinator --link-prior-busbw"),
            std::string::npos)
      << plan.out;

  Result sub = Dgca(coord, {"submit", spec, "--wait"}, 300s);
  ASSERT_EQ(sub.code, 0) << sub.out << sub.err << coord.Log();
  const std::string job = Trim(sub.out.substr(0, sub.out.find('\n')));
  Result st = Dgca(coord, {"status", job}, 20s);
  std::cout << st.out;  // the events: the live check, the re-plan, the move, the review
  Result js = Dgca(coord, {"status", "--json", job}, 20s);
  auto j = Json(js.out);
  ASSERT_TRUE(j.ok() && j->Find("job") && j->Find("plan")) << js.out;
  EXPECT_EQ(JsonStr(j->Find("job")->Find("state")), "SUCCEEDED") << st.out;
  EXPECT_EQ(Num(j->Find("job")->Find("restarts")), 0) << st.out;  // a re-plan is no failure
  // The events: the live check, the re-plan with what changes and why, the
  // move at the checkpoint.
  EXPECT_NE(st.out.find("re-plan from this job's measurements ("), std::string::npos) << st.out;
  const size_t replan_at = st.out.find("re-plan from this job's measurements");
  const std::string replan_line =
      replan_at == std::string::npos ? "" : st.out.substr(replan_at, st.out.find('\n', replan_at) - replan_at);
  EXPECT_NE(replan_line.find("bucket_mb "), std::string::npos) << st.out;
  EXPECT_NE(replan_line.find(" -> "), std::string::npos) << st.out;
  EXPECT_NE(replan_line.find("exposed communication"), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("(re-plan)"), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("on the new plan"), std::string::npos) << st.out;
  // The plan the job finished on: same global batch and ranks, smaller
  // buckets, its link measured by the job.
  const JsonValue* p = j->Find("plan");
  EXPECT_LT(Num(p->Find("bucket_mb")), first_bucket) << js.out;
  EXPECT_EQ(Num(p->Find("ranks")), 2) << js.out;
  EXPECT_EQ(Num(p->Find("micro_batch")) * Num(p->Find("accumulation")) * 2, 4) << js.out;
  EXPECT_NE(js.out.find("measured by this job"), std::string::npos) << js.out;
  // Its steps after the move against the new plan's prediction.
  const JsonValue* pc = j->Find("job")->Find("plan_check");
  ASSERT_NE(pc, nullptr) << js.out;
  const double predicted = Num(pc->Find("predicted_step_seconds"));
  const double measured = Num(pc->Find("measured_step_seconds"));
  const double predicted_share = Num(pc->Find("predicted_comm_share"));
  const double measured_share = Num(pc->Find("measured_comm_share"));
  ASSERT_GT(predicted, 0) << js.out;
  ASSERT_GT(measured, 0) << js.out;
  // The new plan's prediction is the compute measured before the move plus
  // the exposed communication of the new buckets on the measured link. The
  // second half is what the re-plan decided, and a ratio that a change of
  // the host's speed between the two windows leaves alone: within 10 points.
  // (Twice the re-plan's own margin, kReplanShareMargin: loopback Gloo on
  // this 2-vCPU VM measured 29.3% against 35.7% predicted in one CI run,
  // its step within 13%; the wrong first plan is off by ~30 points.)
  const double predicted_compute = predicted * (1 - predicted_share);
  const double measured_compute = measured * (1 - measured_share);
  const std::string numbers = absl::StrFormat(
      "predicted step %.4f s (compute %.4f s, exposed communication %.1f%%), measured %.4f s "
      "(compute %.4f s, %.1f%%)\n",
      predicted, predicted_compute, 100 * predicted_share, measured, measured_compute,
      100 * measured_share);
  std::cout << numbers;
  EXPECT_LT(std::fabs(predicted_share - measured_share), 0.10) << numbers << st.out;
  // The step itself within 25% once the host's own drift is taken out: the
  // compute of the same model, micro-batch and threads measured before and
  // after the move differs only by the machine (this 2-vCPU VM ran the
  // second window 29% slower than the first with nothing else running, CI
  // of a75fa79), which no plan can predict.
  const double drift_free = predicted - predicted_compute + measured_compute;
  EXPECT_LT(std::fabs(drift_free - measured), 0.25 * measured) << numbers << st.out;
  // And the drift itself is bounded: more than 2x is not a slower host but
  // a broken measurement.
  EXPECT_LT(std::fabs(predicted - measured), measured) << numbers << st.out;
  // Every rank resumed from the re-plan's checkpoint.
  for (const char* r : {"0", "1"}) {
    Result logs = Dgca(coord, {"logs", job, "--rank", r});
    EXPECT_NE(logs.out.find("resum"), std::string::npos) << logs.out;
  }
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
