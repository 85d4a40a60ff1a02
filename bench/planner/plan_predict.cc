// dgca-bench-plan-predict: the planner's prediction for a spec on this node,
// from measurements given on the command line (what the coordinator cannot
// feed `dgca plan` yet: it stores only the all-reduce probe, no step time).
//
// Calls the real planner (MakePlan) with the real topology probe of this
// machine and PlannerMeasurements{step_seconds, step_micro_batch,
// allreduce_points}. Prints one JSON line.
//
// Usage: dgca-bench-plan-predict SPEC --step-seconds S --step-micro-batch M
//          --points BYTES:SECONDS,BYTES:SECONDS,...
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "planner/planner.h"
#include "spec/spec.h"
#include "topology/probe.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SPEC --step-seconds S --step-micro-batch M --points B:S,...\n",
                 argv[0]);
    return 2;
  }
  const std::string spec_path = argv[1];
  dgca::PlannerMeasurements meas;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--step-seconds") meas.step_seconds = std::atof(v.c_str());
    else if (k == "--step-micro-batch") meas.step_micro_batch = std::atoi(v.c_str());
    else if (k == "--points") {
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        const size_t c = item.find(':');
        if (c == std::string::npos) continue;
        meas.allreduce_points.emplace_back(std::atof(item.substr(0, c).c_str()),
                                           std::atof(item.substr(c + 1).c_str()));
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  meas.allreduce_source = "bench/planner/run.sh (dgca diagnose comm rows)";
  std::ifstream f(spec_path);
  std::stringstream text;
  text << f.rdbuf();
  auto parsed = dgca::ParseJobSpec(text.str(), spec_path);
  if (!parsed.ok() || !parsed->ok()) {
    std::fprintf(stderr, "%s: bad spec\n", spec_path.c_str());
    if (parsed.ok()) std::fprintf(stderr, "%s", dgca::FormatProblems(parsed->problems).c_str());
    return 2;
  }
  dgca::ProbeOptions po;
  po.use_nvml = false;
  auto topo = dgca::ProbeTopology(po);
  if (!topo.ok()) {
    std::fprintf(stderr, "probe: %s\n", std::string(topo.status().message()).c_str());
    return 1;
  }
  auto plan = dgca::MakePlan(parsed->spec, {*topo}, meas);
  if (!plan.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(plan.status().message()).c_str());
    return 1;
  }
  std::printf(
      "{\"predicted_step_seconds\": %.6f, \"predicted_comm_share\": %.4f, "
      "\"predicted_allreduce_seconds\": %.6f, \"predicted_samples_per_second\": %.3f, "
      "\"micro_batch\": %d, \"accumulation\": %d, \"bucket_mb\": %.3f}\n",
      plan->predicted_step_seconds(), plan->predicted_comm_share(),
      plan->predicted_allreduce_seconds(), plan->predicted_samples_per_second(),
      static_cast<int>(plan->micro_batch()), static_cast<int>(plan->accumulation()),
      static_cast<double>(plan->bucket_mb()));
  for (const auto& d : plan->decisions()) {
    if (d.name() == "comm.bucket_mb" || d.name() == "train.accumulation" || d.name() == "train.micro_batch")
      std::fprintf(stderr, "%s = %s: %s\n", d.name().c_str(), d.value().c_str(),
                   d.reason().c_str());
  }
  return 0;
}
