#include "planner/trials.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/decisions.h"
#include "planner/units.h"

namespace dgca {

using planner_text::Num;

void DecideByTrials(const v1::JobSpec& spec, const ModelFacts& model, bool cuda,
                    const MemoryPlan& memory, const BatchPlan& batch, TrialRunner* runner,
                    PlanBuilder* b) {
  const std::string& mode = model.mode;
  if (mode != "trial" && mode != "auto") return;
  v1::Plan& plan = b->plan();
  if (runner == nullptr) {
    if (mode == "trial")
      b->Warn("tuning.mode trial: this dry run has no trials, so the plan is the model's; a "
              "submitted job times the best candidates on its ranks before it starts");
    return;
  }
  // Candidates around the model's choice, ranked by predicted samples/s.
  const int n = plan.ranks();
  const CostInputs& in = batch.in;
  struct Cand {
    int m, k;
    double bucket;
    Prediction p;
  };
  std::vector<Cand> cands;
  std::set<std::tuple<int, int, long>> seen;
  auto add = [&](int m, int k, double bucket) {
    if (m < 1 || k < 1 || bucket <= 0) return;
    if (spec.train().micro_batch() > 0 && m != spec.train().micro_batch()) return;
    if (spec.train().accumulation() > 0 && k != spec.train().accumulation()) return;
    if (spec.comm().bucket_mb() > 0 && bucket != plan.bucket_mb() * kMiB) return;
    auto key = std::make_tuple(m, k, static_cast<long>(bucket / kMiB));
    if (!seen.insert(key).second) return;
    cands.push_back({m, k, bucket, Predict(n, m, k, bucket, in, batch.link)});
  };
  const double bucket = plan.bucket_mb() * kMiB;
  add(plan.micro_batch(), plan.accumulation(), bucket);
  if (plan.micro_batch() % 2 == 0) add(plan.micro_batch() / 2, plan.accumulation() * 2, bucket);
  if (plan.accumulation() % 2 == 0 &&
      (in.max_micro == 0 || plan.micro_batch() * 2 <= in.max_micro))
    add(plan.micro_batch() * 2, plan.accumulation() / 2, bucket);
  if (n > 1) {
    add(plan.micro_batch(), plan.accumulation(), std::max(kMiB, std::floor(bucket / 2 / kMiB) * kMiB));
    add(plan.micro_batch(), plan.accumulation(), std::min(in.grad_bytes, bucket * 2));
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Cand& x, const Cand& y) { return x.p.sps > y.p.sps; });
  if (cands.size() > static_cast<size_t>(kMaxTrials)) cands.resize(kMaxTrials);
  double budget = spec.tuning().budget_s() > 0 ? spec.tuning().budget_s() : 120;
  int best = -1;
  int skipped = 0;
  double best_sps = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    const Cand& c = cands[i];
    v1::Plan cand = plan;
    cand.clear_decisions();
    cand.clear_trials();
    cand.set_micro_batch(c.m);
    cand.set_accumulation(c.k);
    cand.set_bucket_mb(c.bucket / kMiB);
    v1::Trial* t = plan.add_trials();
    t->set_ranks(n);
    t->set_micro_batch(c.m);
    t->set_accumulation(c.k);
    t->set_bucket_mb(c.bucket / kMiB);
    t->set_predicted_step_seconds(c.p.step);
    t->set_predicted_samples_per_second(c.p.sps);
    if (budget <= 0) {
      t->set_note("skipped: tuning.budget_s used up");
      ++skipped;
      continue;
    }
    auto r = runner->TimeStep(cand, budget);
    if (!r.ok() && absl::IsResourceExhausted(r.status())) {  // the runner's own budget
      t->set_note(absl::StrCat("skipped: ", r.status().message()));
      ++skipped;
      continue;
    }
    if (!r.ok() || *r <= 0) {
      t->set_note(absl::StrCat("failed: ", r.ok() ? "non-positive time" : r.status().ToString()));
      continue;
    }
    budget -= *r * 10;  // a trial runs a handful of steps; charge ten
    const double sps = static_cast<double>(n) * c.m * c.k / *r;
    t->set_measured_step_seconds(*r);
    t->set_samples_per_second(sps);
    t->set_note(c.p.known ? absl::StrFormat("model predicted %s samples/s", Num(c.p.sps))
                          : "no prediction");
    if (sps > best_sps) {
      best_sps = sps;
      best = static_cast<int>(i);
    }
  }
  if (best < 0) {
    b->Warn(skipped == static_cast<int>(cands.size())
                ? "no tuning trial fitted in tuning.budget_s; keeping the model's plan"
                : "every tuning trial failed; keeping the model's plan");
    return;
  }
  const Cand& c = cands[best];
  plan.mutable_trials(best)->set_note(plan.trials(best).note() + "; kept (fastest)");
  plan.set_compute_source("trial");
  // The trials measured what the model lacked: its warning no longer holds.
  auto* warnings = plan.mutable_warnings();
  warnings->erase(std::remove_if(warnings->begin(), warnings->end(),
                                 [](const std::string& w) {
                                   return absl::StartsWith(w, "no step-time measurement");
                                 }),
                  warnings->end());
  const std::string why = absl::StrFormat("trial: fastest of %d timed candidates, %s "
                                          "samples/s measured",
                                          static_cast<int>(cands.size()), Num(best_sps));
  if (c.m != plan.micro_batch()) {
    plan.set_micro_batch(c.m);
    b->Decide("train.micro_batch", absl::StrCat(c.m), v1::PLANNER, why);
  }
  if (c.k != plan.accumulation()) {
    plan.set_accumulation(c.k);
    b->Decide("train.accumulation", absl::StrCat(c.k), v1::PLANNER, why);
  }
  if (c.bucket / kMiB != plan.bucket_mb()) {
    plan.set_bucket_mb(c.bucket / kMiB);
    b->Decide("comm.bucket_mb", Num(c.bucket / kMiB), v1::PLANNER, why);
  }
  const v1::Trial& bt = plan.trials(best);
  plan.set_predicted_step_seconds(bt.measured_step_seconds());
  plan.set_predicted_samples_per_second(bt.samples_per_second());
  const Prediction p = Predict(n, c.m, c.k, c.bucket, in, batch.link);
  if (p.known && bt.measured_step_seconds() > 0)
    plan.set_predicted_comm_share(std::max(0.0, bt.measured_step_seconds() - c.k * p.compute) /
                                  bt.measured_step_seconds());
  PredictMemory(memory.est, c.m, memory.why, cuda, b);
}

}  // namespace dgca
