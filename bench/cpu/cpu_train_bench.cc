// dgca-bench-cpu: CPU training throughput of DGCA-ReLM (dgca's own trainer
// code path: DgcaModel::ForwardBackward + AdamW), the peer of
// bench/cpu/torch_cpu_bench.py. Prints one JSON line on stdout.
//
// The batch is synthetic with exactly the layout and sizes of
// bench/torch_dgca.py make_batch() (model/core/batch.h layout):
//   every row has n = (L - 2 - 2P) / 2 characters (60 at L = 128, P = 3), so
//   every row is full length (no padding); ids uniform in [670, 8000);
//   10% of positions are errors (target redrawn); 30% of correct source
//   positions are MFT-masked; K = 8 candidates per slot, candidate 0 = x_i,
//   candidate 1 = y_i, the rest uniform. The random values differ from
//   PyTorch's (different generators); the counts match in expectation, and
//   the cost of a step does not depend on the ids.
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
#include <random>
#include <string>
#include <vector>

#include "model/core/batch.h"
#include "model/core/config.h"
#include "model/nn/model.h"
#include "model/train/optimizer.h"

namespace {

constexpr int kPad = 0, kCls = 101, kSep = 102, kMask = 103;

dgca::Batch MakeBatch(int B, int L, int P, int K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id(670, 7999);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int n = (L - 2 - 2 * P) / 2;
  dgca::Batch b;
  b.batch_size = B;
  b.seq_len = L;
  b.top_k = K;
  const size_t BL = static_cast<size_t>(B) * L;
  b.input_ids.assign(BL, kPad);
  b.attention_mask.assign(BL, 0);
  b.token_type_ids.assign(BL, 0);
  b.prompt_slot.assign(BL, -1);
  b.labels.assign(BL, -100);
  b.mft_labels.assign(BL, -100);
  for (int r = 0; r < B; ++r) {
    int32_t* ids = &b.input_ids[static_cast<size_t>(r) * L];
    int32_t* slot = &b.prompt_slot[static_cast<size_t>(r) * L];
    int32_t* lab = &b.labels[static_cast<size_t>(r) * L];
    int32_t* mlab = &b.mft_labels[static_cast<size_t>(r) * L];
    ids[0] = kCls;
    for (int p = 0; p < P; ++p) {
      ids[1 + p] = kCls;
      slot[1 + p] = p;
      ids[1 + P + n + p] = kSep;
      slot[1 + P + n + p] = P + p;
    }
    for (int i = 0; i < n; ++i) {
      const int src = id(rng);
      const bool err = u(rng) < 0.1;
      const int trg = err ? id(rng) : src;
      const bool mft = !err && u(rng) < 0.3;
      ids[1 + P + i] = mft ? kMask : src;
      if (mft) mlab[1 + P + i] = src;
      const int pos = 1 + 2 * P + n + i;
      ids[pos] = kMask;
      lab[pos] = trg;
      b.slot_index.push_back(r * L + pos);
      b.slot_source_id.push_back(src);
      b.slot_target_id.push_back(trg);
      b.candidates.push_back(src);
      b.candidates.push_back(trg);
      for (int k = 2; k < K; ++k) b.candidates.push_back(id(rng));
    }
    ids[1 + 2 * P + 2 * n] = kSep;
    for (int j = 0; j < 2 + 2 * P + 2 * n; ++j) b.attention_mask[static_cast<size_t>(r) * L + j] = 1;
    b.row_length.push_back(n);
    b.sample_index.push_back(r);
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "small";
  int batch = 16, seq = 128, threads = 2, steps = 10, warmup = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--preset") preset = v;
    else if (k == "--batch") batch = std::atoi(v);
    else if (k == "--seq") seq = std::atoi(v);
    else if (k == "--threads") threads = std::atoi(v);
    else if (k == "--steps") steps = std::atoi(v);
    else if (k == "--warmup") warmup = std::atoi(v);
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
  auto model = dgca::DgcaModel::Create(*cfg, batch, seq, 42, threads);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  dgca::ParamStore& ps = (*model)->params();
  dgca::AdamW adam(&ps, dgca::AdamWOptions{});
  const dgca::Batch b = MakeBatch(batch, seq, cfg->prompt_length, cfg->candidate_top_k, 0);
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
      "{\"impl\": \"dgca\", \"preset\": \"%s\", \"batch\": %d, \"seq\": %d, \"threads\": %d, "
      "\"step_seconds\": %.6f, \"samples_per_second\": %.3f, \"params\": %lld, "
      "\"count_parameters\": %lld, \"min_step_seconds\": %.6f, \"max_step_seconds\": %.6f}\n",
      preset.c_str(), batch, seq, threads, step, step > 0 ? batch / step : 0.0,
      static_cast<long long>(ps.total_numel()),
      static_cast<long long>(dgca::CountParameters(*cfg)), times.empty() ? 0 : times.front(),
      times.empty() ? 0 : times.back());
  return 0;
}
