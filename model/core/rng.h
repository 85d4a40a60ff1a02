// Small deterministic random number generators of our own: their output is
// the same on every platform and standard library (std::*_distribution is
// not), which checkpoints, resume and cross-rank equivalence rely on.
//
// Thread-safety: values; one generator per thread.
#ifndef DGCA_MODEL_CORE_RNG_H_
#define DGCA_MODEL_CORE_RNG_H_

#include <cmath>
#include <cstdint>

namespace dgca {

// splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, full period.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 bits.
  double NextDouble() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform in [0, n) for n > 0 (Lemire's multiply-shift; bias < n / 2^64).
  uint64_t NextBelow(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }
  // Standard normal: Box-Muller (cosine branch) from two NextDouble draws.
  double NextNormal() {
    const double u1 = 1.0 - NextDouble();  // (0, 1]: log is finite
    const double u2 = NextDouble();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

// Mixes several keys into one seed (order matters): used for RNG streams
// keyed by (seed, epoch, sample index) and the like.
inline uint64_t MixSeed(uint64_t a, uint64_t b) {
  SplitMix64 s(a ^ (b * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull));
  s.Next();
  return s.Next();
}
inline uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) { return MixSeed(MixSeed(a, b), c); }
inline uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return MixSeed(MixSeed(MixSeed(a, b), c), d);
}

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_RNG_H_
