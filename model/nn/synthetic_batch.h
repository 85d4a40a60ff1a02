// Random ReLM batches in model/core/batch.h's layout: SyntheticBatch for
// the model's checks (model_test, dgca-model-check; bench/gpu/model_errors.py
// rebuilds the same layout in PyTorch), BenchmarkBatch for the throughput
// benchmarks (dgca-bench, dgca-bench-cpu; bench/torch_dgca.py make_batch is
// the PyTorch peer's).
//
// Thread-safety: a pure function.
#ifndef DGCA_MODEL_NN_SYNTHETIC_BATCH_H_
#define DGCA_MODEL_NN_SYNTHETIC_BATCH_H_

#include <cstdint>
#include <vector>

#include "model/core/batch.h"
#include "model/core/config.h"

namespace dgca {

// The special ids it uses; characters are drawn from [5, vocab_size).
constexpr int kSyntheticPad = 0, kSyntheticCls = 2, kSyntheticSep = 3, kSyntheticMask = 4;

// Rows of `lengths` characters (each <= (L - 2 - 2P) / 2; longer ones are
// cut to that, and a row left without a character is all padding) at sequence
// length L: one or two errors per row (the target differs from the source
// at character r % n and, for n > 3, at the last), MFT masks on the odd
// correct characters when `mft`, and K = candidate_top_k candidates per
// slot that hold the target for even slots and -1 padding for every third.
// Deterministic for a seed (std::mt19937).
Batch SyntheticBatch(const ModelConfig& c, int L, const std::vector<int>& lengths, bool mft, uint32_t seed);

// As bench/torch_dgca.py make_batch, with its layout and sizes and our own
// random numbers (the counts match in expectation; a step's cost does not
// depend on the ids): B rows of n = (L - 2 - 2P) / 2 characters, every row
// full length; ids uniform in [670, 8000) (BERT-Chinese's CJK range,
// clipped to the vocabulary); 10% of characters wrong (target redrawn);
// 30% of the correct source characters MFT-masked; K candidates per slot:
// the source, the target, then uniform draws. Special ids are
// BERT-Chinese's ([CLS] 101, [SEP] 102, [MASK] 103).
Batch BenchmarkBatch(const ModelConfig& c, int B, int L, uint32_t seed);

}  // namespace dgca

#endif  // DGCA_MODEL_NN_SYNTHETIC_BATCH_H_
