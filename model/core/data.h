// The data pipeline: ECSpell-format reading, tokenization, ReLM batches with
// MFT, and a background loader with prefetch. DESIGN.md "Trainer" / "Data".
//
// Sharding: each optimizer step consumes global_batch consecutive samples of
// the epoch's shuffled order; rank r of W takes, for micro-step a, the
// micro_batch samples starting at (a*W + r)*micro_batch of that window. So
// the union over ranks and micro-steps is the same set of samples whatever W
// and the accumulation are (what the equivalence tests rely on).
//
// Determinism: the shuffle of epoch e uses (seed, e); MFT masks of a sample
// use (seed, epoch, sample index); both are independent of thread timing,
// world size and resume point.
#ifndef DGCA_MODEL_CORE_DATA_H_
#define DGCA_MODEL_CORE_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/core/batch.h"
#include "model/core/config.h"
#include "model/core/status.h"

namespace dgca {

class Vocab;         // model/core/tokenizer.h
class ConfusionSet;  // model/core/confusion.h

// One sentence pair, already mapped to token ids (one id per character).
struct Example {
  std::vector<int32_t> src;
  std::vector<int32_t> trg;
  std::vector<std::string> src_chars;  // for decoding and metrics
  std::vector<std::string> trg_chars;
};

struct ReadStats {
  int64_t lines = 0;
  int64_t kept = 0;
  int64_t skipped_unequal = 0;  // pairs whose sides differ in length
  int64_t truncated = 0;        // longer than max chars for max_seq_len
};

// Reads "src<TAB>trg" lines (characters separated by single spaces).
// Errors: missing file, empty file, invalid UTF-8 (file:line:column), a line
// without a tab (file:line).
StatusOr<std::vector<Example>> ReadEcspell(const std::string& path, const Vocab& vocab,
                                           ReadStats* stats);

// Longest source (in characters) that fits max_seq_len with 2P prompt slots.
int MaxCharsForSeqLen(int max_seq_len, int prompt_length);

struct BatchOptions {
  int seq_len = 128;
  int prompt_length = 3;
  int top_k = 8;            // candidates per slot (0 = candidate head off)
  MftMode mft_mode = MftMode::kNoError;
  float mft_rate = 0.3f;
  uint64_t seed = 42;
};

// Builds one ReLM batch from examples[indices]. `mft` false at evaluation.
// `epoch` feeds the MFT RNG.
Batch BuildBatch(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
                 const BatchOptions& options, const ConfusionSet* confusion, bool mft,
                 int64_t epoch);

// Position in the training stream; saved in checkpoints.
struct LoaderPosition {
  int64_t step = 0;   // optimizer steps consumed so far
};

struct LoaderOptions {
  BatchOptions batch;
  int micro_batch = 8;
  int accumulation = 1;
  int rank = 0;
  int world_size = 1;
  int threads = 1;     // builder threads
  int prefetch = 2;    // micro-batches queued ahead
};

// Background loader over the training examples. Next() returns micro-batches
// in order: for each optimizer step, `accumulation` micro-batches for this
// rank. Thread-safety: Next() from one thread only.
class DataLoader {
 public:
  static StatusOr<std::unique_ptr<DataLoader>> Create(
      std::shared_ptr<const std::vector<Example>> examples,
      std::shared_ptr<const ConfusionSet> confusion, const LoaderOptions& options,
      LoaderPosition start);
  virtual ~DataLoader() = default;
  // Blocks until the next micro-batch is ready; `wait_seconds` (may be null)
  // gets how long it blocked.
  virtual StatusOr<Batch> Next(double* wait_seconds) = 0;
  // Position after the last micro-batch of the last complete step returned.
  virtual LoaderPosition position() const = 0;
};

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_DATA_H_
