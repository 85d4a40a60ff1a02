// dgca-train: the trainer (model/train/trainer.h) on one device, from flags,
// without the control plane — what `python train.py` is to a PyTorch user,
// and the program the GPU loss-curve comparison (bench/gpu/curve.sh) runs on the GPU machine
// (which has none of the control plane's packages: this builds with
// -DDGCA_MODEL_ONLY=ON).
//
// It runs the real Train(): data loader, micro-steps, clipping, AdamW,
// schedule, checkpoints and eval as a rank would (world of one). Extras for
// comparisons with a peer implementation:
//   --dump-batches FILE  every training micro-batch in order
//                        (model/core/batch_io.h), so the peer trains on the
//                        same data in the same order;
//   --init-from FILE     initial weights (safetensors with our parameter
//                        names, e.g. written by bench/gpu/loss_curve.py);
//   --json FILE          per-step losses, lr, grad norm, samples/s.
//
// Usage: dgca-train --train FILE [--eval FILE] [--vocab FILE]
//   [--confusion JSON] [--preset tiny|small|bert-base] [--seq 128]
//   [--micro-batch 32] [--accumulation 1] [--steps 300] [--lr 5e-5]
//   [--warmup 0] [--schedule constant|linear] [--weight-decay 0] [--clip 0]
//   [--seed 42] [--threads 1] [--device cpu|cuda] [--gpu 0]
//   [--precision fp32|bf16|fp16] [--loss-scale X] [--init-from FILE]
//   [--dump-batches FILE]
//   [--json FILE] [--checkpoint-dir DIR [--checkpoint-every N]]
//   [--max-eval-samples N]
//   [--deterministic]   (GPU: bit-reproducible gradient reductions, slower)
//   [--no-cuda-graphs]  (GPU: no graph replay of the encoder)
//   [--attention auto|fused|gemm]  (GPU bf16/fp16: auto times both
//                        attention versions at the run's shape when the
//                        device is built and keeps the faster; default auto)
//   [--gemm-attention]  (= --attention gemm)
//   [--hidden-dropout P] [--attention-dropout P]  (in [0, 1); HF's
//                        hidden_dropout_prob and attention_probs_dropout_prob.
//                        Default 0 here, so comparisons with PyTorch runs
//                        without dropout stay exact; job specs default to 0.1)
// Exit status: 0 done, 1 training failed (the error on stderr), 2 bad flags
// or a device this build does not have.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "model/core/exit_codes.h"
#include "model/core/batch_io.h"
#include "model/core/config.h"
#include "model/core/dropout.h"
#include "model/core/json.h"
#include "model/train/trainer.h"
#ifdef DGCA_HAVE_CUDA_TRAINER
#include "model/cuda/cuda_context.h"
#include "model/cuda/cuda_train_device.h"
#endif

namespace {

using namespace dgca;  // NOLINT: a small program

int Usage(const std::string& msg) {
  std::fprintf(stderr,
               "dgca-train: %s\n"
               "usage: dgca-train --train FILE [--eval FILE] [--vocab FILE] [--confusion JSON]\n"
               "  [--preset tiny|small|bert-base] [--seq N] [--micro-batch N] [--accumulation N]\n"
               "  [--steps N] [--lr X] [--warmup N] [--schedule constant|linear]\n"
               "  [--weight-decay X] [--clip X] [--seed N] [--threads N] [--device cpu|cuda]\n"
               "  [--gpu N] [--precision fp32|bf16|fp16] [--loss-scale X (fp16: the first loss scale)]\n"
               "  [--init-from FILE] [--dump-batches FILE]\n"
               "  [--json FILE] [--checkpoint-dir DIR [--checkpoint-every N]] [--max-eval-samples N]\n"
               "  [--deterministic] [--no-cuda-graphs] [--attention auto|fused|gemm] [--gemm-attention]\n"
               "  [--hidden-dropout P] [--attention-dropout P]\n"
               "Dropout probabilities are in [0, 1) and default to 0 here, so comparisons with\n"
               "PyTorch runs without dropout stay exact (job specs default to 0.1, as HF BERT).\n"
               "A --checkpoint-dir holding a checkpoint is resumed from (its 'latest' names the step\n"
               "directory; step directories without it are an error, not a fresh start); without\n"
               "--checkpoint-every the run writes one checkpoint there at the end.\n",
               msg.c_str());
  return dgca::kExitUsage;
}

// Logs to stderr, records batches and step reports.
class ToolObserver : public TrainObserver {
 public:
  explicit ToolObserver(BatchRecordWriter* dump) : dump_(dump) {}
  void OnLog(const std::string& line) override { std::fprintf(stderr, "%s\n", line.c_str()); }
  void OnBatch(const Batch& batch, int64_t step, int micro) override {
    if (dump_ == nullptr || !dump_error_.ok()) return;
    dump_error_ = dump_->Append(step, micro, batch);
  }
  void OnStep(const StepReport& r) override { steps_.push_back(r); }
  // A failed dump stops training (the file would be useless).
  bool StopRequested() override { return !dump_error_.ok(); }

  const std::vector<StepReport>& steps() const { return steps_; }
  const Status& dump_error() const { return dump_error_; }

 private:
  BatchRecordWriter* dump_;
  Status dump_error_;
  std::vector<StepReport> steps_;
};

// JSON has no inf/NaN: null (an fp16 step whose gradients overflowed has
// an infinite norm).
std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", x);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  TrainConfig cfg;
  cfg.steps = 300;
  cfg.micro_batch = 32;
  cfg.max_seq_len = 128;
  cfg.schedule = LrSchedule::kConstant;
  cfg.eval_every = 0;
  std::string preset = "tiny", device = "cpu", precision = "fp32", dump, json;
  int gpu = 0;
  float hidden_dropout = 0.0f, attention_dropout = 0.0f;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    // The flags without a value.
    if (f == "--deterministic") {
      cfg.deterministic = true;
      continue;
    }
    if (f == "--no-cuda-graphs") {
      cfg.cuda_graphs = false;
      continue;
    }
    if (f == "--gemm-attention") {
      cfg.attention = dgca::AttentionKernels::kGemm;
      continue;
    }
    if (f == "--help" || f == "-h") {
      Usage("train the DGCA-ReLM model on one device");
      return 0;
    }
    if (i + 1 >= argc) return Usage("missing value for " + f);
    const std::string v = argv[++i];
    char* end = nullptr;
    auto num = [&](double lo, double hi) -> double {
      const double x = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(x >= lo && x <= hi)) {
        std::fprintf(stderr, "dgca-train: %s %s: expected a number in [%g, %g]\n", f.c_str(),
                     v.c_str(), lo, hi);
        std::exit(2);  // NOLINT: a program's main, not library code
      }
      return x;
    };
    // A probability in [0, 1) (dropout: 1 would drop everything).
    auto prob = [&]() -> float {
      const double x = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !ValidDropout(x)) {
        std::fprintf(stderr, "dgca-train: %s %s: expected a number in [0, 1)\n", f.c_str(),
                     v.c_str());
        std::exit(2);  // NOLINT: a program's main, not library code
      }
      return static_cast<float>(x);
    };
    if (f == "--train") cfg.train_path = v;
    else if (f == "--eval") cfg.eval_path = v;
    else if (f == "--vocab") cfg.vocab_path = v;
    else if (f == "--confusion") cfg.confusion_path = v;
    else if (f == "--preset") preset = v;
    else if (f == "--seq") cfg.max_seq_len = static_cast<int>(num(8, 512));
    else if (f == "--micro-batch") cfg.micro_batch = static_cast<int>(num(1, 1 << 16));
    else if (f == "--accumulation") cfg.accumulation = static_cast<int>(num(1, 1 << 16));
    else if (f == "--steps") cfg.steps = static_cast<int64_t>(num(1, 1e9));
    else if (f == "--lr") cfg.lr = static_cast<float>(num(0, 10));
    else if (f == "--warmup") cfg.warmup_steps = static_cast<int64_t>(num(0, 1e9));
    else if (f == "--schedule") {
      if (v == "constant") cfg.schedule = LrSchedule::kConstant;
      else if (v == "linear") cfg.schedule = LrSchedule::kLinear;
      else return Usage("--schedule " + v + ": valid: constant, linear");
    } else if (f == "--weight-decay") cfg.weight_decay = static_cast<float>(num(0, 1));
    else if (f == "--clip") cfg.clip_norm = static_cast<float>(num(0, 1e9));
    else if (f == "--seed") cfg.seed = static_cast<uint64_t>(num(0, 1e18));
    else if (f == "--threads") cfg.threads = static_cast<int>(num(1, 256));
    else if (f == "--device") device = v;
    else if (f == "--attention") {
      auto a = dgca::ParseAttentionKernels(v, "--attention");
      if (!a.ok()) return Usage(a.status().message());
      cfg.attention = *a;
    }
    else if (f == "--hidden-dropout") hidden_dropout = prob();
    else if (f == "--attention-dropout") attention_dropout = prob();
    else if (f == "--gpu") gpu = static_cast<int>(num(0, 64));
    else if (f == "--precision") precision = v;
    else if (f == "--loss-scale") cfg.fp16_init_loss_scale = num(1e-30, 1e30);
    else if (f == "--init-from") cfg.init_from = v;
    else if (f == "--dump-batches") dump = v;
    else if (f == "--json") json = v;
    else if (f == "--checkpoint-dir") cfg.checkpoint_dir = v;
    else if (f == "--checkpoint-every") cfg.checkpoint_every = static_cast<int64_t>(num(1, 1e9));
    else if (f == "--max-eval-samples") cfg.max_eval_samples = static_cast<int64_t>(num(0, 1e12));
    else return Usage("unknown flag " + f);
  }
  if (cfg.train_path.empty()) return Usage("--train is required");
  // A checkpoint directory without a period: one checkpoint, at the end
  // (and a run given the same directory resumes from it).
  if (!cfg.checkpoint_dir.empty() && cfg.checkpoint_every == 0) cfg.checkpoint_every = cfg.steps;
  if (cfg.checkpoint_dir.empty() && cfg.checkpoint_every > 0) return Usage("--checkpoint-every needs --checkpoint-dir");
  auto model = ApplyPreset(preset, cfg.model);
  if (!model.ok()) return Usage(model.status().message());
  cfg.model = *model;
  cfg.model.hidden_dropout = hidden_dropout;
  cfg.model.attention_dropout = attention_dropout;
  auto parsed_precision = ParsePrecision(precision, "--precision");
  if (!parsed_precision.ok()) return Usage(parsed_precision.status().message());
  cfg.precision = *parsed_precision;

  TrainDeviceFactory factory = MakeCpuTrainDevice;
  if (device == "cuda") {
#ifdef DGCA_HAVE_CUDA_TRAINER
    auto ctx = cuda::CudaContext::Create(gpu);
    if (!ctx.ok()) {
      std::fprintf(stderr, "dgca-train: --device cuda: %s\n", ctx.status().ToString().c_str());
      return dgca::kExitUsage;
    }
    factory = cuda::CudaTrainDeviceFactory(std::shared_ptr<const cuda::CudaContext>(std::move(*ctx)));
#else
    (void)gpu;
    return Usage("--device cuda: this build has no CUDA trainer (configure with -DDGCA_WITH_CUDA=ON)");
#endif
  } else if (device != "cpu") {
    return Usage("--device " + device + ": valid: cpu, cuda");
  }

  std::unique_ptr<BatchRecordWriter> writer;
  if (!dump.empty()) {
    auto w = BatchRecordWriter::Open(dump);
    if (!w.ok()) {
      std::fprintf(stderr, "dgca-train: %s\n", w.status().ToString().c_str());
      return dgca::kExitFailed;
    }
    writer = std::move(*w);
  }
  ToolObserver obs(writer.get());
  StatusOr<TrainResult> result = Train(cfg, nullptr, &obs, factory);
  Status closed = writer ? writer->Close() : OkStatus();
  if (!obs.dump_error().ok()) {
    std::fprintf(stderr, "dgca-train: --dump-batches: %s\n", obs.dump_error().ToString().c_str());
    return dgca::kExitFailed;
  }
  if (!result.ok()) {
    std::fprintf(stderr, "dgca-train: %s\n", result.status().ToString().c_str());
    return dgca::kExitFailed;
  }
  if (!closed.ok()) {
    std::fprintf(stderr, "dgca-train: --dump-batches: %s\n", closed.ToString().c_str());
    return dgca::kExitFailed;
  }
  if (!json.empty()) {
    std::string out = "{\"impl\": \"dgca\", \"device\": ";
    AppendJsonString(device, &out);
    out += ", \"precision\": ";
    AppendJsonString(precision, &out);
    out += ", \"preset\": ";
    AppendJsonString(preset, &out);
    out += ", \"micro_batch\": " + std::to_string(cfg.micro_batch) +
           ", \"accumulation\": " + std::to_string(cfg.accumulation) +
           ", \"seq\": " + std::to_string(cfg.max_seq_len) + ", \"lr\": " + Num(cfg.lr) +
           ", \"hidden_dropout\": " + Num(cfg.model.hidden_dropout) +
           ", \"attention_dropout\": " + Num(cfg.model.attention_dropout) +
           ", \"final_loss\": " + Num(result->final_loss) +
           ", \"samples_per_second\": " + Num(result->samples_per_second) + ", \"steps\": [";
    for (size_t i = 0; i < obs.steps().size(); ++i) {
      const StepReport& r = obs.steps()[i];
      auto head = [&](const char* k) {
        auto it = r.loss_by_head.find(k);
        return Num(it == r.loss_by_head.end() ? 0.0 : it->second);
      };
      out += std::string(i ? ", " : "") + "{\"step\": " + std::to_string(r.step) +
             ", \"loss\": " + Num(r.loss) + ", \"fusion\": " + head("fusion") +
             ", \"mft\": " + head("mft") + ", \"detector\": " + head("detector") +
             ", \"candidate\": " + head("candidate") + ", \"lr\": " + Num(r.learning_rate) +
             ", \"grad_norm\": " + Num(r.grad_norm) + ", \"step_seconds\": " +
             Num(r.step_seconds) +
             (r.loss_scale > 0 ? ", \"loss_scale\": " + Num(r.loss_scale) + ", \"skipped\": " +
                                     (r.overflow_skipped ? "true" : "false")
                               : std::string()) +
             "}";
    }
    out += "], \"eval\": {";
    bool first = true;
    for (const auto& [k, v] : result->eval) {
      if (!first) out += ", ";
      first = false;
      AppendJsonString(k, &out);
      out += ": " + Num(v);
    }
    out += "}}\n";
    std::ofstream f(json);
    f << out;
    if (!f) {
      std::fprintf(stderr, "dgca-train: cannot write %s\n", json.c_str());
      return dgca::kExitFailed;
    }
  }
  return dgca::kExitOk;
}
