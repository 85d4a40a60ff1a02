// Exporting a trained checkpoint for use outside training (`dgca export`),
// and loading an export back (`dgca correct`, model/train/corrector.h).
//
// An export directory OUT/ holds (docs/cli.md, "The export directory"):
//   model.safetensors       the BERT encoder and MLM head under Hugging Face
//                           BertForMaskedLM's names (bert.*, cls.predictions.*;
//                           the tied decoder copies left out, as HF's
//                           save_pretrained does), F32, metadata format "pt":
//                           transformers' BertForMaskedLM.from_pretrained(OUT)
//                           loads it with config.json and vocab.txt
//   config.json             HF BertConfig fields (model_type "bert", sizes,
//                           hidden_act "gelu" = exact erf GELU, layer_norm_eps)
//                           plus "dgca": what only dgca reads (prompt length
//                           and encoder, heads, fusion, max_seq_len, the
//                           source checkpoint, its step and eval)
//   vocab.txt               the job's vocabulary (BERT format, id = line)
//   dgca_heads.safetensors  the DGCA parts: prompt encoder (prompt.*),
//                           detector.*, candidate.*, fusion.*; absent when the
//                           model has none of them
//   confusion.json          the candidate head's confusion set as the job
//                           used it ({"字": ["字1", ...]}, in order); only with
//                           the candidate head on
// The parameter names are those of the checkpoint (IsHfBertParameter,
// model/train/checkpoint.h, splits them between the two tensor files).
//
// Thread-safety: free functions; callers serialise writes to one OUT.
#ifndef DGCA_MODEL_TRAIN_EXPORT_H_
#define DGCA_MODEL_TRAIN_EXPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/core/confusion.h"
#include "model/core/status.h"
#include "model/core/tokenizer.h"
#include "model/nn/model.h"

namespace dgca {

inline constexpr const char* kExportModelFile = "model.safetensors";
inline constexpr const char* kExportHeadsFile = "dgca_heads.safetensors";
inline constexpr const char* kExportConfigFile = "config.json";
inline constexpr const char* kExportVocabFile = "vocab.txt";
inline constexpr const char* kExportConfusionFile = "confusion.json";
// config.json's dgca.format: bumped when a reader of an older one would
// misread a newer one.
inline constexpr int kExportFormat = 1;

// Which step directory of a checkpoint DIR to export.
struct ChosenCheckpoint {
  std::string step_dir;
  int64_t step = 0;
  // "best": the best by kRetentionMetric (model/train/checkpoint_retention.h,
  // the rule retention keeps it by); "latest": what DIR/latest names.
  std::string kind;
  bool has_metric = false;
  double metric = 0;
  // Why this one, for the user: "step-00003200, the best by
  // char_correction_f1 (0.4262) of 2 checkpoints", or "..., the latest; no
  // checkpoint has an eval recorded, so there is no best".
  std::string reason;
};

// `which`: "best" (the best by eval; the latest when no checkpoint has an
// eval recorded at its step, said in `reason`) or "latest". NOT_FOUND naming
// DIR when it holds no step directory; INVALID_ARGUMENT for another `which`.
StatusOr<ChosenCheckpoint> ChooseCheckpoint(const std::string& dir, const std::string& which);

struct ExportSource {
  std::string step_dir;        // a step-NNNNNNNN directory (SaveCheckpoint's)
  std::string vocab_path;      // the vocabulary the job trained with
  std::string confusion_path;  // its confusion set; "" = the built-in Unihan one
  int max_seq_len = 128;       // the job's data.max_seq_len
  std::string description;     // config.json dgca.source ("job J, step-N (best ...)")
};

struct ExportResult {
  int64_t step = 0;
  int bert_tensors = 0;   // in model.safetensors
  int dgca_tensors = 0;   // in dgca_heads.safetensors
  int64_t parameters = 0;
  std::vector<std::string> files;            // written, in OUT
  std::map<std::string, double> eval;        // the step's eval.json metrics (empty: none)
};

// Reads and fully validates the checkpoint (LoadCheckpoint: shapes, CRCs,
// finite weights; the model sizes from its state.json), the vocabulary
// (its size must be the checkpoint's vocab_size) and the confusion set,
// then writes OUT/ as above (each file atomically; OUT is created).
// Errors name the file at fault; a max_seq_len outside
// [2*prompt_length+4, max_position] is INVALID_ARGUMENT.
StatusOr<ExportResult> ExportModel(const ExportSource& source, const std::string& out_dir);

// An export loaded back, ready to predict on the CPU.
struct ExportedModel {
  ModelConfig config;
  int max_seq_len = 0;
  int64_t step = 0;
  std::string source;                          // dgca.source
  std::map<std::string, double> eval;          // dgca.eval
  Vocab vocab;
  std::shared_ptr<const ConfusionSet> confusion;  // null with the candidate head off
  std::unique_ptr<DgcaModel> model;            // for (max_batch, max_seq_len)
};

// Loads OUT/ as ExportModel wrote it into a CPU DgcaModel of `max_batch`
// rows and `threads` compute threads. Errors (NOT_FOUND / INVALID_ARGUMENT
// / DATA_LOSS) name the directory or file and what is wrong: not a
// directory, a file missing ("is it a dgca export directory?"), a
// config.json field missing or out of range, a vocabulary of another size
// than vocab_size, a tensor missing, unexpected or of the wrong shape.
StatusOr<ExportedModel> LoadExportedModel(const std::string& dir, int max_batch, int threads);

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_EXPORT_H_
