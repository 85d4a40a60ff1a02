// Batch records: the training data order written to a file, so another
// implementation (bench/gpu/loss_curve.py: the PyTorch peer) can train on
// exactly the batches dgca trained on, in the same order.
//
// Format (little endian, all integers int32 unless noted):
//   file    = "DGCABAT1" (8 bytes), then records until end of file
//   record  = header[8] = {step, micro, B, L, T, K, 0, 0}
//             input_ids[B*L]  attention_mask[B*L]  prompt_slot[B*L]
//             labels[B*L]  mft_labels[B*L]
//             slot_index[T]  slot_source_id[T]  slot_target_id[T]
//             candidates[T*K]  row_length[B]
//             sample_index[B] (int64)
//   step    = the 1-based optimizer step the micro-batch belongs to,
//   micro   = its 0-based index within the step's accumulation.
// token_type_ids are not stored (all 0 by construction, model/core/batch.h),
// nor dropout_keys: a peer replaying the batches has its own dropout RNG,
// so loss-curve comparisons run without dropout (dgca-train's default).
//
// Thread-safety: a BatchRecordWriter is used by one thread; ReadBatchRecords
// is a free function.
#ifndef DGCA_MODEL_CORE_BATCH_IO_H_
#define DGCA_MODEL_CORE_BATCH_IO_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "model/core/batch.h"
#include "model/core/status.h"

namespace dgca {

struct BatchRecord {
  int64_t step = 0;
  int micro = 0;
  Batch batch;
};

class BatchRecordWriter {
 public:
  // Creates (truncates) `path` and writes the magic.
  static StatusOr<std::unique_ptr<BatchRecordWriter>> Open(const std::string& path);
  ~BatchRecordWriter();
  // Appends one record. The batch's arrays must have the sizes batch.h
  // states (INVALID_ARGUMENT naming the array otherwise).
  Status Append(int64_t step, int micro, const Batch& batch);
  // Flushes and closes; errors (a full disk) are reported here.
  Status Close();

 private:
  BatchRecordWriter(std::string path, std::FILE* f) : path_(std::move(path)), f_(f) {}
  std::string path_;
  std::FILE* f_;
};

// Reads every record of a file written by BatchRecordWriter. A wrong magic,
// a truncated record or impossible sizes are DATA_LOSS naming the file, the
// record number and its byte offset.
StatusOr<std::vector<BatchRecord>> ReadBatchRecords(const std::string& path);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_BATCH_IO_H_
