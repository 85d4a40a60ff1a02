// BatchIndex: what a DgcaModel reads of a Batch (model/core/batch.h),
// checked once and indexed for the encoder and the heads — the token type
// and prompt slot of every position, the labelled rows (target slots first,
// then MFT positions) with their targets, and the length the encoder runs
// at. The CPU model (model/nn/model.cc) and the CUDA model
// (model/cuda/cuda_model.cc) both use it, so they accept and reject the
// same batches with the same messages.
//
// Thread-safety: not thread-safe (its arrays are reused by every Check).
#ifndef DGCA_MODEL_NN_BATCH_INDEX_H_
#define DGCA_MODEL_NN_BATCH_INDEX_H_

#include <cstdint>
#include <vector>

#include "model/core/batch.h"
#include "model/core/config.h"
#include "model/core/status.h"

namespace dgca {

class BatchIndex {
 public:
  // For a model of `cfg` holding up to max_batch rows of seq_len. Whether
  // the DGCA heads are on (detector or candidate) comes from cfg.
  BatchIndex(const ModelConfig& cfg, int max_batch, int seq_len);

  // Labelled positions (target slots + MFT) a model of this shape holds:
  // at most seq_len - 2 - 2P per row ([CLS], [SEP] and the prompt slots
  // never carry a label). The logits buffers are sized for it.
  static int MaxRows(const ModelConfig& cfg, int max_batch, int seq_len);
  int max_rows() const { return max_rows_; }

  // Checks every field the model reads and fills the arrays below.
  // INVALID_ARGUMENT naming the field, the index and what is valid, e.g.
  // "DgcaModel: batch.input_ids[19] (row 1, position 3) = 30 outside
  // [0, vocab_size=30)". need_labels: every target slot needs a target id
  // (training and loss; Predict does not). With the heads on, the slots'
  // source ids and candidates are checked against the vocabulary too.
  Status Check(const Batch& b, bool need_labels);

  // After a successful Check of b: the length to run the encoder at — one
  // past the last column that is real in some row or holds a label (the
  // columns after it are padding in every row and feed nothing, so
  // dropping them is exact), rounded up to a multiple of `multiple` but
  // not past b.seq_len.
  int TrimmedLength(const Batch& b, int multiple) const;

  // Filled by Check, indexed by b*L + position of the checked batch:
  const std::vector<int32_t>& token_types() const { return types_; }   // 0 where absent
  const std::vector<int32_t>& prompt_slots() const { return slots_; }  // -1 where absent
  // Labelled positions (b*L + position): the target slots in slot order,
  // then the MFT positions in order; targets() is each one's label (-100:
  // a target slot without one, only when !need_labels).
  const std::vector<int32_t>& rows() const { return rows_; }
  const std::vector<int32_t>& targets() const { return targets_; }

 private:
  const ModelConfig cfg_;
  const int max_batch_, seq_len_, max_rows_;
  const bool heads_on_;
  std::vector<int32_t> types_, slots_, rows_, targets_;
  std::vector<uint8_t> mark_;  // scratch: position already labelled
};

}  // namespace dgca

#endif  // DGCA_MODEL_NN_BATCH_INDEX_H_
