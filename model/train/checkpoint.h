// Checkpoints: weights, AdamW state and the training position, written
// atomically; and loading a Hugging Face BertForMaskedLM checkpoint as the
// initial weights.
//
// Layout of DIR/step-NNNNNNNN/ (8-digit step):
//   model.safetensors      every ParamStore tensor under its own name (HF
//                          BertForMaskedLM names for the BERT part)
//   optimizer.safetensors  "m.<name>" and "v.<name>": AdamW moments
//   state.json             {"step", "loader_step", "seed", "rng_state",
//                           "adam_step", "config": {fingerprint}} and, for
//                           fp16 runs, "loss_scale", "loss_scale_tracker";
//                           for CUDA runs, "attention" (the kernels run);
//                           "files": {"model.safetensors": {"bytes": N,
//                           "crc32": "8 hex digits"}, "optimizer.safetensors":
//                           ...}, the data files as written (checkpoints
//                           from before it have none and load unverified)
//   eval.json              (optional, written after the rename: the eval at
//                           this step; model/train/checkpoint_retention.h)
// The directory is written under a temporary name and renamed, then
// DIR/latest (one line: "step-NNNNNNNN") is replaced atomically, so a crash
// leaves either the old or the new checkpoint, never a torn one. Older step
// directories are deleted by retention (model/train/checkpoint_retention.h).
//
// Thread-safety: free functions; callers serialise access to one DIR.
#ifndef DGCA_MODEL_TRAIN_CHECKPOINT_H_
#define DGCA_MODEL_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/core/status.h"
#include "model/nn/params.h"
#include "model/train/optimizer.h"

namespace dgca {

struct CheckpointState {
  int64_t step = 0;          // optimizer steps done
  int64_t loader_step = 0;   // LoaderPosition::step to resume the data stream at
  uint64_t seed = 0;
  uint64_t rng_state = 0;    // trainer RNG stream position (reserved; 0 today)
  double loss_scale = 0;     // fp16 dynamic loss scale (0: none)
  int64_t loss_scale_tracker = 0;  // its clean-step count (LossScaler)
  // The attention kernels the run ran (TrainDevice::attention_kernels():
  // "fused" or "gemm"; "" on the CPU). A resumed train.attention auto run
  // keeps them instead of timing afresh, so it continues the same arithmetic.
  std::string attention_kernels;
};

// The model sizes a checkpoint must agree with: vocab_size, hidden, layers,
// heads, ffn, max_position, type_vocab, prompt_length, prompt_encoder,
// detector, candidate, candidate_top_k, fusion.
std::map<std::string, int64_t> ConfigFingerprint(const ModelConfig& cfg);

// "step-00000042".
std::string CheckpointDirName(int64_t step);

// Writes DIR/step-NNNNNNNN/ and updates DIR/latest. `adam` may be null (no
// optimizer.safetensors). Returns the step directory.
StatusOr<std::string> SaveCheckpoint(const std::string& dir, const ParamStore& params,
                                     const AdamW* adam, const ModelConfig& cfg,
                                     const CheckpointState& state);

// DIR/<contents of DIR/latest>; NOT_FOUND when DIR/latest does not exist
// and DIR holds no step-NNNNNNNN directory (a fresh start);
// FAILED_PRECONDITION when DIR/latest is missing but step directories exist
// (naming them and how to go on: restore `latest` or use an empty
// directory); DATA_LOSS when it names no directory or is longer than 4096
// bytes (never read further: a symlink to /dev/zero is an error, not an
// endless read).
StatusOr<std::string> LatestCheckpoint(const std::string& dir);

// The state.json of a step directory alone (no weights read), validated as
// LoadCheckpoint validates it, less the config fingerprint: what a run must
// know before it builds its device.
StatusOr<CheckpointState> ReadCheckpointState(const std::string& step_dir);

// The model sizes a step directory's state.json records (its "config", the
// ConfigFingerprint fields; every other ModelConfig field keeps its default,
// dropout included): what a reader without the job's spec (dgca export)
// builds the model from. DATA_LOSS naming the file and the field when one
// is missing, not an integer or out of range (an enum value unknown here).
StatusOr<ModelConfig> ReadCheckpointConfig(const std::string& step_dir);

// Loads a step directory written by SaveCheckpoint into `params` (and `adam`
// when not null). Everything is validated before anything is copied: missing
// files, malformed safetensors (the reader's error, naming the file), unknown
// or missing tensor names, wrong shapes ("expected [..], got [..]"), a config
// fingerprint that differs from `cfg` (naming the field), a data file whose
// size or CRC-32 differs from state.json's "files" record (when present), a
// weight or Adam moment that is not finite (or a negative second moment),
// naming the tensor and its first bad element. Errors name the file
// (DATA_LOSS for corruption). state.json is read up to 1 MiB.
Status LoadCheckpoint(const std::string& step_dir, const ModelConfig& cfg, ParamStore* params,
                      AdamW* adam, CheckpointState* state);

// Whether one of our parameter names is a Hugging Face BertForMaskedLM
// tensor ("bert.*", "cls.predictions.*"): our names for the BERT part are
// HF's own, so the mapping both ways is the identity on these (LoadHfInit
// reads them, ExportModel in model/train/export.h writes them). The rest
// ("prompt.", "detector.", "candidate.", "fusion.") are DGCA's alone.
bool IsHfBertParameter(const std::string& name);

struct HfLoadReport {
  int loaded = 0;                       // tensors copied
  std::vector<std::string> missing;     // our parameters absent from the file (kept as is)
  std::vector<std::string> unexpected;  // file tensors we have no place for
  std::vector<std::string> ignored;     // known extras (position_ids, pooler, NSP, tied copies)
  std::string Summary() const;          // "loaded 199, missing 12 (prompt.*...), ..."
};

// Copies the tensors of an HF BertForMaskedLM (or BertModel) safetensors file
// whose names match our parameters. Known extras are ignored:
// bert.embeddings.position_ids, cls.predictions.decoder.weight (tied to the
// word embeddings), cls.predictions.decoder.bias (== cls.predictions.bias),
// bert.pooler.*, cls.seq_relationship.*. A "bert."-less BertModel naming is
// accepted too. A shape mismatch is an error naming the tensor and both
// shapes; nothing is copied then.
StatusOr<HfLoadReport> LoadHfInit(const std::string& path, ParamStore* params);

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_CHECKPOINT_H_
