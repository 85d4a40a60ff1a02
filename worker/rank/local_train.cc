#include "worker/rank/local_train.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "model/core/exit_codes.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/planner.h"
#include "spec/spec.h"
#include "model/comm/communicator.h"
#include "model/core/json.h"
#include "model/train/trainer.h"
#include "worker/rank/train_config.h"
#include "worker/rank/trial_runner.h"
#include "topology/probe.h"

namespace dgca {
namespace {

using Clock = std::chrono::steady_clock;

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.10g", v);
}

std::string DirName(const std::string& path) {
  size_t p = path.rfind('/');
  if (p == std::string::npos) return ".";
  if (p == 0) return "/";
  return path.substr(0, p);
}

// The trainer reports its progress through OnLog (step lines with the loss
// by head, eval summaries, data and vocabulary facts); they go to stderr.
class StderrObserver : public TrainObserver {
 public:
  void OnLog(const std::string& line) override {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }
  void OnCheckpoint(const std::string& dir, int64_t step) override {
    std::fprintf(stderr, "checkpoint at step %lld: %s\n", static_cast<long long>(step), dir.c_str());
  }
};

}  // namespace

std::string TrainResultJson(double final_loss, long long steps, double samples_per_second,
                            double seconds, const std::map<std::string, double>& eval) {
  std::string out = "{\"final_loss\": " + JsonNumber(final_loss) +
                    ", \"steps\": " + std::to_string(steps) +
                    ", \"samples_per_second\": " + JsonNumber(samples_per_second) +
                    ", \"seconds\": " + JsonNumber(seconds) + ", \"eval\": {";
  bool first = true;
  for (const auto& [k, v] : eval) {
    if (!first) out += ", ";
    first = false;
    AppendJsonString(k, &out);
    out += ": " + JsonNumber(v);
  }
  out += "}}\n";
  return out;
}

int RunLocalTrain(const LocalTrainArgs& args) {
  std::ifstream in(args.spec_path);
  if (!in) {
    std::fprintf(stderr, "error: cannot read spec %s\n", args.spec_path.c_str());
    return kExitUsage;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto parsed = ParseJobSpec(ss.str(), args.spec_path);
  if (!parsed.ok()) {
    std::fprintf(stderr, "error: %s\n", parsed.status().ToString().c_str());
    return kExitUsage;
  }
  if (!parsed->ok()) {
    std::fputs(FormatProblems(parsed->problems).c_str(), stderr);
    std::fprintf(stderr, "%s: %zu problem(s); nothing was run\n", args.spec_path.c_str(),
                 parsed->problems.size());
    return kExitUsage;
  }
  v1::JobSpec spec = parsed->spec;
  spec.set_base_dir(DirName(args.spec_path));
  if (args.steps > 0) spec.mutable_train()->set_steps(args.steps);
  // One process: a world of one, whatever the spec asks for.
  if (spec.resources().ranks() > 1) {
    std::fprintf(stderr, "note: resources.ranks %d ignored: `dgca-worker train` runs one rank\n",
                 spec.resources().ranks());
  }
  spec.mutable_resources()->set_ranks(1);

  v1::Plan plan;
  ProbeOptions po;
  po.root = args.topology_root;
  auto topo = ProbeTopology(po);
  // tuning.mode trial: the planner times its best candidates here, in this
  // process (worker/rank/trial_runner.h).
  LocalTrialOptions trial_opts;
  trial_opts.log = [](const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  };
  LocalTrialRunner trials(spec, trial_opts);
  absl::StatusOr<v1::Plan> planned =
      topo.ok() ? MakePlan(spec, {*topo}, PlannerMeasurements(),
                           spec.tuning().mode() == "trial" ? &trials : nullptr)
                : absl::StatusOr<v1::Plan>(topo.status());
  if (planned.ok()) {
    plan = *planned;
  } else {
    std::fprintf(stderr, "note: planner unavailable (%s); using the spec's values and simple "
                 "defaults\n", planned.status().ToString().c_str());
    plan = SimplePlan(spec, 1);
  }
  plan.set_ranks(1);
  for (const auto& d : plan.decisions()) {
    std::fprintf(stderr, "plan: %s = %s (%s)\n", d.name().c_str(), d.value().c_str(),
                 d.reason().c_str());
  }
  auto cfg = TrainConfigFromSpec(spec, plan);
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s: %s\n", args.spec_path.c_str(),
                 std::string(cfg.status().message()).c_str());
    return kExitUsage;
  }
  if (!args.checkpoint_dir.empty()) cfg->checkpoint_dir = args.checkpoint_dir;
  if (cfg->checkpoint_dir.empty()) cfg->checkpoint_every = 0;
  std::fprintf(stderr, "training %s: %d layers H=%d, dropout %g/%g (hidden/attention), "
               "micro_batch %d x accumulation %d, %lld steps, %d threads\n",
               spec.name().c_str(), cfg->model.layers, cfg->model.hidden,
               cfg->model.hidden_dropout, cfg->model.attention_dropout,
               cfg->micro_batch, cfg->accumulation, static_cast<long long>(cfg->steps),
               cfg->threads);
  auto comm = MakeLocalCommunicator();
  StderrObserver obs;
  auto t0 = Clock::now();
  auto result = Train(*cfg, comm.get(), &obs);
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!result.ok()) {
    std::fprintf(stderr, "error: training failed: %s\n", result.status().ToString().c_str());
    return kExitFailed;
  }
  if (args.json) {
    std::fputs(TrainResultJson(result->final_loss, result->steps, result->samples_per_second,
                               seconds, result->eval)
                   .c_str(),
               stdout);
  } else {
    for (const auto& [k, v] : result->eval) std::printf("%-36s %.4f\n", k.c_str(), v);
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace dgca
