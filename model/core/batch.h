// Batch: one ReLM micro-batch, ready for the model. Built by the data
// pipeline (model/core/batch_builder.h) on a background thread.
//
// Layout of row b (length L = max_seq_len, P = prompt_length, n = chars):
//   [CLS] [CLS]xP x1..xn [SEP]xP [MASK]xn [SEP] [PAD]...
//   position 0      : [CLS]
//   1 .. P          : prompt slots 0..P-1 (input id [CLS]; embedding replaced)
//   P+1 .. P+n      : source characters (MFT may replace some by [MASK])
//   P+n+1 .. 2P+n   : prompt slots P..2P-1 (input id [SEP]; embedding replaced)
//   2P+n+1 .. 2P+2n : target slots (input id [MASK]); the model predicts y_i here
//   2P+2n+1         : [SEP]
// Sources longer than (L - 2 - 2P) / 2 characters are truncated.
#ifndef DGCA_MODEL_CORE_BATCH_H_
#define DGCA_MODEL_CORE_BATCH_H_

#include <cstdint>
#include <vector>

namespace dgca {

struct Batch {
  int batch_size = 0;   // B (rows actually filled; the last batch may be short)
  int seq_len = 0;      // L (every row padded to L)

  // [B*L] each, row-major.
  std::vector<int32_t> input_ids;
  std::vector<int32_t> attention_mask;  // 1 real token, 0 padding
  std::vector<int32_t> token_type_ids;  // all 0
  // Prompt slot index 0..2P-1 at prompt positions, -1 elsewhere.
  std::vector<int32_t> prompt_slot;
  // Target id at target slots, -100 elsewhere (ignored by the loss).
  std::vector<int32_t> labels;
  // Original source id at MFT-masked source positions, -100 elsewhere: the
  // MLM loss on these positions is the MFT term.
  std::vector<int32_t> mft_labels;

  // Per target slot, in row order: [T] where T = number of target slots in
  // the batch. slot_index[t] = b*L + position of that slot.
  std::vector<int32_t> slot_index;
  std::vector<int32_t> slot_source_id;   // x_i (the unmasked source char)
  std::vector<int32_t> slot_target_id;   // y_i
  // Candidates C_i = {x_i} ∪ confusion(x_i), K ids per slot, padded with -1.
  // [T*K]; candidate 0 is always x_i.
  std::vector<int32_t> candidates;
  int top_k = 0;                          // K

  // Row bookkeeping for decoding: chars per row and the sample's index in
  // its data file (for evaluation output and resume).
  std::vector<int32_t> row_length;
  std::vector<int64_t> sample_index;
  // Per row: the key of the sample's dropout masks (model/core/dropout.h),
  // from (seed, epoch, sample index): a sample's masks do not depend on the
  // batch it is in. [B]; may be empty when the model runs without dropout.
  std::vector<uint64_t> dropout_keys;

  int num_slots() const { return static_cast<int>(slot_index.size()); }
};

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_BATCH_H_
