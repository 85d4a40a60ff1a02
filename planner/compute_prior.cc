// The compute prior (compute_prior.h).
#include "planner/compute_prior.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/core/compute_cost.h"
#include "planner/units.h"

namespace dgca {
namespace {

using planner_text::Num;
using planner_text::Rate;
using planner_text::Sec;

std::string Flops(double f) { return absl::StrFormat("%.3g TFLOP/s", f / 1e12); }

// The slowest GPU of the nodes for `precision`; false (and *why) when one
// is missing from the table or no node has a GPU.
bool SlowestGpu(const std::vector<v1::Topology>& nodes, Precision precision, GpuPeak* out,
                std::string* name, std::string* why) {
  bool any = false;
  for (const auto& t : nodes) {
    for (const auto& g : t.gpus()) {
      const std::optional<GpuPeak> row = LookupGpuPeak(g.name());
      if (!row) {
        *why = absl::StrCat("no compute prior: GPU \"", g.name().empty() ? "(name unknown)" : g.name(),
                            "\" on ", t.node(),
                            " is not in the table of GPU peaks (model/core/compute_cost.cc)");
        return false;
      }
      if (!any || row->For(precision) < out->For(precision)) {
        *out = *row;
        *name = g.name();
      }
      any = true;
    }
  }
  if (!any) *why = "no compute prior: no node reports a GPU";
  return any;
}

}  // namespace

double CpuRankGemmRate(const v1::Topology& t, int ranks_per_node, int threads_per_rank) {
  const double one = t.cpu_gemm_flops_one_thread();
  const double all = t.cpu_gemm_flops_all_threads() > 0 ? t.cpu_gemm_flops_all_threads() : one;
  if (one <= 0) return 0;
  const int cpus = std::max(1, t.cpu_count());
  const int threads = std::max(1, threads_per_rank);
  // The rank's own threads, as measured in one process (our pool's split
  // of a GEMM: on the build VM 2 threads give 1.2x one, not 2x).
  double rate = threads >= cpus ? all : one + (all - one) * (threads - 1) / std::max(1, cpus - 1);
  // Ranks on cores of their own do not share; beyond the CPUs they do.
  const int want = std::max(1, ranks_per_node) * threads;
  if (want > cpus) rate *= static_cast<double>(cpus) / want;
  return rate;
}

double ComputePrior::Ideal(int m) const {
  if (!ok) return 0;
  return optimizer_bytes / bandwidth + m * flops_per_sample / peak;
}

ComputePrior PriorStepTime(const std::vector<v1::Topology>& nodes, bool cuda,
                           Precision precision, const ModelConfig& cfg, int seq_len,
                           int threads_per_rank, int ranks_per_node,
                           const PlannerMeasurements& meas) {
  ComputePrior p;
  p.flops_per_sample = TrainFlopsPerSample(cfg, seq_len);
  p.optimizer_bytes = kOptimizerBytesPerParameter * static_cast<double>(CountParameters(cfg));
  std::string device;  // what the arithmetic names
  double record = 0;
  std::string record_why;
  if (cuda) {
    GpuPeak g;
    std::string name;
    if (!SlowestGpu(nodes, precision, &g, &name, &p.why)) return p;
    p.peak = g.For(precision);
    p.bandwidth = g.memory_bandwidth;
    if (p.peak <= 0 || p.bandwidth <= 0) {
      p.why = absl::StrCat("no compute prior: the table has no ", PrecisionName(precision),
                           " peak for ", g.model);
      return p;
    }
    p.device_class = absl::StrCat("gpu ", g.model, " ", PrecisionName(precision));
    device = absl::StrFormat("%s (%s): %s %s peak, %s memory (%s)", name, g.model, Flops(p.peak),
                             PrecisionName(precision), Rate(p.bandwidth), g.source);
    record = kGpuEfficiencyOfRecord;
    record_why = "the H200 run of record, bench/gpu/RESULTS.md";
  } else {
    // The node that gives a rank the least: its GEMM rate for all the
    // threads its ranks run, shared by them.
    const int threads = std::max(1, threads_per_rank);
    const int ranks = std::max(1, ranks_per_node);
    const v1::Topology* slowest = nullptr;
    double rate = 0;
    for (const auto& t : nodes) {
      const double r = CpuRankGemmRate(t, ranks, threads);
      if (r <= 0) {
        p.why = absl::StrCat("no compute prior: ", t.node(),
                             "'s CPU GEMM rate was not measured (the agent runs `dgca-worker "
                             "gemm-rate` at start; see `dgca topo` for why it could not)");
        return p;
      }
      if (slowest == nullptr || r < rate) {
        slowest = &t;
        rate = r;
      }
    }
    if (slowest == nullptr) {
      p.why = "no compute prior: no node";
      return p;
    }
    p.peak = rate;
    p.bandwidth = kCpuBandwidthPerThread * threads;
    const std::string model = slowest->cpu_model().empty() ? "CPU" : slowest->cpu_model();
    p.device_class = absl::StrCat("cpu ", model, " x", threads);
    const double core_peak = CpuCorePeakFlops(slowest->cpu_mhz(), slowest->cpu_vector_bits());
    device = absl::StrFormat(
        "%s: GEMM measured at %s on 1 thread, %s on %d CPU(s), so %s for %d rank(s) x %d "
        "thread(s) each%s; %s memory (%s per thread)",
        model, Flops(slowest->cpu_gemm_flops_one_thread()),
        Flops(slowest->cpu_gemm_flops_all_threads()), std::max(1, slowest->cpu_count()),
        Flops(rate), ranks, threads,
        core_peak > 0 ? absl::StrFormat(" (a core's peak: %s MHz x %d-bit SIMD = %s)",
                                        Num(slowest->cpu_mhz()), slowest->cpu_vector_bits(),
                                        Flops(core_peak))
                      : "",
        Rate(p.bandwidth), Rate(kCpuBandwidthPerThread));
    record = kCpuEfficiencyOfRecord;
    record_why = "CPU jobs on the build machine, bench/planner/RESULTS-prior.md";
  }
  p.efficiency = meas.compute_efficiency > 0 ? meas.compute_efficiency : record;
  const std::string e_why = meas.compute_efficiency > 0
                                ? meas.compute_efficiency_source
                                : absl::StrCat("no job measured on ", p.device_class, " yet; ",
                                               record_why);
  p.fixed = p.optimizer_bytes / p.bandwidth / p.efficiency;
  p.per_sample = p.flops_per_sample / p.peak / p.efficiency;
  p.ok = true;
  p.why = absl::StrFormat(
      "compute prior: c(m) = (%s optimizer traffic / %s + m x %.3g GFLOP / %s) / efficiency "
      "%.3f = %s + %s x m (%s; efficiency: %s)",
      FormatBytes(p.optimizer_bytes), Rate(p.bandwidth), p.flops_per_sample / 1e9, Flops(p.peak),
      p.efficiency, Sec(p.fixed), Sec(p.per_sample), device, e_why);
  return p;
}

double EfficiencyOf(const v1::Plan& plan, double measured_seconds) {
  const double ideal = plan.compute_ideal_fixed_seconds() +
                       plan.micro_batch() * plan.compute_ideal_seconds_per_sample();
  if (plan.compute_device_class().empty() || ideal <= 0 || measured_seconds <= 0) return 0;
  return ideal / measured_seconds;
}

}  // namespace dgca
