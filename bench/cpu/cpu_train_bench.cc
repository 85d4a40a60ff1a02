// dgca-bench-cpu: CPU training throughput of DGCA-ReLM (dgca's own trainer
// code path: DgcaModel::ForwardBackward + AdamW), the peer of
// bench/cpu/torch_cpu_bench.py. Prints one JSON line on stdout.
//
// The batch is synthetic with exactly the layout and sizes of
// bench/torch_dgca.py make_batch() (dgca::BenchmarkBatch,
// model/nn/synthetic_batch.h): every row full length (n = 60 characters at
// L = 128, P = 3), 10% errors, 30% MFT, K candidates per slot. The random
// values differ from PyTorch's; the counts match in expectation, and the
// cost of a step does not depend on the ids.
// Timed: zero grads + forward + backward + AdamW step (lr 5e-5, wd 0), as the
// PyTorch side. Warmup steps excluded; the median step is reported.
//
// Usage: dgca-bench-cpu [--preset small] [--batch 16] [--seq 128]
//                       [--threads 2] [--steps 10] [--warmup 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "model/core/batch.h"
#include "model/core/config.h"
#include "model/nn/model.h"
#include "model/nn/synthetic_batch.h"
#include "model/train/optimizer.h"

int main(int argc, char** argv) {
  std::string preset = "small";
  int batch = 16, seq = 128, threads = 2, steps = 10, warmup = 2;
  double dropout = 0;  // hidden and attention (model/core/dropout.h)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--preset") preset = v;
    else if (k == "--batch") batch = std::atoi(v);
    else if (k == "--seq") seq = std::atoi(v);
    else if (k == "--threads") threads = std::atoi(v);
    else if (k == "--steps") steps = std::atoi(v);
    else if (k == "--warmup") warmup = std::atoi(v);
    else if (k == "--dropout") dropout = std::atof(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  auto cfg = dgca::ApplyPreset(preset, dgca::ModelConfig{});
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().ToString().c_str());
    return 2;
  }
  cfg->hidden_dropout = cfg->attention_dropout = static_cast<float>(dropout);
  auto model = dgca::DgcaModel::Create(*cfg, batch, seq, 42, threads);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  dgca::ParamStore& ps = (*model)->params();
  dgca::AdamW adam(&ps, dgca::AdamWOptions{});
  const dgca::Batch b = dgca::BenchmarkBatch(*cfg, batch, seq, 0);
  std::vector<double> times;
  double loss = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ps.ZeroGrads();
    auto lb = (*model)->ForwardBackward(b, 1.0f, nullptr);
    if (!lb.ok()) {
      std::fprintf(stderr, "%s\n", lb.status().ToString().c_str());
      return 1;
    }
    adam.Step(5e-5f);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss = lb->total;
    std::fprintf(stderr, "dgca step %d/%d %.3fs loss %.4f\n", i + 1, warmup + steps, dt, loss);
    if (i >= warmup) times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  const double step = times.empty() ? 0 : times[times.size() / 2];
  std::printf(
      "{\"impl\": \"dgca\", \"preset\": \"%s\", \"batch\": %d, \"seq\": %d, \"threads\": %d, \"dropout\": %g, "
      "\"step_seconds\": %.6f, \"samples_per_second\": %.3f, \"params\": %lld, "
      "\"count_parameters\": %lld, \"min_step_seconds\": %.6f, \"max_step_seconds\": %.6f}\n",
      preset.c_str(), batch, seq, threads, dropout, step, step > 0 ? batch / step : 0.0,
      static_cast<long long>(ps.parameter_count()),
      static_cast<long long>(dgca::CountParameters(*cfg)), times.empty() ? 0 : times.front(),
      times.empty() ? 0 : times.back());
  return 0;
}
