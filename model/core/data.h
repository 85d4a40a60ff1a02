// The data pipeline: ECSpell-format reading, tokenization, ReLM batches with
// MFT, and a background loader with prefetch. docs/model.md, "Trainer".
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
  int64_t skipped_empty = 0;    // blank lines and pairs with no characters
};

// The largest data file ReadEcspell takes: it holds the whole file in
// memory (an ECSpell split is under 1 MiB; a stream such as /dev/zero once
// grew a rank to 3.2 GB before the kernel's OOM killer ended it).
inline constexpr uint64_t kMaxDataFileBytes = uint64_t{2} << 30;

// What ReadEcspell requires of a data file before it opens it: it exists,
// is a regular file (not a directory, FIFO or device), can be opened for
// reading and is at most kMaxDataFileBytes (CheckInputFile,
// model/core/files.h, with those words). The job-spec check
// (spec/spec_files.h) applies it to data.train and data.eval, so `dgca
// validate` and `dgca submit` refuse what the ranks would.
Status CheckDataFile(const std::string& path);

// Reads "src<TAB>trg" lines (characters separated by single spaces).
// Errors: what CheckDataFile refuses (missing, not a regular file, not
// readable, over kMaxDataFileBytes), an empty file, invalid UTF-8
// (file:line:column), a line without a tab (file:line).
// Each space-separated character maps to exactly one id (Vocab::Lookup;
// [UNK] when absent; no lowercasing), so source and target stay aligned.
// A trailing CR is dropped. `stats` may be null. Pairs longer than
// `max_chars` characters (> 0; e.g. MaxCharsForSeqLen) are truncated to it
// and counted; 0 keeps them whole (BuildBatch truncates anyway). A file with
// no usable pair is an error.
StatusOr<std::vector<Example>> ReadEcspell(const std::string& path, const Vocab& vocab,
                                           ReadStats* stats);
StatusOr<std::vector<Example>> ReadEcspell(const std::string& path, const Vocab& vocab,
                                           int max_chars, ReadStats* stats);

// Longest source (in characters) that fits max_seq_len with 2P prompt slots.
int MaxCharsForSeqLen(int max_seq_len, int prompt_length);

struct BatchOptions {
  int seq_len = 128;
  int prompt_length = 3;
  int top_k = 8;            // candidates per slot (0 = candidate head off)
  MftMode mft_mode = MftMode::kNoError;
  float mft_rate = 0.3f;
  uint64_t seed = 42;
  // Special ids of the vocabulary (SetSpecialTokens fills them from a Vocab).
  int32_t pad_id = 0, cls_id = 101, sep_id = 102, mask_id = 103;
  // special->at(id) != 0: never MFT-masked. Null: ids below 104 ([PAD],
  // [unusedN], [UNK], [CLS], [SEP], [MASK] in BERT's layout) are special.
  std::shared_ptr<const std::vector<uint8_t>> special;
};

// Copies the vocabulary's special ids and special-token table into `options`.
void SetSpecialTokens(const Vocab& vocab, BatchOptions* options);

// Builds one ReLM batch from examples[indices]. `mft` false at evaluation.
// `epoch` feeds the MFT RNG: the mask of sample i depends only on (seed,
// epoch, i), never on the batch it lands in. Precondition: seq_len >=
// 2 * prompt_length + 2 (DataLoader::Create checks it); rows are truncated to
// MaxCharsForSeqLen. `confusion` may be null (candidates = {x_i} only).
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

// Stream order: the training stream is the concatenation of the epochs'
// shuffled orders (epoch e: a Fisher-Yates permutation keyed by (seed, e));
// optimizer step s takes stream positions [s*G, (s+1)*G), G = global batch,
// so no sample is dropped and a step may straddle two epochs (each sample
// keeps its own epoch for MFT). G > N is allowed (a step then repeats
// samples).
//
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

// The shuffled order of epoch `epoch` over n samples (deterministic for
// (seed, epoch), the same on every platform).
std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch);

// The samples (epoch, index) of micro-batch `micro_step` of optimizer step
// `step` for options.rank: what DataLoader yields there.
struct SampleRef {
  int64_t epoch = 0;
  int64_t index = 0;
};
std::vector<SampleRef> MicroBatchSamples(int64_t num_examples, const LoaderOptions& options,
                                         int64_t step, int micro_step);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_DATA_H_
