// ConfusionSet: for a token id, the ordered list of ids it is often
// confused with (the candidate head's C_i = {x_i} ∪ confusion(x_i)).
//
// Invariants of every list: no duplicates, never the key itself, only ids of
// the vocabulary the set was built for. Lookup is O(1) (flat CSR arrays
// indexed by id), cheap enough for the batch builder.
//
// Thread-safety: immutable after construction; const methods are safe from
// any number of threads.
#ifndef DGCA_MODEL_CORE_CONFUSION_H_
#define DGCA_MODEL_CORE_CONFUSION_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/core/status.h"

namespace dgca {

class Vocab;

constexpr char kDefaultUnihanReadingsPath[] = "/usr/share/unicode/Unihan_Readings.txt.bz2";

class ConfusionSet {
 public:
  ConfusionSet() = default;

  // A JSON object {"字": ["字1", "字2", ...], ...} (the format of
  // ../shared/data/confusion/pinyin_sam.json). Keys not in the vocabulary
  // are skipped; lists keep their order with duplicates, the key itself and
  // characters not in the vocabulary dropped. Errors: missing file, bad JSON
  // (file:line:column), a value that is not an array of strings (file:line:
  // column of that value).
  static StatusOr<ConfusionSet> LoadJson(const std::string& path, const Vocab& vocab);

  // Homophones from Unihan kMandarin readings: two single-character tokens
  // are confusable when they share a reading with tone marks stripped.
  // Candidates of a character are ordered: first those sharing a toned
  // reading, then the rest, each group by ascending vocabulary id (for a
  // vocabulary built from data, id order is frequency order).
  // `max_per_key` > 0 keeps only the first that many. Reads .bz2 through
  // popen("bzcat ..."), other paths directly. Errors: missing file, bzcat
  // missing or failing, no kMandarin line found.
  static StatusOr<ConfusionSet> BuildFromUnihan(
      const Vocab& vocab, const std::string& unihan_readings_path = kDefaultUnihanReadingsPath,
      int max_per_key = 0);

  // Builds from explicit lists (tests, builders); the invariants above are
  // enforced (duplicates and the key dropped; ids outside [0, vocab_size)
  // dropped).
  static ConfusionSet FromLists(int vocab_size, const std::map<int32_t, std::vector<int32_t>>& lists);

  // The candidates of `id` (not including `id`), in order; count 0 when none.
  const int32_t* Candidates(int32_t id, int* count) const {
    if (id < 0 || id + 1 >= static_cast<int64_t>(offsets_.size())) {
      *count = 0;
      return nullptr;
    }
    *count = static_cast<int>(offsets_[id + 1] - offsets_[id]);
    return flat_.data() + offsets_[id];
  }
  std::vector<int32_t> CandidatesOf(int32_t id) const;

  int vocab_size() const { return offsets_.empty() ? 0 : static_cast<int>(offsets_.size()) - 1; }
  int64_t num_keys() const { return num_keys_; }     // ids with at least one candidate
  int64_t num_entries() const { return static_cast<int64_t>(flat_.size()); }

 private:
  std::vector<int64_t> offsets_;  // [vocab_size + 1]
  std::vector<int32_t> flat_;
  int64_t num_keys_ = 0;
};

// Pinyin with tone marks stripped ("zhōng" -> "zhong", "lǘ" -> "lü"); also
// drops tone digits ("zhong1" -> "zhong"). Lower-case ASCII otherwise kept.
std::string StripPinyinTones(const std::string& pinyin);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_CONFUSION_H_
