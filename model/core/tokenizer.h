// BERT vocabulary and tokenizer (BasicTokenizer + WordPiece), as in Hugging
// Face BertTokenizer with do_lower_case=False (ReLM's default for Chinese).
//
// ECSpell data is already one character per token: map each character with
// Vocab::Lookup (one id per character, [UNK] when absent, no lowercasing),
// never with the tokenizer, so source and target stay aligned.
//
// Thread-safety: Vocab and BertTokenizer are immutable after construction;
// const methods may be called from any number of threads.
#ifndef DGCA_MODEL_CORE_TOKENIZER_H_
#define DGCA_MODEL_CORE_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/core/status.h"

namespace dgca {

// BERT's special-token ids (bert-base-chinese and every vocabulary built by
// BuildFromExamples).
constexpr int32_t kPadId = 0;
constexpr int32_t kUnkId = 100;
constexpr int32_t kClsId = 101;
constexpr int32_t kSepId = 102;
constexpr int32_t kMaskId = 103;
// Ids 0..kNumReservedIds-1 are [PAD], [unused1..99], [UNK], [CLS], [SEP], [MASK].
constexpr int32_t kNumReservedIds = 104;

class Vocab {
 public:
  Vocab() = default;

  // Loads a BERT vocab.txt: one token per line, id = 0-based line number.
  // Errors: missing or empty file, invalid UTF-8 (file:line:column), a line
  // longer than kMaxLineBytes (file:line) or a file larger than
  // kMaxFileBytes, found while reading: the wrong file (one without line
  // breaks, a symlink to /dev/zero) is an error, never an unbounded read.
  static StatusOr<Vocab> Load(const std::string& path);
  // bert-base-chinese's vocab.txt is 107 KiB with tokens of at most 28
  // bytes; WordPiece never matches a token of more than 100 characters.
  static constexpr int64_t kMaxFileBytes = int64_t{64} << 20;
  static constexpr int64_t kMaxLineBytes = 1024;

  // Builds from tokens in id order (tests, builders).
  static Vocab FromTokens(std::vector<std::string> tokens);

  // Builds a character vocabulary from ECSpell-format files (both sides of
  // every line): BERT's reserved ids 0..103 exactly ([PAD], [unused1..99],
  // [UNK], [CLS], [SEP], [MASK]), then every character seen at least
  // `min_count` times by descending frequency, ties by code point, so ids are
  // deterministic. Spaces, tabs and line ends are not characters. Errors:
  // missing file, invalid UTF-8 (file:line:column).
  static StatusOr<Vocab> BuildFromExamples(const std::vector<std::string>& ecspell_paths,
                                           int min_count = 1);
  // The same from in-memory lines ("src<TAB>trg" or plain text; every
  // non-whitespace character counts; invalid bytes are skipped).
  static Vocab BuildFromLines(const std::vector<std::string>& lines, int min_count = 1);

  // Writes one token per line (loads back with Load to the same ids).
  Status Save(const std::string& path) const;

  int size() const { return static_cast<int>(tokens_.size()); }
  // Id of `token`, or unk_id() when absent.
  int32_t Lookup(std::string_view token) const;
  bool Contains(std::string_view token) const;
  // Token of `id`; "" when out of range.
  const std::string& Token(int32_t id) const;
  const std::vector<std::string>& tokens() const { return tokens_; }

  // Special ids: read from the vocabulary when the token is present,
  // otherwise the BERT constants above.
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  int32_t cls_id() const { return cls_id_; }
  int32_t sep_id() const { return sep_id_; }
  int32_t mask_id() const { return mask_id_; }
  // True for [PAD], [UNK], [CLS], [SEP], [MASK] and [unusedN].
  bool IsSpecial(int32_t id) const;

 private:
  void Index();

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  int32_t pad_id_ = kPadId, unk_id_ = kUnkId, cls_id_ = kClsId, sep_id_ = kSepId,
          mask_id_ = kMaskId;
};

// BERT BasicTokenizer (clean text, split CJK characters, split on whitespace
// and punctuation, optional lower-casing) followed by WordPiece (greedy
// longest match, "##" continuation pieces, words over 100 characters and
// words with no segmentation become [UNK]).
//
// Lower-casing is ASCII-only here (and strips no accents): enough for
// Chinese data, where it is off by default as in ReLM.
class BertTokenizer {
 public:
  explicit BertTokenizer(const Vocab* vocab, bool lower_case = false)
      : vocab_(vocab), lower_case_(lower_case) {}

  // BasicTokenizer only: the words before WordPiece.
  std::vector<std::string> BasicTokenize(std::string_view text) const;
  // Full tokenization to vocabulary tokens.
  std::vector<std::string> Tokenize(std::string_view text) const;
  // Full tokenization to ids (no [CLS]/[SEP] added).
  std::vector<int32_t> Encode(std::string_view text) const;

  static constexpr int kMaxCharsPerWord = 100;

 private:
  void WordPiece(const std::string& word, std::vector<std::string>* out) const;

  const Vocab* vocab_;
  bool lower_case_;
};

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_TOKENIZER_H_
