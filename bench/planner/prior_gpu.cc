// dgca-bench-prior-gpu: the compute prior's first-plan step time
// (planner/compute_prior.h) against the GPU steps measured in
// bench/gpu/RESULTS.md (bert-base, seq 128, bf16, micro-batch 128 on one
// H200, both sessions). The prior is the planner's own code; the measured
// figures are copied from that file's tables, each row citing its table.
// Prints a Markdown table and the mean absolute error.
//
// The first row is the run the GPU efficiency of record was taken from
// (kGpuEfficiencyOfRecord), so its error is ~0 by construction; the others
// are different kernels, dropout or an older build, which the prior does
// not model (it knows FLOPs, the peak and one efficiency).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "planner/compute_prior.h"

int main() {
  struct Row {
    const char* what;
    double measured_ms;
  };
  const std::vector<Row> rows = {
      {"run 3: CUDA graphs, fused attention (the run of record)", 30.10},
      {"run 3: no CUDA graphs, fused attention", 30.7},
      {"run 3: CUDA graphs, GEMM attention", 40.8},
      {"run 3: dropout 0.1", 35.2},
      {"first session: CUDA graphs, fused attention (older kernels)", 34.39},
      {"first session: no CUDA graphs, fused attention", 34.93},
      {"first session: CUDA graphs, GEMM attention", 41.10},
      {"first session: dropout 0.1", 40.12},
  };
  auto cfg = dgca::ApplyPreset("bert-base", dgca::ModelConfig());
  if (!cfg.ok()) return 1;
  dgca::v1::Topology h200;
  h200.set_node("h200");
  h200.add_gpus()->set_name("NVIDIA H200");
  const dgca::ComputePrior prior = dgca::PriorStepTime(
      {h200}, /*cuda=*/true, dgca::Precision::kBf16, *cfg, 128, 1, 1, dgca::PlannerMeasurements{});
  if (!prior.ok) {
    std::fprintf(stderr, "%s\n", prior.why.c_str());
    return 1;
  }
  const double predicted_ms = 1e3 * (prior.fixed + 128 * prior.per_sample);
  std::printf("| bench/gpu/RESULTS.md row (bert-base, seq 128, bf16, micro-batch 128, H200) | "
              "measured step ms | first-plan prior ms | error %% |\n|---|---|---|---|\n");
  double sum = 0;
  for (const Row& r : rows) {
    const double err = (predicted_ms - r.measured_ms) / r.measured_ms;
    sum += std::fabs(err);
    std::printf("| %s | %.2f | %.2f | %+.1f |\n", r.what, r.measured_ms, predicted_ms, 100 * err);
  }
  std::printf("\nMean absolute error %.1f%% over %d rows (%.1f%% without the run of record).\n",
              100 * sum / rows.size(), static_cast<int>(rows.size()),
              100 * (sum - std::fabs((predicted_ms - rows[0].measured_ms) / rows[0].measured_ms)) /
                  (rows.size() - 1));
  std::printf("Prior: %s\n", prior.why.c_str());
  return 0;
}
