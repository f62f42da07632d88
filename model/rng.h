#ifndef KVD_MODEL_RNG_H_
#define KVD_MODEL_RNG_H_

#include <cstdint>

namespace kvd {

// A small deterministic PRNG with a fully specified output, so a seed gives the same
// stream on every platform and a CUDA kernel can reproduce it bit for bit:
//
//   state: four uint64 words s[0..3], filled by four successive splitmix64 outputs of seed
//     splitmix64: x += 0x9E3779B97F4A7C15; z = x;
//                 z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//                 z = (z ^ (z >> 27)) * 0x94D049BB133111EB;  return z ^ (z >> 31)
//   NextU64: xoshiro256** (Blackman & Vigna): result = rotl(s[1] * 5, 7) * 9, then
//     t = s[1] << 17; s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t;
//     s[3] = rotl(s[3], 45)
//   NextFloat: (NextU64() >> 40) * 2^-24, a float in [0, 1) on a grid of 2^-24.
//
// Value type; not thread safe (one per request).
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& word : s_) {
      x += 0x9E3779B97F4A7C15ull;
      uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      word = z ^ (z >> 31);
    }
  }

  uint64_t NextU64() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1): the top 24 bits of NextU64() scaled by 2^-24 (exact in float).
  float NextFloat() { return static_cast<float>(NextU64() >> 40) * 0x1.0p-24f; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t s_[4];
};

}  // namespace kvd

#endif  // KVD_MODEL_RNG_H_
