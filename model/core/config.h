// Model and training configuration for libdgca_model: plain structs, no YAML.
// The job spec (spec) and the plan (planner) are
// turned into a TrainConfig by worker/rank/train_config.h.
#ifndef DGCA_MODEL_CORE_CONFIG_H_
#define DGCA_MODEL_CORE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "model/core/status.h"

namespace dgca {

enum class PromptEncoderKind { kLstm, kMlp, kNone };
enum class FusionKind { kGated, kNone };
// Training arithmetic: fp32 everywhere, or (CUDA) 16-bit activations and
// weight copies with fp32 accumulation and fp32 master weights
// (model/cuda/cuda_model.h). The CPU backend runs fp32 only.
enum class Precision { kFp32, kFp16, kBf16 };
// "fp32", "fp16", "bf16"; and back, also taking "float32"/"float",
// "float16"/"half" and "bfloat16" (INVALID_ARGUMENT naming the valid values
// for anything else; `what` names the flag or field).
const char* PrecisionName(Precision p);
StatusOr<Precision> ParsePrecision(const std::string& s, const std::string& what);
enum class MftMode { kNoError, kNone };
enum class LrSchedule { kConstant, kLinear };

struct ModelConfig {
  int vocab_size = 21128;
  int hidden = 768;
  int layers = 12;
  int heads = 12;
  int ffn = 3072;
  int max_position = 512;   // BERT position embeddings
  int type_vocab = 2;       // BERT token types
  float layer_norm_eps = 1e-12f;
  int prompt_length = 3;    // P; the input has 2P prompt slots
  PromptEncoderKind prompt_encoder = PromptEncoderKind::kLstm;
  bool detector = true;
  bool candidate = true;
  int candidate_top_k = 8;  // K, {x_i} included
  FusionKind fusion = FusionKind::kGated;
  float lambda_detector = 1.0f;
  float lambda_candidate = 1.0f;
  // Dropout during training (ForwardBackward only; Forward and Predict
  // never drop), with the meaning of HF BertConfig's fields of the same
  // purpose: hidden_dropout after the embedding LayerNorm and after each
  // layer's attention output and FFN output projections (before their
  // residual add), attention_dropout on the attention probabilities. Both
  // in [0, 1). HF's defaults are 0.1; 0 here keeps the library's exact
  // comparisons (golden files, CPU vs CUDA checks) free of masks.
  // Masks come from model/core/dropout.h: a hash of the sample's key
  // (Batch::dropout_keys) and the element's place, the same on every
  // backend and independent of batch composition.
  float hidden_dropout = 0.0f;
  float attention_dropout = 0.0f;
};

// "tiny" (2 layers, H=128), "small" (4 layers, H=256), "bert-base" (12, 768).
// Keeps vocab_size and the head/prompt settings of `base`.
StatusOr<ModelConfig> ApplyPreset(const std::string& preset, ModelConfig base);

// Parameter count of the whole DGCA-ReLM model for `cfg` (all heads included).
// Equals the sum of ListParameters(cfg) numels (the lists of model/core/param_list.h).
int64_t CountParameters(const ModelConfig& cfg);

// Whether a 16-bit CUDA run of this shape takes the fused attention
// kernels (model/cuda/flash_attention.h: head size hidden / heads of 16, 32
// or 64, seq_len 1..512), which keep a [heads, L] fp32 log-sum-exp per layer
// and sample instead of [heads, L, L] probabilities. The kernels' own
// FusedAttentionSupported and the memory model both ask this.
bool FusedAttentionShape(int seq_len, int hidden, int heads);

// Every trainable tensor of the model, in forward order, with its name and
// shape (HF BertForMaskedLM names for BERT; the decoder weight is tied to the
// word embeddings and not listed). The model's ParamStore::parameter_count must
// equal CountParameters(cfg) (model_test checks it for every prompt / heads /
// fusion combination).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};
std::vector<ParamSpec> ListParameters(const ModelConfig& cfg);

// "tiny, small, bert-base".
const char* ValidPresetNames();

// The attention of GPU bf16/fp16 runs: the fused flash-style kernels
// (model/cuda/flash_attention.h; the shapes FusedAttentionShape takes) or
// the GEMM + softmax version (model/cuda/attention.h).
enum class AttentionKernels {
  // Time both at the run's shape when the device is built (one layer's
  // forward + backward, model/cuda/attention_tune.h) and keep the faster:
  // the fused unless the GEMM version is 5% faster. Deterministic runs keep
  // the fused without timing (a timing must not change a run's numbers).
  kAuto,
  kFused,  // the fused kernels where the shape allows, the GEMM version elsewhere
  kGemm,
};
// "auto" | "fused" | "gemm", and back (INVALID_ARGUMENT naming the valid
// values for anything else; `what` names the flag or field).
const char* AttentionKernelsName(AttentionKernels a);
StatusOr<AttentionKernels> ParseAttentionKernels(const std::string& s, const std::string& what);

struct TrainConfig {
  ModelConfig model;

  // Data. Empty vocab_path: build the vocabulary from the training data.
  std::string train_path;
  std::string eval_path;
  std::string vocab_path;
  std::string confusion_path;  // "" = built-in Unihan homophones
  std::string init_from;       // HF BERT safetensors; "" = random init
  int max_seq_len = 128;
  MftMode mft_mode = MftMode::kNoError;
  float mft_rate = 0.3f;
  int loader_threads = 1;
  int prefetch = 2;
  int64_t max_eval_samples = 0;  // 0 = the whole eval set

  // Optimisation. global batch = micro_batch * accumulation * world_size.
  int64_t steps = 100;
  int micro_batch = 8;
  int accumulation = 1;
  Precision precision = Precision::kFp32;
  // fp16: the first dynamic loss scale (then GradScaler's rules,
  // model/train/loss_scaler.h).
  double fp16_init_loss_scale = 65536.0;
  float lr = 5e-5f;
  float weight_decay = 0.0f;
  int64_t warmup_steps = 0;
  float clip_norm = 0.0f;      // 0 = off
  LrSchedule schedule = LrSchedule::kLinear;
  int64_t eval_every = 0;      // 0 = only at the end
  int64_t checkpoint_every = 0;// 0 = never
  uint64_t seed = 42;
  int threads = 1;             // CPU compute threads of this rank
  // GPU: every gradient reduction in a fixed order (bit-reproducible runs,
  // slower embedding backward). The CPU trainer is always deterministic.
  bool deterministic = false;
  // GPU: replay the encoder forward and backward of repeated batch sizes and
  // lengths from CUDA graphs (only without data-parallel overlap callbacks).
  bool cuda_graphs = true;
  // GPU, bf16/fp16: which attention kernels (AttentionKernels above).
  AttentionKernels attention = AttentionKernels::kAuto;

  // Data parallel.
  double bucket_mb = 25.0;
  bool overlap = true;
  double comm_timeout_s = 60.0;

  // Checkpoints: written under checkpoint_dir (step-NNNNNN/), resumed from
  // resume_from when it is not empty.
  std::string checkpoint_dir;
  std::string resume_from;
  // Retention (model/train/checkpoint_retention.h): after each checkpoint
  // rank 0 keeps the newest keep_checkpoints step directories plus the best
  // by eval, and deletes the rest. 0 = keep all (the default here, so the
  // flag-driven tools and tests keep every step directory they write; job
  // specs default to 3, spec/spec.h kDefaultKeepCheckpoints).
  int keep_checkpoints = 0;
};

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_CONFIG_H_
