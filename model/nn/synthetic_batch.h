// A random ReLM batch in model/core/batch.h's layout, for the model's
// checks: model_test (CPU, finite differences), dgca-model-check (the CUDA
// model against the CPU one) and bench/gpu/model_errors.py, which rebuilds
// the same layout in PyTorch.
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

// Rows of `lengths` characters (each <= (L - 2 - 2P) / 2) at sequence
// length L: one or two errors per row (the target differs from the source
// at character r % n and, for n > 3, at the last), MFT masks on the odd
// correct characters when `mft`, and K = candidate_top_k candidates per
// slot that hold the target for even slots and -1 padding for every third.
// Deterministic for a seed (std::mt19937).
Batch SyntheticBatch(const ModelConfig& c, int L, const std::vector<int>& lengths, bool mft, uint32_t seed);

}  // namespace dgca

#endif  // DGCA_MODEL_NN_SYNTHETIC_BATCH_H_
