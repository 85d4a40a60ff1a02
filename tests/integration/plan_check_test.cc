// The planner learns step times from the jobs it ran (docs/planner.md,
// "Measurements and learning"), with the real programs over loopback gRPC and a real SQLite
// file: a finished 2-rank CPU job stores its plan check (medians over every
// rank's steady-state steps from the streamed step metrics) and its compute
// per micro-step; the next `dgca plan` of the same model cites that job and
// predicts a step time; the next job's plan check compares that prediction
// with what it measured, in `dgca status` and in a "plan" event. A job of
// another model gets no step time from it, only the efficiency its compute
// prior uses on this CPU. How close the predictions are
// is a benchmark (bench/planner/run.sh), not asserted here.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

class PlanCheckTest : public CoordinatorSuite<PlanCheckTest, true> {
 public:
  static constexpr const char* kName = "plancheck";
};

std::string Spec(const std::string& dir, const std::string& name, int micro, int hidden) {
  std::string path = dir + "/" + name + ".yaml";
  WriteFile(path,
            "name: " + name + "\n"
            "model: {preset: tiny, hidden: " + std::to_string(hidden) + "}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  eval: " + SharedData() + "/ecspell/test_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: 10, global_batch: " + std::to_string(2 * micro) +
            ", micro_batch: " + std::to_string(micro) +
            ", accumulation: 1, eval_every: 0, checkpoint_every: 0}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n"
            "comm: {backend: gloo, bucket_mb: 25}\n"
            "tuning: {mode: model}\n");
  return path;
}

double Num(const JsonValue* v) {
  if (v == nullptr) return 0;  // proto3 JSON omits zeros
  if (v->is_number()) return v->number;
  if (v->is_string()) return std::atof(v->string.c_str());
  return 0;
}

struct Check {
  double samples = 0, pred_step = 0, meas_step = 0, pred_share = 0, meas_share = 0,
         meas_compute = 0, meas_allreduce = 0;
};

Check PlanCheckOf(const CoordinatorProcess& c, const std::string& job, std::string* raw) {
  Result r = Dgca(c, {"status", "--json", job}, 20s);
  *raw = r.out + r.err;
  Check out;
  auto j = Json(r.out);
  if (!j.ok() || !j->Find("job")) return out;
  const JsonValue* pc = j->Find("job")->Find("plan_check");
  if (!pc) return out;
  out.samples = Num(pc->Find("samples"));
  out.pred_step = Num(pc->Find("predicted_step_seconds"));
  out.meas_step = Num(pc->Find("measured_step_seconds"));
  out.pred_share = Num(pc->Find("predicted_comm_share"));
  out.meas_share = Num(pc->Find("measured_comm_share"));
  out.meas_compute = Num(pc->Find("measured_compute_seconds"));
  out.meas_allreduce = Num(pc->Find("measured_allreduce_seconds"));
  return out;
}

std::string Submit(const CoordinatorProcess& c, const std::string& spec) {
  Result r = Dgca(c, {"submit", spec, "--wait"}, 180s);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return r.out.substr(0, r.out.find('\n'));
}

TEST_F(PlanCheckTest, FinishedJobsTeachThePlannerTheStepTime) {
  // 1. Nothing of the model measured yet: the compute prior predicts (the
  // embedded agent measured this CPU's GEMM rate); the job measures and
  // stores.
  std::string a_spec = Spec(*dir_, "calib-m4", 4, 64);
  Result before = Dgca(*coord_, {"plan", a_spec, "--json"}, 60s);
  ASSERT_EQ(before.code, 0) << before.out << before.err;
  auto bj = Json(before.out);
  ASSERT_TRUE(bj.ok()) << before.out;
  EXPECT_GT(Num(bj->Find("predicted_step_seconds")), 0) << before.out;
  EXPECT_EQ(JsonStr(bj->Find("compute_source")), "prior") << before.out;

  std::string a = Submit(*coord_, a_spec);
  ASSERT_FALSE(a.empty());
  std::string raw;
  Check ca = PlanCheckOf(*coord_, a, &raw);
  // 2 ranks x (10 steps - 2 warm-up steps each).
  EXPECT_EQ(ca.samples, 16) << raw;
  EXPECT_NEAR(ca.pred_step, Num(bj->Find("predicted_step_seconds")), 1e-9) << raw;
  EXPECT_GT(ca.meas_step, 0) << raw;
  EXPECT_GT(ca.meas_compute, 0) << raw;
  EXPECT_LE(ca.meas_compute, ca.meas_step) << raw;
  EXPECT_GT(ca.meas_allreduce, 0) << raw;  // 2 ranks all-reduce every step
  EXPECT_GE(ca.meas_share, 0) << raw;
  EXPECT_LT(ca.meas_share, 1) << raw;
  Result sa = Dgca(*coord_, {"status", a}, 20s);
  EXPECT_NE(sa.out.find("predicted vs measured"), std::string::npos) << sa.out;
  EXPECT_NE(sa.out.find("efficiency "), std::string::npos) << sa.out;  // of the ideal, stored
  EXPECT_NE(sa.out.find("stored compute"), std::string::npos) << sa.out;
  EXPECT_NE(sa.out.find("and peak memory"), std::string::npos) << sa.out;
  // What job a's ranks held at micro-batch 4, and its excess per sample over
  // the fixed part of its plan's memory model: the next plan's memory line
  // goes through that point with the larger of the two slopes.
  double a_peak = 0, a_slope = 0, model_act = 0;
  {
    auto aj = Json(raw);
    ASSERT_TRUE(aj.ok() && aj->Find("job") && aj->Find("plan")) << raw;
    const JsonValue* p = aj->Find("plan");
    const double act = Num(p->Find("predicted_activation_bytes_per_sample"));
    model_act = act;  // job a's plan had no measurement: the memory model's
    const double fixed = Num(p->Find("predicted_memory_bytes")) - 4 * act;
    const JsonValue* b = aj->Find("job")->Find("plan_check")->Find("breakdown");
    ASSERT_TRUE(b && b->Find("ranks")) << raw;
    for (const auto& r : b->Find("ranks")->array) {
      a_peak = std::max(a_peak, Num(r.Find("peak_memory_bytes")));
    }
    ASSERT_GT(a_peak, 0) << raw;
    a_slope = std::max(act, (a_peak - fixed) / 4);
  }

  // 2. The same model at micro-batch 8: the plan predicts from job a, and
  // says so. One point: c(8) = c_a x 8 / 4.
  std::string b_spec = Spec(*dir_, "test-m8", 8, 64);
  Result plan = Dgca(*coord_, {"plan", b_spec, "--json"}, 60s);
  ASSERT_EQ(plan.code, 0) << plan.out << plan.err;
  auto pj = Json(plan.out);
  ASSERT_TRUE(pj.ok()) << plan.out;
  const double predicted = Num(pj->Find("predicted_step_seconds"));
  EXPECT_GT(predicted, 0) << plan.out;
  EXPECT_NEAR(Num(pj->Find("predicted_single_rank_samples_per_second")),
              8 / (2 * ca.meas_compute), 1e-6 * 8 / (2 * ca.meas_compute))
      << plan.out;
  EXPECT_GE(predicted, 2 * ca.meas_compute * (1 - 1e-9)) << plan.out;
  EXPECT_NE(plan.out.find("job " + a + " m=4"), std::string::npos) << plan.out;
  EXPECT_NE(plan.out.find("predicted.step_seconds"), std::string::npos) << plan.out;
  // Its memory too: through job a's peak at 4, predicted at 8.
  EXPECT_NEAR(Num(pj->Find("predicted_activation_bytes_per_sample")), a_slope, 1e-6 * a_slope)
      << plan.out;
  EXPECT_NEAR(Num(pj->Find("predicted_memory_bytes")), a_peak + 4 * a_slope, 1e-6 * a_peak)
      << plan.out;
  EXPECT_NE(plan.out.find("job " + a + " held "), std::string::npos) << plan.out;

  // 3. That job's plan check holds the same prediction and its measurement.
  std::string b = Submit(*coord_, b_spec);
  ASSERT_FALSE(b.empty());
  Check cb = PlanCheckOf(*coord_, b, &raw);
  EXPECT_EQ(cb.samples, 16) << raw;
  EXPECT_NEAR(cb.pred_step, predicted, 1e-9 * predicted) << raw;
  EXPECT_GT(cb.pred_share, 0) << raw;
  EXPECT_GT(cb.meas_step, 0) << raw;
  Result sb = Dgca(*coord_, {"status", b}, 20s);
  EXPECT_NE(sb.out.find("plan check (medians of 16 rank-steps"), std::string::npos) << sb.out;
  EXPECT_NE(sb.out.find("PREDICTED"), std::string::npos) << sb.out;
  EXPECT_NE(sb.out.find("predicted vs measured"), std::string::npos) << sb.out;

  double b_peak = 0;
  {
    auto bj = Json(raw);
    ASSERT_TRUE(bj.ok() && bj->Find("job")) << raw;
    const JsonValue* br = bj->Find("job")->Find("plan_check")->Find("breakdown");
    ASSERT_TRUE(br && br->Find("ranks")) << raw;
    for (const auto& r : br->Find("ranks")->array)
      b_peak = std::max(b_peak, Num(r.Find("peak_memory_bytes")));
    ASSERT_GT(b_peak, 0) << raw;
  }

  // 4. Two micro-batches measured now: the next plan fits a line through
  // both, for the step time and for memory (the slope between the two
  // peaks, or the model's when that is larger, and the line on or above
  // both).
  Result fit = Dgca(*coord_, {"plan", Spec(*dir_, "test-m6", 6, 64), "--json"}, 60s);
  ASSERT_EQ(fit.code, 0) << fit.out << fit.err;
  EXPECT_NE(fit.out.find("job " + b + " m=8"), std::string::npos) << fit.out;
  EXPECT_NE(fit.out.find("job " + a + " m=4"), std::string::npos) << fit.out;
  EXPECT_NE(fit.out.find("fitted over micro-batches 4, 8"), std::string::npos) << fit.out;
  EXPECT_NE(fit.out.find("job " + b + " held "), std::string::npos) << fit.out;
  {
    auto fj = Json(fit.out);
    ASSERT_TRUE(fj.ok()) << fit.out;
    const double slope = Num(fj->Find("predicted_activation_bytes_per_sample"));
    // The fitted slope, never below the memory model's.
    EXPECT_NEAR(slope, std::max((b_peak - a_peak) / 4, model_act), 1e-6 * b_peak) << fit.out;
    const double at6 = std::max(a_peak + 2 * slope, b_peak - 2 * slope);
    EXPECT_NEAR(Num(fj->Find("predicted_memory_bytes")), at6, 1e-6 * at6) << fit.out;
  }

  // 5. Another model (hidden 32): its timing is not this model's, but the
  // efficiency these jobs reached on this CPU serves its compute prior.
  Result other = Dgca(*coord_, {"plan", Spec(*dir_, "other", 8, 32), "--json"}, 60s);
  ASSERT_EQ(other.code, 0) << other.out << other.err;
  auto oj = Json(other.out);
  ASSERT_TRUE(oj.ok());
  EXPECT_EQ(JsonStr(oj->Find("compute_source")), "prior") << other.out;
  EXPECT_EQ(other.out.find("job " + a + " m=4"), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("the median of the newest 2 job(s) on cpu"), std::string::npos)
      << other.out;
}

// dgca diagnose JOB on the real ranks' step metrics: while the job runs
// (from its steps so far) and after it ends (the breakdown stored with the
// plan check). The parts add up to the step, every rank has a row on its
// node, the job's figures are its critical rank's, the finished job's
// samples are its plan check's, and the limiting stage is the costliest one
// past its limit (compute when none is). Which
// stage limits a tiny CPU job on this machine is not asserted.
TEST_F(PlanCheckTest, DiagnoseBreaksDownTheRealRanksSteps) {
  const std::string spec = WriteTinySpec(*dir_, "diag", 400);
  Result sub = Dgca(*coord_, {"submit", spec}, 60s);
  ASSERT_EQ(sub.code, 0) << sub.out << sub.err;
  const std::string id = Trim(sub.out.substr(0, sub.out.find('\n')));
  ASSERT_FALSE(id.empty());

  struct Diag {
    int code = -1;
    bool live = false;
    std::string state, limiting, raw;
    double samples = 0, step = 0, data = 0, compute = 0, exposed = 0;
    std::vector<std::string> rank_nodes;
    std::vector<double> rank_samples, rank_steps, rank_peaks;
    int critical = -1;
    bool memory_known = false;
    double memory_peak = 0, memory_predicted = 0, memory_target = 0, memory_device = 0;
    int memory_rank = -1;
    struct Finding {
      std::string stage;
      double share = 0;
      bool limiting = false, above = false, near = false;
    };
    std::vector<Finding> findings;
  };
  auto diagnose = [&](Diag* d) {
    Result r = Dgca(*coord_, {"diagnose", "--json", id}, 20s);
    d->code = r.code;
    d->raw = r.out + r.err;
    if (r.code != 0) return;
    auto parsed = Json(r.out);
    if (!parsed.ok()) return;
    const JsonValue& j = *parsed;
    d->live = j.Find("live") && j.Find("live")->boolean;
    d->state = JsonStr(j.Find("state"));
    d->limiting = JsonStr(j.Find("limiting_stage"));
    const JsonValue* b = j.Find("breakdown");
    if (!b) return;
    d->samples = Num(b->Find("samples"));
    d->step = Num(b->Find("step_seconds"));
    d->data = Num(b->Find("data_wait_seconds"));
    d->compute = Num(b->Find("compute_seconds"));
    d->exposed = Num(b->Find("exposed_comm_seconds"));
    d->critical = static_cast<int>(Num(b->Find("critical_rank")));
    if (const JsonValue* rs = b->Find("ranks"); rs && rs->is_array()) {
      for (const auto& r : rs->array) {
        d->rank_nodes.push_back(JsonStr(r.Find("node")));
        d->rank_samples.push_back(Num(r.Find("samples")));
        d->rank_steps.push_back(Num(r.Find("step_seconds")));
        d->rank_peaks.push_back(Num(r.Find("peak_memory_bytes")));
      }
    }
    if (const JsonValue* m = j.Find("memory")) {
      d->memory_known = m->Find("known") && m->Find("known")->boolean;
      d->memory_rank = static_cast<int>(Num(m->Find("rank")));
      d->memory_peak = Num(m->Find("peak_bytes"));
      d->memory_predicted = Num(m->Find("predicted_bytes"));
      d->memory_target = Num(m->Find("target_bytes"));
      d->memory_device = Num(m->Find("device_bytes"));
    }
    if (const JsonValue* fs = j.Find("findings"); fs && fs->is_array()) {
      for (const auto& f : fs->array) {
        d->findings.push_back({JsonStr(f.Find("stage")), Num(f.Find("share")),
                               f.Find("limiting") && f.Find("limiting")->boolean,
                               f.Find("above_limit") && f.Find("above_limit")->boolean,
                               f.Find("near_limit") && f.Find("near_limit")->boolean});
      }
    }
  };
  auto check = [&](const Diag& d) {
    EXPECT_GT(d.step, 0) << d.raw;
    EXPECT_NEAR(d.data + d.compute + d.exposed, d.step, 1e-9 + 1e-6 * d.step) << d.raw;
    ASSERT_EQ(d.rank_nodes.size(), 2u) << d.raw;
    EXPECT_FALSE(d.rank_nodes[0].empty()) << d.raw;
    EXPECT_EQ(d.rank_samples[0] + d.rank_samples[1], d.samples) << d.raw;
    // The job's figures are its critical rank's.
    ASSERT_TRUE(d.critical == 0 || d.critical == 1) << d.raw;
    EXPECT_DOUBLE_EQ(d.step, d.rank_steps[d.critical]) << d.raw;
    ASSERT_EQ(d.findings.size(), 4u) << d.raw;  // data, compute, comm, straggler
    std::string costliest = "compute";
    double cost = 0;
    int limiting = 0;
    for (const auto& f : d.findings) {
      limiting += f.limiting;
      if (f.above && !f.near && f.share > cost) {
        cost = f.share;
        costliest = f.stage;
      }
    }
    EXPECT_EQ(limiting, 1) << d.raw;
    EXPECT_EQ(d.limiting, costliest) << d.raw;
    // Memory: each rank's real peak resident set (VmHWM), the larger named,
    // against the plan's model and its target (70% of host memory / 2).
    ASSERT_TRUE(d.memory_known) << d.raw;
    ASSERT_EQ(d.rank_peaks.size(), 2u) << d.raw;
    for (double p : d.rank_peaks) {
      EXPECT_GT(p, 1 << 20) << d.raw;  // a process with a model is past 1 MiB
      EXPECT_LT(p, d.memory_device) << d.raw;
    }
    ASSERT_TRUE(d.memory_rank == 0 || d.memory_rank == 1) << d.raw;
    EXPECT_DOUBLE_EQ(d.memory_peak, std::max(d.rank_peaks[0], d.rank_peaks[1])) << d.raw;
    EXPECT_GT(d.memory_predicted, 0) << d.raw;
    EXPECT_GT(d.memory_target, 0) << d.raw;
    EXPECT_GT(d.memory_device, d.memory_target) << d.raw;
  };

  // While it runs: refused until the ranks are past their warm-up steps,
  // then a live breakdown.
  Diag live;
  ASSERT_TRUE(WaitUntil([&] {
    diagnose(&live);
    if (live.code != 0) {
      EXPECT_EQ(live.code, 2) << live.raw;  // too few steps yet: not an error of the job
      EXPECT_NE(live.raw.find("steady-state rank-step"), std::string::npos) << live.raw;
    }
    // Both ranks past their warm-up (each rank streams on its own).
    return (live.code == 0 && live.rank_nodes.size() == 2) ||
           Status(*coord_, id).state == "SUCCEEDED";
  }, 120s));
  if (live.code == 0 && live.live) {
    EXPECT_EQ(live.state, "RUNNING") << live.raw;
    check(live);
  } else {
    ADD_FAILURE() << "the 400-step job ended before a live diagnosis (raise its steps): "
                  << live.raw;
  }

  ASSERT_TRUE(WaitUntil([&] { return Status(*coord_, id).state == "SUCCEEDED"; }, 180s));
  Diag done;
  diagnose(&done);
  ASSERT_EQ(done.code, 0) << done.raw;
  EXPECT_FALSE(done.live) << done.raw;
  EXPECT_EQ(done.state, "SUCCEEDED");
  check(done);
  std::string raw;
  const Check pc = PlanCheckOf(*coord_, id, &raw);
  EXPECT_EQ(done.samples, pc.samples) << raw;

  // The table names the stages, the ranks and the limiting stage.
  Result text = Dgca(*coord_, {"diagnose", id}, 20s);
  ASSERT_EQ(text.code, 0) << text.out << text.err;
  for (const char* want :
       {"data wait", "compute", "exposed comm", "RANK", "straggler", "(peak resident set)"}) {
    EXPECT_NE(text.out.find(want), std::string::npos) << want << "\n" << text.out;
  }
  EXPECT_NE(text.out.find("limiting stage: " + done.limiting), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("LIMITS"), std::string::npos) << text.out;

  Result unknown = Dgca(*coord_, {"diagnose", "j-000999-none"}, 20s);
  EXPECT_EQ(unknown.code, 2) << unknown.out << unknown.err;
}

}  // namespace
}  // namespace itest
}  // namespace dgca
