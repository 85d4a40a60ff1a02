// Corrector: an exported model (model/train/export.h) correcting sentences
// on the CPU, what `dgca correct` runs (docs/cli.md).
//
// A sentence is taken character by character (UTF-8 code points), each
// mapped to one vocabulary id as the training data was (Vocab::Lookup,
// [UNK] when absent); whitespace is kept in place and not given to the
// model. Decoding is the trainer's evaluation path (model/train/predict.h:
// ReLM rows, the candidate head's confusion set, argmax of the fused
// distribution), so Evaluate() over the test set a job evaluated on gives
// the job's eval metrics.
//
// A position changes when the predicted id differs from the source id; it
// then shows the predicted token ("##" of a WordPiece continuation
// stripped). A special token predicted ([UNK], [PAD], ...) has no text to
// show: the character is kept and no change reported (Evaluate counts ids,
// as the trainer does, so it still counts there).
//
// Thread-safety: not thread-safe (one model); one caller at a time.
#ifndef DGCA_MODEL_TRAIN_CORRECTOR_H_
#define DGCA_MODEL_TRAIN_CORRECTOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/core/data.h"
#include "model/core/status.h"
#include "model/train/export.h"

namespace dgca {

struct CharChange {
  int position = 0;  // 0-based index among the sentence's code points
  std::string from;  // the source character
  std::string to;    // the corrected one
};

struct Correction {
  std::string original;
  std::string corrected;             // the original with each change applied
  std::vector<CharChange> changes;   // by position
};

struct CorrectorOptions {
  int batch_size = 16;  // sentences per forward pass
  int threads = 1;      // CPU compute threads
};

struct CorrectorEval {
  std::map<std::string, double> metrics;  // model/core/eval_metrics.h's keys
  ReadStats stats;                        // the file as ReadEcspell read it
  int64_t sentences = 0;
};

class Corrector {
 public:
  // LoadExportedModel(dir, ...) plus the options' checks (INVALID_ARGUMENT
  // for a batch size or thread count < 1).
  static StatusOr<std::unique_ptr<Corrector>> Load(const std::string& dir,
                                                   const CorrectorOptions& options);

  // Corrects each sentence. `names` (same length, or empty) names them in
  // errors ("sentence 3", "input.txt:3"). Errors: invalid UTF-8 (the name
  // and byte), a sentence of more than max_chars() characters
  // (INVALID_ARGUMENT naming it, its length, the limit and max_seq_len).
  StatusOr<std::vector<Correction>> Correct(const std::vector<std::string>& sentences,
                                            const std::vector<std::string>& names = {});

  // Decodes an ECSpell file ("src<TAB>trg", read as training reads its eval
  // file: pairs cut to max_chars()) and scores the predictions as the
  // trainer's evaluation does.
  StatusOr<CorrectorEval> Evaluate(const std::string& ecspell_path, int64_t max_samples = 0);

  const ExportedModel& model() const { return m_; }
  // The most characters of a sentence: MaxCharsForSeqLen(max_seq_len, P).
  int max_chars() const { return max_chars_; }

 private:
  Corrector(ExportedModel m, const CorrectorOptions& o);
  BatchOptions batch_options() const;

  ExportedModel m_;
  CorrectorOptions options_;
  int max_chars_ = 0;
};

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_CORRECTOR_H_
