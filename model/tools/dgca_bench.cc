// dgca-bench: training throughput and memory of the CUDA model
// (model/cuda/cuda_model.h) on one GPU — the dgca row of bench/gpu/run.sh's table,
// next to bench/gpu/torch_reference.py's PyTorch eager / torch.compile rows.
//
// Status: runs end to end on the CUDA emulator (ctest dgca_bench_emu: its
// timings mean nothing there) and on an H200 (docs/benchmarks.md).
//
// What a step is: ZeroGrads, then batch/micro-batch micro-steps of
// ForwardBackward (grad_scale 1/accumulation), then one AdamW Step (lr
// 1e-4, weight decay 0.01) — forward + backward + optimizer, as the PyTorch
// script times it. The model is randomly initialised (seed 1). The batches
// are synthetic with the layout of bench/torch_dgca.py's make_batch (the
// same sizes, not the same random numbers): every row [CLS] P prompts, n =
// (seq-2-2P)/2 source characters (ids in [670, 8000), 10% errors, 30% of
// the correct ones MFT-masked), P prompts, n [MASK] target slots, [SEP];
// K candidates per slot with the source id first and the target second.
//
// Timing: cudaEvents on the model stream around each step (the model's
// ForwardBackward synchronizes once per micro-step to read the loss; that
// is part of the step), --warmup untimed steps first, a full
// synchronization at the end. samples/s = batch / median step time.
//
// Memory: cudaMemGetInfo. peak_memory_bytes = device memory in use after
// the timed steps minus in use just after the CUDA context was created
// (the model allocates all its buffers once, so after the steps is its
// peak; cuBLASLt's workspace is in the context part). device_used_bytes
// is the total in use (context included). Not directly the same measure
// as PyTorch's max_memory_allocated (allocator bytes only), which is
// smaller than what the caching allocator holds. predicted_memory_bytes is
// what the planner's memory model (model/core/memory_model.h) expects for
// this run (less the GEMM workspace, which the context holds): the
// measured peak says how far off it is.
//
// MFU: TrainFlopsPerSample (model/core/compute_cost.h, the formula of
// bench/torch_dgca.py: about 75 GFLOP/sample for bert-base, seq 128) times
// samples/s, over the device's dense peak for --precision from the table
// in model/core/compute_cost.cc (H200 bf16: 989e12; --peak-tflops
// overrides), else "n/a".
//
// CUDA graphs (cuda_model.h set_cuda_graphs) are on unless
// --no-cuda-graphs: the encoder forward and backward of a batch size and
// trimmed length are captured on their second sight and replayed from the
// third (as in training, whose lengths fall in a few multiples of 8), the
// heads run eagerly; the JSON says how many passes replayed.
// bench/gpu/run.sh runs three rows: graphs, no graphs, --gemm-attention.
//
// Attention: the fused (flash-style) kernels for bf16/fp16 unless
// --gemm-attention (cuda_model.h set_fused_attention); the JSON's
// "attention" says which ran ("fused" or "gemm"; fp32 is always "gemm").
//
// --dropout P: hidden and attention dropout P during the timed training
// steps (model/core/dropout.h: the masks are hashed in the kernels, none
// stored; the timed steps reuse their batches, so the masks repeat, which
// costs the same); the JSON's "dropout" says which ran. bench/gpu/run.sh adds a
// 0.1 row (HF BERT's default) beside a PyTorch eager run with the same.
//
// Profile (--profile): after the timed steps, a few more steps run with
// cudaEvent marks (model/cuda/step_profiler.h): GPU time per phase of the
// step (encoder fwd, mlm head fwd, heads+loss, the loss read-back's host
// gap, each backward part, adamw) and the share spent in GEMMs, per step.
// Those steps are not part of the timing above, and run without CUDA graphs
// (the marks are host calls between kernels).
//
// Exit status: 0 ok, 1 a failure while running, 2 no usable GPU (the clean
// FAILED_PRECONDITION message), 3 bad command line. With --json the result
// (or {"error": ...}) is one JSON object on stdout.
//
// Usage: dgca-bench [--preset bert-base] [--batch 128] [--seq 128]
//          [--micro-batch N] [--steps 30] [--warmup 5] [--precision bf16|fp16|fp32]
//          [--device 0] [--peak-tflops X] [--profile] [--no-cuda-graphs]
//          [--gemm-attention] [--attention-only] [--dropout P] [--json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/core/exit_codes.h"
#include "model/core/batch.h"
#include "model/core/compute_cost.h"
#include "model/core/config.h"
#include "model/core/dropout.h"
#include "model/core/memory_model.h"
#include "model/cuda/attention_tune.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/gemm.h"
#include "model/cuda/step_profiler.h"
#include "model/nn/synthetic_batch.h"
#include "model/train/optimizer.h"

namespace {

using dgca::Batch;
using dgca::ModelConfig;

struct Args {
  std::string preset = "bert-base";
  int batch = 128, seq = 128, micro = 0, steps = 30, warmup = 5, device = 0;
  std::string precision = "bf16";
  double peak_tflops = 0;  // 0 = from the device name
  bool json = false;
  bool profile = false;
  bool graphs = true;
  bool fused_attention = true;
  bool attention_only = false;
  double dropout = 0;
};

int Usage(const std::string& msg) {
  std::fprintf(stderr,
               "dgca-bench: %s\nusage: dgca-bench [--preset tiny|small|bert-base] [--batch N] "
               "[--seq N] [--micro-batch N] [--steps N] [--warmup N] [--precision bf16|fp16|fp32] "
               "[--device N] [--peak-tflops X] [--profile] [--no-cuda-graphs] [--gemm-attention] "
               "[--attention-only] [--dropout P] [--json]\n",
               msg.c_str());
  return dgca::kExitUsage;
}

bool ParseInt(const char* s, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 0 || v > (1 << 30)) return false;
  *out = static_cast<int>(v);
  return true;
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o;
}

int Fail(const Args& a, int code, const std::string& msg) {
  std::fprintf(stderr, "dgca-bench: %s\n", msg.c_str());
  if (a.json) std::printf("{\"impl\": \"dgca\", \"error\": \"%s\"}\n", JsonEscape(msg).c_str());
  return code;
}

// --attention-only: the attention kernels alone at the run's shape (micro-
// batch, seq, the preset's hidden and heads; the last eighth of every row is
// padding), the fused ones (flash_attention.h) against the GEMM version
// (attention.h), forward and backward each timed with cudaEvents (median of
// --steps after --warmup). FLOPs as FlashAttention counts them: forward
// 4 B heads L^2 d (QK^T and PV), backward 2.5x that; the fused kernels do
// more (the forward's second QK^T, the backward's S and dP in both kernels).
int AttentionBench(const Args& a, dgca::cuda::DType t, const ModelConfig& cfg, const dgca::cuda::CudaContext& ctx) {
  using namespace dgca::cuda;
  const int B = a.micro, L = a.seq, H = cfg.hidden, nh = cfg.heads;
  auto timing = TimeAttention(ctx, t, B, L, H, nh, a.warmup, a.steps, static_cast<float>(a.dropout));
  if (!timing.ok()) return Fail(a, 1, "attention bench: " + timing.status().ToString());
  struct Row {
    const char* kernel;
    double fwd_ms, bwd_ms;
    size_t bytes;  // what the forward keeps for the backward, plus scratch
  };
  const std::vector<Row> rows = {{"fused", timing->fused_fwd_ms, timing->fused_bwd_ms, timing->fused_bytes},
                                 {"gemm", timing->gemm_fwd_ms, timing->gemm_bwd_ms, timing->gemm_bytes}};
  const double fwd_flops = 4.0 * B * nh * double(L) * L * (H / nh), bwd_flops = 2.5 * fwd_flops;
  auto tflops = [](double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
  const char* auto_pick = PreferFused(*timing) ? "fused" : "gemm";  // what train.attention: auto would keep
  if (a.json) {
    std::printf("{\"impl\": \"dgca-attention\", \"precision\": \"%s\", \"batch\": %d, \"seq\": %d, "
                "\"hidden\": %d, \"heads\": %d, \"device\": \"%s\", \"auto_keeps\": \"%s\", \"rows\": [",
                DTypeName(t), B, L, H, nh, JsonEscape(ctx.description()).c_str(), auto_pick);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%s{\"kernel\": \"%s\", \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"fwd_tflops\": %.2f, "
                  "\"bwd_tflops\": %.2f, \"bytes\": %zu}",
                  i ? ", " : "", r.kernel, r.fwd_ms, r.bwd_ms, tflops(fwd_flops, r.fwd_ms),
                  tflops(bwd_flops, r.bwd_ms), r.bytes);
    }
    std::printf("]}\n");
  } else {
    std::printf("dgca-bench --attention-only: %s, %s, batch %d, seq %d, hidden %d, %d heads\n",
                ctx.description().c_str(), DTypeName(t), B, L, H, nh);
    std::printf("  %-8s %10s %10s %12s %12s %12s\n", "kernels", "fwd ms", "bwd ms", "fwd TFLOP/s", "bwd TFLOP/s",
                "MiB kept");
    for (const Row& r : rows)
      std::printf("  %-8s %10.3f %10.3f %12.1f %12.1f %12.1f\n", r.kernel, r.fwd_ms, r.bwd_ms,
                  tflops(fwd_flops, r.fwd_ms), tflops(bwd_flops, r.bwd_ms), r.bytes / 1048576.0);
    std::printf("  train.attention: auto keeps the %s kernels here (%s)\n", auto_pick,
                DescribeTiming(*timing).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    // The flags without a value.
    if (k == "--json") {
      a.json = true;
      continue;
    }
    if (k == "--profile") {
      a.profile = true;
      continue;
    }
    if (k == "--gemm-attention") {
      a.fused_attention = false;
      continue;
    }
    if (k == "--attention-only") {
      a.attention_only = true;
      continue;
    }
    if (k == "--no-cuda-graphs") {
      a.graphs = false;
      continue;
    }
    if (k == "-h" || k == "--help") {
      Usage("help");
      return 0;
    }
    if (i + 1 >= argc) return Usage("missing value after " + k);
    const char* v = argv[++i];
    int* target = k == "--batch" ? &a.batch : k == "--seq" ? &a.seq : k == "--micro-batch" ? &a.micro
                  : k == "--steps" ? &a.steps : k == "--warmup" ? &a.warmup
                  : k == "--device" ? &a.device : nullptr;
    if (target != nullptr) {
      if (!ParseInt(v, target)) return Usage(k + " takes a non-negative integer, got '" + v + "'");
    } else if (k == "--preset") {
      a.preset = v;
    } else if (k == "--precision") {
      a.precision = v;
    } else if (k == "--dropout") {
      char* end = nullptr;
      a.dropout = std::strtod(v, &end);
      if (end == v || *end != '\0' || !dgca::ValidDropout(a.dropout))
        return Usage(std::string("--dropout takes a probability in [0, 1), got '") + v + "'");
    } else if (k == "--peak-tflops") {
      char* end = nullptr;
      a.peak_tflops = std::strtod(v, &end);
      if (end == v || *end != '\0' || a.peak_tflops <= 0) return Usage("--peak-tflops takes a positive number");
    } else {
      return Usage("unknown argument '" + k + "'");
    }
  }
  if (a.micro == 0) a.micro = a.batch;
  if (a.batch < 1 || a.seq < 1 || a.steps < 1) return Usage("--batch, --seq and --steps must be >= 1");
  if (a.batch % a.micro != 0)
    return Usage("--batch " + std::to_string(a.batch) + " is not a multiple of --micro-batch " +
                 std::to_string(a.micro));
  auto prec = dgca::ParsePrecision(a.precision, "--precision");
  if (!prec.ok()) return Usage(prec.status().message());
  auto cfg = dgca::ApplyPreset(a.preset, ModelConfig());
  if (!cfg.ok()) return Usage(cfg.status().message());
  cfg->hidden_dropout = cfg->attention_dropout = static_cast<float>(a.dropout);
  if (a.seq > cfg->max_position)
    return Usage("--seq " + std::to_string(a.seq) + " exceeds max_position " +
                 std::to_string(cfg->max_position));

  auto ctx = dgca::cuda::CudaContext::Create(a.device);
  if (!ctx.ok()) return Fail(a, 2, ctx.status().ToString());
  if (a.attention_only) {
    if (*prec == dgca::cuda::Precision::kBf16) return AttentionBench(a, dgca::cuda::DType::kBF16, *cfg, **ctx);
    if (*prec == dgca::cuda::Precision::kFp16) return AttentionBench(a, dgca::cuda::DType::kF16, *cfg, **ctx);
    return Usage("--attention-only compares the bf16/fp16 kernels: --precision bf16 or fp16");
  }
  size_t free0 = 0, total = 0;
  if (cudaMemGetInfo(&free0, &total) != cudaSuccess) return Fail(a, 1, "cudaMemGetInfo failed");

  auto model = dgca::cuda::CudaDgcaModel::Create(*cfg, a.micro, a.seq, /*seed=*/1, *prec, ctx->get());
  if (!model.ok()) return Fail(a, 1, "creating the model: " + model.status().ToString());
  dgca::cuda::CudaDgcaModel& m = **model;
  m.set_cuda_graphs(a.graphs);
  if (auto s = m.set_fused_attention(a.fused_attention); !s.ok())
    return Fail(a, 1, "choosing the attention kernels: " + s.ToString());
  const char* attention = m.fused_attention() ? "fused" : "gemm";
  const int accum = a.batch / a.micro;
  std::vector<Batch> batches;
  for (int i = 0; i < accum; ++i) batches.push_back(dgca::BenchmarkBatch(*cfg, a.micro, a.seq, 1000u + i));
  dgca::AdamWOptions opt;
  opt.weight_decay = 0.01f;
  const float lr = 1e-4f;
  const cudaStream_t stream = (*ctx)->stream();

  double first_loss = 0, last_loss = 0;
  auto step = [&]() -> dgca::Status {
    DGCA_RETURN_IF_ERROR(m.ZeroGrads());
    double loss = 0;
    for (const Batch& b : batches) {
      DGCA_ASSIGN_OR_RETURN(dgca::LossBreakdown lb,
                            m.ForwardBackward(b, 1.0f / static_cast<float>(accum), dgca::GradReadyFn()));
      loss += lb.total / accum;
    }
    last_loss = loss;
    return m.Step(lr, opt);
  };
  for (int i = 0; i < a.warmup; ++i) {
    dgca::Status s = step();
    if (!s.ok()) return Fail(a, 1, "warmup step " + std::to_string(i) + ": " + s.ToString());
    if (i == 0) first_loss = last_loss;
  }
  std::vector<cudaEvent_t> ev(static_cast<size_t>(a.steps) + 1);
  for (cudaEvent_t& e : ev)
    if (cudaEventCreate(&e) != cudaSuccess) return Fail(a, 1, "cudaEventCreate failed");
  if (cudaEventRecord(ev[0], stream) != cudaSuccess) return Fail(a, 1, "cudaEventRecord failed");
  for (int i = 0; i < a.steps; ++i) {
    dgca::Status s = step();
    if (!s.ok()) return Fail(a, 1, "step " + std::to_string(i) + ": " + s.ToString());
    if (a.warmup == 0 && i == 0) first_loss = last_loss;
    if (cudaEventRecord(ev[i + 1], stream) != cudaSuccess) return Fail(a, 1, "cudaEventRecord failed");
  }
  dgca::Status sync = m.Synchronize();
  if (!sync.ok()) return Fail(a, 1, "synchronize: " + sync.ToString());
  std::vector<double> secs;
  for (int i = 0; i < a.steps; ++i) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, ev[i], ev[i + 1]) != cudaSuccess) return Fail(a, 1, "cudaEventElapsedTime failed");
    secs.push_back(ms / 1e3);
  }
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  size_t free1 = 0;
  if (cudaMemGetInfo(&free1, &total) != cudaSuccess) return Fail(a, 1, "cudaMemGetInfo failed");

  dgca::cuda::StepProfile prof;
  const int prof_steps = std::min(a.steps, 5);
  if (a.profile) {
    auto profiler = dgca::cuda::StepProfiler::Create(stream);
    if (!profiler.ok()) return Fail(a, 1, "profiler: " + profiler.status().ToString());
    m.set_profiler(profiler->get());
    for (int i = 0; i < prof_steps; ++i) {
      dgca::Status s = step();
      if (s.ok()) s = (*profiler)->Mark(nullptr);
      if (!s.ok()) return Fail(a, 1, "profiled step " + std::to_string(i) + ": " + s.ToString());
    }
    dgca::Status s = m.Synchronize();
    if (!s.ok()) return Fail(a, 1, "synchronize: " + s.ToString());
    m.set_profiler(nullptr);
    auto collected = (*profiler)->Collect();
    if (!collected.ok()) return Fail(a, 1, "profile: " + collected.status().ToString());
    prof = *collected;
  }

  std::vector<double> sorted = secs;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                       : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  double mean = 0;
  for (double s : secs) mean += s / secs.size();
  const double sps = a.batch / med;
  const double fps = TrainFlopsPerSample(*cfg, a.seq);
  const double tflops = sps * fps / 1e12;
  const auto row = dgca::LookupGpuPeak((*ctx)->description());
  const double peak = a.peak_tflops > 0 ? a.peak_tflops * 1e12 : row ? row->For(*prec) : 0;
  const double model_bytes = static_cast<double>(free0) - static_cast<double>(free1);
  const double used_bytes = static_cast<double>(total) - static_cast<double>(free1);
  const int64_t nparams = m.params().parameter_count();
  // The model's part: the GEMM workspace came with the context, before free0.
  const double predicted_bytes =
      dgca::EstimateMemory(*cfg, a.seq, *prec, m.fused_attention()).total(a.micro) -
      dgca::kGemmWorkspaceBytes;

  if (a.json) {
    std::printf("{\"impl\": \"dgca\", \"precision\": \"%s\", \"preset\": \"%s\", \"seq\": %d, \"batch\": %d, "
                "\"micro_batch\": %d, \"steps\": %d, \"warmup\": %d, \"device\": \"%s\", \"params\": %lld, "
                "\"samples_per_second\": %.3f, \"step_seconds_median\": %.6f, \"step_seconds_mean\": %.6f, "
                "\"step_seconds\": [",
                dgca::PrecisionName(*prec), JsonEscape(a.preset).c_str(), a.seq, a.batch, a.micro, a.steps,
                a.warmup, JsonEscape((*ctx)->description()).c_str(), static_cast<long long>(nparams), sps, med,
                mean);
    for (size_t i = 0; i < secs.size(); ++i) std::printf("%s%.6f", i ? ", " : "", secs[i]);
    std::printf("], \"peak_memory_bytes\": %.0f, \"predicted_memory_bytes\": %.0f, \"device_used_bytes\": %.0f, "
                "\"flops_per_sample\": %.6e, \"achieved_tflops\": %.3f, ",
                model_bytes, predicted_bytes, used_bytes, fps, tflops);
    if (peak > 0) {
      std::printf("\"peak_tflops\": %.1f, \"mfu\": %.4f, ", peak / 1e12, tflops * 1e12 / peak);
    } else {
      std::printf("\"peak_tflops\": null, \"mfu\": null, ");
    }
    const dgca::cuda::GraphCache::Stats gs = m.cuda_graph_stats();
    std::printf("\"gemm_underaligned_plans\": %zu, \"gemm_underaligned\": [", m.gemm_underaligned_plans());
    const std::vector<std::string> notes = m.gemm_underaligned_notes();
    for (size_t i = 0; i < notes.size(); ++i) std::printf("%s\"%s\"", i ? ", " : "", JsonEscape(notes[i]).c_str());
    std::printf("], ");
    std::printf("\"gemm_fallback_plans\": %zu, \"loss_first\": %.6f, \"loss_last\": %.6f, \"cuda_graphs\": %s, "
                "\"graph_replays\": %lld, \"graph_captures\": %lld, \"graph_failures\": %lld, \"attention\": \"%s\", "
                "\"dropout\": %.3g",
                m.gemm_fallback_plans(), first_loss, last_loss, a.graphs ? "true" : "false",
                static_cast<long long>(gs.replayed), static_cast<long long>(gs.captured),
                static_cast<long long>(gs.capture_failures), attention, a.dropout);
    if (a.profile) {
      std::printf(", \"profile\": {\"steps\": %d, \"step_ms\": %.4f, \"gemm_ms\": %.4f, \"gemms_per_step\": %d, "
                  "\"phase_ms\": {",
                  prof_steps, prof.total_seconds * 1e3 / prof_steps, prof.gemm_seconds * 1e3 / prof_steps,
                  prof.gemms / prof_steps);
      for (size_t i = 0; i < prof.phase_seconds.size(); ++i)
        std::printf("%s\"%s\": %.4f", i ? ", " : "", JsonEscape(prof.phase_seconds[i].first).c_str(),
                    prof.phase_seconds[i].second * 1e3 / prof_steps);
      std::printf("}}");
    }
    std::printf("}\n");
  } else {
    std::printf("dgca-bench: %s, preset %s (%lld params), seq %d, batch %d (micro %d), %s\n",
                (*ctx)->description().c_str(), a.preset.c_str(), static_cast<long long>(nparams), a.seq, a.batch,
                a.micro, dgca::PrecisionName(*prec));
    std::printf("  samples/s        %.1f\n", sps);
    std::printf("  step ms          median %.2f, mean %.2f (%d steps after %d warmup)\n", med * 1e3, mean * 1e3,
                a.steps, a.warmup);
    std::printf("  memory           %.2f GiB for the model (%.2f GiB in use on the device)\n", model_bytes / (1 << 30),
                used_bytes / (1 << 30));
    std::printf("  memory model     %.2f GiB predicted for this run (model/core/memory_model.h)\n",
                predicted_bytes / (1 << 30));
    std::printf("  flops/sample     %.1f GFLOP; achieved %.1f TFLOP/s\n", fps / 1e9, tflops);
    if (peak > 0) {
      std::printf("  MFU              %.3f (peak %.0f TFLOP/s)\n", tflops * 1e12 / peak, peak / 1e12);
    } else {
      std::printf("  MFU              n/a (unknown device peak; --peak-tflops)\n");
    }
    std::printf("  attention        %s kernels\n", attention);
    std::printf("  loss             first %.4f, last %.4f\n", first_loss, last_loss);
    std::printf("  GEMM fallbacks   %zu shapes without a cuBLASLt algorithm (slow path)\n",
                m.gemm_fallback_plans());
    std::printf("  GEMM alignment   %zu shapes with an operand under 16 bytes aligned%s\n", m.gemm_underaligned_plans(),
                m.gemm_underaligned_plans() > 0 ? " (slower cuBLASLt kernels):" : "");
    for (const std::string& n : m.gemm_underaligned_notes()) std::printf("                   %s\n", n.c_str());
    const dgca::cuda::GraphCache::Stats gs = m.cuda_graph_stats();
    std::printf("  CUDA graphs      %s: %lld passes replayed, %lld captured, %lld failed captures\n",
                a.graphs ? "on" : "off", static_cast<long long>(gs.replayed), static_cast<long long>(gs.captured),
                static_cast<long long>(gs.capture_failures));
    if (a.profile) {
      const double total = prof.total_seconds / prof_steps;
      std::printf("  profile (%d steps, GPU time per step)\n", prof_steps);
      std::printf("    %-20s %9s %7s\n", "phase", "ms", "share");
      for (const auto& [name, sec] : prof.phase_seconds)
        std::printf("    %-20s %9.3f %6.1f%%\n", name.c_str(), sec * 1e3 / prof_steps,
                    total > 0 ? 100.0 * sec / prof_steps / total : 0.0);
      std::printf("    %-20s %9.3f %6.1f%%  (%d GEMMs per step)\n", "of which GEMMs", prof.gemm_seconds * 1e3 / prof_steps,
                  total > 0 ? 100.0 * prof.gemm_seconds / prof_steps / total : 0.0, prof.gemms / prof_steps);
    }
  }
  return 0;
}
