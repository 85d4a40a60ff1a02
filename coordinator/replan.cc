// The re-plan of a running job (replan.h).
#include "coordinator/replan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/plan_checks.h"
#include "planner/decisions.h"
#include "planner/link_model.h"
#include "planner/planner.h"
#include "planner/units.h"

namespace dgca {

std::string ReplanReason(const v1::JobSpec& spec, const v1::Plan& plan,
                         const std::vector<StepSample>& samples) {
  if (plan.tuning_mode() != "auto" || spec.kind() == "comm_probe") return "";
  if (plan.predicted_step_seconds() <= 0 || samples.size() < kMinStepSamples) return "";
  const StepMedians med = MediansOf(samples, std::max(1, plan.accumulation()));
  if (med.step <= 0) return "";
  const double err = RelativeError(plan.predicted_step_seconds(), med.step);
  const double share_off = med.comm_share - plan.predicted_comm_share();
  std::vector<std::string> why;
  if (std::fabs(err) > kReplanStepMargin)
    why.push_back(absl::StrFormat("step %.4f s measured vs %.4f s predicted (%+.0f%%, margin %.0f%%)",
                                  med.step, plan.predicted_step_seconds(), 100 * err,
                                  100 * kReplanStepMargin));
  if (plan.ranks() > 1 && std::fabs(share_off) > kReplanShareMargin)
    why.push_back(absl::StrFormat(
        "exposed communication %.1f%% of the step measured vs %.1f%% predicted (margin %.0f "
        "points)",
        100 * med.comm_share, 100 * plan.predicted_comm_share(), 100 * kReplanShareMargin));
  return absl::StrJoin(why, "; ");
}

PlannerMeasurements MeasurementsOfJob(const v1::JobSpec& spec, const v1::Plan& plan,
                                      const std::vector<v1::Topology>& topo,
                                      const std::vector<StepSample>& samples,
                                      const PlannerMeasurements& base) {
  PlannerMeasurements meas = base;
  const int k = std::max(1, plan.accumulation());
  const StepMedians med = MediansOf(samples, k);
  const std::string from =
      absl::StrFormat("measured by this job (median of its first %d rank-steps)",
                      static_cast<int>(samples.size()));
  // The compute that, with the exposed share, makes up the median step: the
  // new plan is checked against the median step, and on a noisy host the
  // median of per-step compute runs below it (steps whose all-reduce waited
  // long are not those whose compute did).
  const double compute = med.step * (1 - med.comm_share) / k;
  if (compute > 0) {
    meas.step_seconds = compute;
    meas.step_micro_batch = plan.micro_batch();
    meas.step_source = from;
  }
  const int n = plan.ranks();
  if (n > 1 && med.allreduce > 0) {
    PlanBuilder scratch;
    const double grad_bytes = DescribeModel(spec, &scratch).grad_bytes();
    const LinkModel prior = ModelLink(topo, n, plan.device() == "cuda", base);
    const double bucket = std::max(1.0, plan.bucket_mb() * kMiB);
    const double nb = std::ceil(grad_bytes / bucket);
    const double f = 2.0 * (n - 1) / n;
    // What is left for the bytes after the prior's latency per bucket; at
    // least half the measured time (a latency prior above the measurement
    // is not one to subtract in full).
    const double wire = std::max(med.allreduce - nb * prior.latency, 0.5 * med.allreduce);
    meas.allreduce_bus_bandwidth = grad_bytes * f / wire;
    meas.allreduce_latency_s = prior.latency;
    meas.allreduce_source = absl::StrFormat(
        "%s: all-reduce %s per step for %s in %.0f bucket(s)", from,
        planner_text::Sec(med.allreduce), FormatBytes(grad_bytes), nb);
  }
  return meas;
}

absl::StatusOr<v1::Plan> Replan(const v1::JobSpec& spec, const v1::Plan& plan,
                                const std::vector<v1::Topology>& topo,
                                const PlannerMeasurements& meas) {
  v1::JobSpec held = spec;
  v1::ResourcesSpec* res = held.mutable_resources();
  res->set_ranks(plan.ranks());
  res->set_device(plan.device());
  if (plan.device() == "cpu") res->set_threads_per_rank(plan.threads_per_rank());
  held.mutable_comm()->set_backend(plan.backend());
  held.mutable_train()->set_precision(plan.precision());
  // The planner's, not trials: this job's steps are the measurement.
  held.mutable_tuning()->set_mode("model");
  auto again = MakePlan(held, topo, meas);
  if (!again.ok()) return again.status();
  again->set_tuning_mode(plan.tuning_mode());
  // The placement the job has (the re-plan holds the ranks where they are).
  again->mutable_rank_nodes()->CopyFrom(plan.rank_nodes());
  again->mutable_rank_local_devices()->CopyFrom(plan.rank_local_devices());
  return again;
}

std::string SettingsChange(const v1::Plan& from, const v1::Plan& to) {
  std::vector<std::string> out;
  if (from.micro_batch() != to.micro_batch())
    out.push_back(absl::StrCat("micro_batch ", from.micro_batch(), " -> ", to.micro_batch()));
  if (from.accumulation() != to.accumulation())
    out.push_back(absl::StrCat("accumulation ", from.accumulation(), " -> ", to.accumulation()));
  if (std::fabs(from.bucket_mb() - to.bucket_mb()) > 1e-9)
    out.push_back(absl::StrCat("bucket_mb ", planner_text::Num(from.bucket_mb()), " -> ",
                               planner_text::Num(to.bucket_mb())));
  if (from.attention() != to.attention())
    out.push_back(absl::StrCat("attention ", from.attention(), " -> ", to.attention()));
  return absl::StrJoin(out, ", ");
}

}  // namespace dgca
