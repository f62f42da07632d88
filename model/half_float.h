#ifndef KVD_MODEL_HALF_FLOAT_H_
#define KVD_MODEL_HALF_FLOAT_H_

// IEEE half precision and bfloat16 bit patterns as fp32 (exact: every value of both fits),
// for the loaders of checkpoints stored in them (GGUF, safetensors).

#include <bit>
#include <cstdint>

namespace kvd {

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {  // infinity or NaN
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: shift the leading one into the implicit bit
    int shift = 0;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | static_cast<uint32_t>(127 - 15 + 1 - shift) << 23 | ((mantissa & 0x3FF) << 13);
  }
  return std::bit_cast<float>(bits);
}

inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

}  // namespace kvd

#endif  // KVD_MODEL_HALF_FLOAT_H_
