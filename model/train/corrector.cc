#include "model/train/corrector.h"

#include <utility>

#include "model/core/utf8.h"
#include "model/train/predict.h"

namespace dgca {

Corrector::Corrector(ExportedModel m, const CorrectorOptions& o)
    : m_(std::move(m)),
      options_(o),
      max_chars_(MaxCharsForSeqLen(m_.max_seq_len, m_.config.prompt_length)) {}

StatusOr<std::unique_ptr<Corrector>> Corrector::Load(const std::string& dir,
                                                     const CorrectorOptions& options) {
  if (options.batch_size < 1) {
    return InvalidArgumentError("correct: batch size must be >= 1, got " +
                                std::to_string(options.batch_size));
  }
  if (options.threads < 1) {
    return InvalidArgumentError("correct: threads must be >= 1, got " + std::to_string(options.threads));
  }
  DGCA_ASSIGN_OR_RETURN(ExportedModel m, LoadExportedModel(dir, options.batch_size, options.threads));
  return std::unique_ptr<Corrector>(new Corrector(std::move(m), options));
}

BatchOptions Corrector::batch_options() const {
  // As the trainer builds its evaluation batches (model/train/trainer.cc).
  BatchOptions o;
  o.seq_len = m_.max_seq_len;
  o.prompt_length = m_.config.prompt_length;
  o.top_k = m_.config.candidate ? m_.config.candidate_top_k : 0;
  SetSpecialTokens(m_.vocab, &o);
  return o;
}

StatusOr<std::vector<Correction>> Corrector::Correct(const std::vector<std::string>& sentences,
                                                     const std::vector<std::string>& names) {
  auto name = [&](size_t i) {
    return i < names.size() ? names[i] : "sentence " + std::to_string(i + 1);
  };
  // Per sentence: its code points as text, and which of them the model sees.
  struct Split {
    std::vector<std::string> chars;
    std::vector<int> model_pos;  // indices into chars of the non-whitespace ones
  };
  std::vector<Split> splits(sentences.size());
  std::vector<Example> examples;
  std::vector<size_t> example_of;  // sentence index -> example index (or npos)
  for (size_t i = 0; i < sentences.size(); ++i) {
    const std::string& s = sentences[i];
    if (const size_t bad = FindInvalidUtf8(s); bad != std::string::npos) {
      return InvalidArgumentError(name(i) + ": invalid UTF-8 at byte " + std::to_string(bad));
    }
    Split& sp = splits[i];
    Example ex;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t start = pos;
      uint32_t cp = 0;
      if (!DecodeUtf8(s, &pos, &cp)) break;  // checked above
      sp.chars.push_back(s.substr(start, pos - start));
      if (IsWhitespaceCodepoint(cp)) continue;
      sp.model_pos.push_back(static_cast<int>(sp.chars.size()) - 1);
      const int32_t id = m_.vocab.Lookup(sp.chars.back());
      ex.src.push_back(id);
      ex.trg.push_back(id);  // not read by Predict
      ex.src_chars.push_back(sp.chars.back());
      ex.trg_chars.push_back(sp.chars.back());
    }
    if (static_cast<int>(ex.src.size()) > max_chars_) {
      return InvalidArgumentError(
          name(i) + ": " + std::to_string(ex.src.size()) + " characters; this model takes at most " +
          std::to_string(max_chars_) + " (its max_seq_len " + std::to_string(m_.max_seq_len) +
          " holds (" + std::to_string(m_.max_seq_len) + " - 2 - 2 x " +
          std::to_string(m_.config.prompt_length) + ") / 2 characters beside its " +
          std::to_string(m_.config.prompt_length) + " prompt slots a side); split the sentence");
    }
    if (ex.src.empty()) {
      example_of.push_back(std::string::npos);  // nothing to correct
    } else {
      example_of.push_back(examples.size());
      examples.push_back(std::move(ex));
    }
  }
  DGCA_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> pred,
                        PredictExamples(m_.model.get(), examples, m_.confusion.get(), batch_options(),
                                        options_.batch_size));
  std::vector<Correction> out(sentences.size());
  for (size_t i = 0; i < sentences.size(); ++i) {
    Correction& c = out[i];
    c.original = sentences[i];
    std::vector<std::string> chars = splits[i].chars;
    if (example_of[i] != std::string::npos) {
      const Example& ex = examples[example_of[i]];
      const std::vector<int32_t>& p = pred[example_of[i]];
      for (size_t k = 0; k < p.size() && k < ex.src.size(); ++k) {
        if (p[k] == ex.src[k] || m_.vocab.IsSpecial(p[k])) continue;
        std::string to = m_.vocab.Token(p[k]);
        if (to.size() > 2 && to.compare(0, 2, "##") == 0) to = to.substr(2);
        const int at = splits[i].model_pos[k];
        c.changes.push_back({at, chars[at], to});
        chars[at] = to;
      }
    }
    for (const std::string& ch : chars) c.corrected += ch;
  }
  return out;
}

StatusOr<CorrectorEval> Corrector::Evaluate(const std::string& ecspell_path, int64_t max_samples) {
  CorrectorEval e;
  DGCA_ASSIGN_OR_RETURN(std::vector<Example> examples,
                        ReadEcspell(ecspell_path, m_.vocab, max_chars_, &e.stats));
  DGCA_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> pred,
                        PredictExamples(m_.model.get(), examples, m_.confusion.get(), batch_options(),
                                        options_.batch_size, max_samples));
  e.metrics = ScorePredictions(examples, pred);
  e.sentences = static_cast<int64_t>(pred.size());
  return e;
}

}  // namespace dgca
