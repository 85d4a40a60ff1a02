#include "coordinator/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dgca {
namespace {

void Decide(v1::Plan* plan, const std::string& name, const std::string& value,
            v1::ValueSource source, const std::string& reason) {
  v1::PlanDecision* d = plan->add_decisions();
  d->set_name(name);
  d->set_value(value);
  d->set_source(source);
  d->set_reason(reason);
}

int EffectiveCpus(const v1::Topology& t) {
  int cpus = std::max(1, t.cpu_count());
  if (t.cgroup_cpu_limit() > 0)
    cpus = std::max(1, std::min(cpus, static_cast<int>(t.cgroup_cpu_limit())));
  return cpus;
}

}  // namespace

absl::StatusOr<v1::Plan> MakePlan(const v1::JobSpec& spec,
                                  const std::vector<v1::Topology>& nodes,
                                  const PlannerMeasurements& m) {
  if (nodes.empty())
    return absl::InvalidArgumentError(
        "planner: no node topology to plan on (no worker agent registered)");
  (void)m;
  v1::Plan plan;
  const v1::Topology& node = nodes[0];
  int cpus = EffectiveCpus(node);

  // Device.
  plan.set_device("cpu");
  Decide(&plan, "resources.device", "cpu", v1::PLANNER,
         "first version: CPU only");

  // Ranks.
  int ranks;
  if (spec.resources().ranks() > 0) {
    ranks = spec.resources().ranks();
    Decide(&plan, "resources.ranks", absl::StrCat(ranks), v1::USER,
           "set in the spec");
  } else {
    ranks = std::max(1, std::min(2, cpus));
    Decide(&plan, "resources.ranks", absl::StrCat(ranks), v1::PLANNER,
           absl::StrCat("CPU: min(2, ", cpus, " cpus) = ", ranks));
  }
  plan.set_ranks(ranks);
  for (int r = 0; r < ranks; ++r) {
    plan.add_rank_nodes(node.node());
    plan.add_rank_local_devices(r);
  }

  plan.set_backend("gloo");
  Decide(&plan, "comm.backend", "gloo", v1::PLANNER, "CPU ranks use Gloo");

  int global_batch = spec.train().global_batch() > 0
                         ? spec.train().global_batch()
                         : 128;
  int acc = spec.train().accumulation() > 0 ? spec.train().accumulation() : 1;
  plan.set_accumulation(acc);
  Decide(&plan, "train.accumulation", absl::StrCat(acc),
         spec.train().accumulation() > 0 ? v1::USER : v1::DEFAULT,
         spec.train().accumulation() > 0 ? "set in the spec" : "default 1");
  int micro = spec.train().micro_batch() > 0
                  ? spec.train().micro_batch()
                  : std::max(1, global_batch / (ranks * acc));
  plan.set_micro_batch(micro);
  Decide(&plan, "train.micro_batch", absl::StrCat(micro),
         spec.train().micro_batch() > 0 ? v1::USER : v1::PLANNER,
         spec.train().micro_batch() > 0
             ? "set in the spec"
             : absl::StrCat("global_batch / (ranks * accumulation) = ",
                            global_batch, " / (", ranks, " * ", acc, ")"));

  double bucket =
      spec.comm().bucket_mb() > 0 ? spec.comm().bucket_mb() : 25.0;
  plan.set_bucket_mb(bucket);
  Decide(&plan, "comm.bucket_mb", absl::StrFormat("%g", bucket),
         spec.comm().bucket_mb() > 0 ? v1::USER : v1::DEFAULT,
         spec.comm().bucket_mb() > 0 ? "set in the spec" : "default 25 MB");

  plan.set_precision("fp32");
  Decide(&plan, "train.precision", "fp32", v1::PLANNER, "CPU trains in fp32");

  int tpr = spec.resources().threads_per_rank() > 0
                ? spec.resources().threads_per_rank()
                : std::max(1, cpus / ranks);
  plan.set_threads_per_rank(tpr);
  Decide(&plan, "resources.threads_per_rank", absl::StrCat(tpr),
         spec.resources().threads_per_rank() > 0 ? v1::USER : v1::PLANNER,
         absl::StrCat("max(1, ", cpus, " cpus / ", ranks, " ranks)"));

  int lt = spec.data().loader().threads() > 0 ? spec.data().loader().threads()
                                              : 1;
  plan.set_loader_threads(lt);
  Decide(&plan, "data.loader.threads", absl::StrCat(lt),
         spec.data().loader().threads() > 0 ? v1::USER : v1::DEFAULT,
         "one loader thread");
  for (const auto& kv : spec.comm().env()) (*plan.mutable_env())[kv.first] = kv.second;
  return plan;
}

}  // namespace dgca
