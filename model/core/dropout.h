// Dropout masks as a pure function of (sample key, site, element place):
// the same bits on the CPU and in every CUDA kernel, recomputed in the
// backward instead of stored, and independent of how samples are grouped
// into batches, ranks or micro-steps (a sample's mask depends on its own
// key only, Batch::dropout_keys), so data-parallel equivalence, resume and
// the CPU-vs-CUDA checks hold with dropout on as they do without.
//
// keep(x) = DropoutHash(site key, index) >= DropoutThreshold(p): P(drop) = p
// to 2^-32; a kept value is multiplied by 1 / (1 - p) (inverted dropout, as
// torch.nn.functional.dropout).
//
// Sites and indices (every backend must use these):
//   embeddings: DropoutSiteKey(key, -1, kDropHidden), index DropoutHiddenIndex(pos, col)
//   layer l attention probabilities: DropoutSiteKey(key, l, kDropAttnProbs),
//     index DropoutProbsIndex(head, query, key position)
//   layer l attention output projection: DropoutSiteKey(key, l, kDropAttnOut)
//   layer l FFN output projection: DropoutSiteKey(key, l, kDropFfnOut)
// `pos` etc. are positions within the sample's row, not flat batch offsets.
//
// The hash is splitmix64's finalizer of key ^ index * golden ratio: cheap
// enough per element on a GPU (three 64-bit multiplies), and ctest checks
// its drop rate and independence (dropout_test.cc).
//
// Thread-safety: pure functions.
#ifndef DGCA_MODEL_CORE_DROPOUT_H_
#define DGCA_MODEL_CORE_DROPOUT_H_

#include <cstdint>

#if defined(__CUDACC__)
#define DGCA_DROPOUT_FN __host__ __device__ __forceinline__
#else
#define DGCA_DROPOUT_FN inline
#endif

namespace dgca {

enum DropoutSite : int { kDropHidden = 0, kDropAttnProbs = 1, kDropAttnOut = 2, kDropFfnOut = 3 };

DGCA_DROPOUT_FN uint64_t DropoutMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// layer -1 is the embeddings.
DGCA_DROPOUT_FN uint64_t DropoutSiteKey(uint64_t sample_key, int layer, int site) {
  const uint64_t code = static_cast<uint64_t>(layer + 1) * 4u + static_cast<uint64_t>(site) + 1u;
  return DropoutMix64(sample_key + code * 0xD1B54A32D192ED03ull);
}

DGCA_DROPOUT_FN uint32_t DropoutHash(uint64_t site_key, uint64_t index) {
  return static_cast<uint32_t>(DropoutMix64(site_key ^ (index * 0x9E3779B97F4A7C15ull)) >> 32);
}

// p in [0, 1): floor(p * 2^32); 0 keeps everything.
DGCA_DROPOUT_FN uint32_t DropoutThreshold(float p) {
  if (!(p > 0.0f)) return 0u;
  const double t = static_cast<double>(p) * 4294967296.0;
  return t >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(t);
}

DGCA_DROPOUT_FN float DropoutScale(float p) { return p > 0.0f ? 1.0f / (1.0f - p) : 1.0f; }

// A dropout probability the trainer takes: in [0, 1) as the float it
// trains with (0.99999999 rounds to 1 and is not).
inline bool ValidDropout(double p) { return p >= 0.0 && static_cast<float>(p) < 1.0f; }

DGCA_DROPOUT_FN bool DropoutKeep(uint64_t site_key, uint64_t index, uint32_t threshold) {
  return threshold == 0u || DropoutHash(site_key, index) >= threshold;
}

// [pos, col] of a [L, H] row block.
DGCA_DROPOUT_FN uint64_t DropoutHiddenIndex(int pos, int col) {
  return (static_cast<uint64_t>(pos) << 32) | static_cast<uint32_t>(col);
}
// [head, query, key] of a [nh, L, L] probability block (L < 2^20).
DGCA_DROPOUT_FN uint64_t DropoutProbsIndex(int head, int query, int key) {
  return (static_cast<uint64_t>(head) << 40) | (static_cast<uint64_t>(query) << 20) | static_cast<uint64_t>(key);
}

// Dropout on one layer's attention probabilities (site kDropAttnProbs of
// `layer`); keys [B] in the memory of the backend that reads them.
struct AttentionDropout {
  const uint64_t* keys = nullptr;
  int layer = 0;
  float p = 0.0f;
  DGCA_DROPOUT_FN bool on() const { return keys != nullptr && p > 0.0f; }
};

// The dropout of one ForwardBackward, as the model layers receive it: null
// keys (or both rates 0) means no dropout.
struct DropoutSpec {
  const uint64_t* keys = nullptr;  // [B], one per sample row (host or device memory per backend)
  float hidden = 0.0f;
  float attention = 0.0f;
  bool hidden_on() const { return keys != nullptr && hidden > 0.0f; }
  bool attention_on() const { return keys != nullptr && attention > 0.0f; }
};

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_DROPOUT_H_
