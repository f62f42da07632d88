#include "kernels/dtype.h"

#include <cmath>
#include <cstring>

namespace kvd {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "fp16";
    case DType::kFp8E4M3:
      return "fp8";
    case DType::kInt8:
      return "int8";
    case DType::kInt4:
      return "int4";
  }
  return "unknown";
}

std::optional<DType> ParseDType(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::kF16;
  if (name == "fp8" || name == "fp8_e4m3") return DType::kFp8E4M3;
  if (name == "int8") return DType::kInt8;
  if (name == "int4") return DType::kInt4;
  return std::nullopt;
}

uint16_t Bf16Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stay quiet NaN
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace kvd
