#include "model/nn/synthetic_batch.h"

#include <algorithm>
#include <random>

#include "model/core/rng.h"

namespace dgca {
namespace {
// Keys of the rows' dropout masks: their own stream, so the batches' other
// draws are those of before dropout existed.
constexpr uint64_t kSyntheticDropoutStream = 0x44524F50ull;
}  // namespace

Batch SyntheticBatch(const ModelConfig& c, int L, const std::vector<int>& lengths, bool mft, uint32_t seed) {
  std::mt19937 rng(seed);
  auto tok = [&]() { return 5 + static_cast<int>(rng() % (c.vocab_size - 5)); };
  const int P = c.prompt_length, B = static_cast<int>(lengths.size());
  Batch b;
  b.batch_size = B;
  b.seq_len = L;
  b.input_ids.assign(B * L, kSyntheticPad);
  b.attention_mask.assign(B * L, 0);
  b.token_type_ids.assign(B * L, 0);
  b.prompt_slot.assign(B * L, -1);
  b.labels.assign(B * L, -100);
  b.mft_labels.assign(B * L, -100);
  b.top_k = c.candidate_top_k;
  for (int r = 0; r < B; ++r) {
    // A longer row would run into the next one (or past the buffer); an L
    // without room for one character leaves the row empty (padding).
    const int n = std::min(lengths[r], (L - 2 - 2 * P) / 2);
    if (n < 1) {
      b.row_length.push_back(0);
      b.sample_index.push_back(r);
      b.dropout_keys.push_back(MixSeed(seed, static_cast<uint64_t>(r), kSyntheticDropoutStream));
      continue;
    }
    int32_t* ids = &b.input_ids[r * L];
    std::vector<int> src(n), trg(n);
    for (int i = 0; i < n; ++i) src[i] = trg[i] = tok();
    trg[r % n] = tok();
    if (n > 3) trg[n - 1] = tok();
    int pos = 0;
    ids[pos++] = kSyntheticCls;
    for (int k = 0; k < P; ++k) b.prompt_slot[r * L + pos] = k, ids[pos++] = kSyntheticCls;
    for (int i = 0; i < n; ++i) {
      ids[pos] = src[i];
      if (mft && src[i] == trg[i] && i % 2 == 1) {
        ids[pos] = kSyntheticMask;
        b.mft_labels[r * L + pos] = src[i];
      }
      ++pos;
    }
    for (int k = 0; k < P; ++k) b.prompt_slot[r * L + pos] = P + k, ids[pos++] = kSyntheticSep;
    for (int i = 0; i < n; ++i) {
      ids[pos] = kSyntheticMask;
      b.labels[r * L + pos] = trg[i];
      b.slot_index.push_back(r * L + pos);
      b.slot_source_id.push_back(src[i]);
      b.slot_target_id.push_back(trg[i]);
      const int K = c.candidate_top_k;
      b.candidates.push_back(src[i]);
      for (int k = 1; k < K; ++k) {
        if (k == 1 && i % 2 == 0) b.candidates.push_back(trg[i]);  // y in C for even slots
        else if (k == K - 1 && i % 3 == 0) b.candidates.push_back(-1);  // padding
        else b.candidates.push_back(tok());
      }
      ++pos;
    }
    ids[pos++] = kSyntheticSep;
    for (int j = 0; j < pos; ++j) b.attention_mask[r * L + j] = 1;
    b.row_length.push_back(n);
    b.sample_index.push_back(r);
    b.dropout_keys.push_back(MixSeed(seed, static_cast<uint64_t>(r), kSyntheticDropoutStream));
  }
  return b;
}

namespace {
constexpr int kBertCls = 101, kBertSep = 102, kBertMask = 103;  // BERT-Chinese vocab ids, as torch_dgca.py
}  // namespace

Batch BenchmarkBatch(const ModelConfig& c, int B, int L, uint32_t seed) {
  std::mt19937 rng(seed);
  const int P = c.prompt_length, K = c.candidate_top_k;
  const int n = std::max(0, (L - 2 - 2 * P) / 2);
  const int lo = std::min(670, c.vocab_size - 1), hi = std::min(8000, c.vocab_size);
  std::uniform_int_distribution<int> tok(lo, std::max(lo, hi - 1));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Batch b;
  b.batch_size = B;
  b.seq_len = L;
  b.input_ids.assign(static_cast<size_t>(B) * L, 0);
  b.attention_mask.assign(static_cast<size_t>(B) * L, 0);
  b.prompt_slot.assign(static_cast<size_t>(B) * L, -1);
  b.mft_labels.assign(static_cast<size_t>(B) * L, -100);
  b.top_k = K;
  for (int r = 0; r < B; ++r) {
    const size_t row = static_cast<size_t>(r) * L;
    std::vector<int> src(n), trg(n);
    std::vector<bool> mft(n);
    for (int i = 0; i < n; ++i) {
      src[i] = tok(rng);
      const bool err = u(rng) < 0.1f;
      trg[i] = err ? tok(rng) : src[i];
      mft[i] = !err && u(rng) < 0.3f;
    }
    int32_t* ids = &b.input_ids[row];
    ids[0] = kBertCls;
    for (int k = 0; k < P; ++k) ids[1 + k] = kBertCls, b.prompt_slot[row + 1 + k] = k;
    for (int i = 0; i < n; ++i) {
      const int pos = 1 + P + i;
      ids[pos] = mft[i] ? kBertMask : src[i];
      if (mft[i]) b.mft_labels[row + pos] = src[i];
    }
    for (int k = 0; k < P; ++k) ids[1 + P + n + k] = kBertSep, b.prompt_slot[row + 1 + P + n + k] = P + k;
    for (int i = 0; i < n; ++i) {
      const int pos = 1 + 2 * P + n + i;
      ids[pos] = kBertMask;
      b.slot_index.push_back(static_cast<int32_t>(row + pos));
      b.slot_source_id.push_back(src[i]);
      b.slot_target_id.push_back(trg[i]);
      for (int k = 0; k < K; ++k) b.candidates.push_back(k == 0 ? src[i] : k == 1 ? trg[i] : tok(rng));
    }
    ids[1 + 2 * P + 2 * n] = kBertSep;
    for (int j = 0; j < std::min(L, 2 + 2 * P + 2 * n); ++j) b.attention_mask[row + j] = 1;
    b.row_length.push_back(n);
    b.sample_index.push_back(r);
    b.dropout_keys.push_back(MixSeed(seed, static_cast<uint64_t>(r), kSyntheticDropoutStream));
  }
  return b;
}

}  // namespace dgca
