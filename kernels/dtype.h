#ifndef KVD_KERNELS_DTYPE_H_
#define KVD_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvd {

// Element types of weights and KV cache storage. The CPU reference backend computes in
// fp32 throughout; narrower types are storage formats the CUDA backend and the KV
// quantization paths use.
enum class DType : int32_t {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
  kFp8E4M3 = 3,
  kInt8 = 4,
  kInt4 = 5,
};

// Bits per stored element (int4 is 4, so sizes of int4 buffers are computed in bits).
constexpr int DTypeBits(DType t) {
  switch (t) {
    case DType::kF32:
      return 32;
    case DType::kBF16:
    case DType::kF16:
      return 16;
    case DType::kFp8E4M3:
    case DType::kInt8:
      return 8;
    case DType::kInt4:
      return 4;
  }
  return 0;
}

// "f32", "bf16", "fp16", "fp8", "int8", "int4".
std::string_view DTypeName(DType t);

// Inverse of DTypeName; also accepts "fp32", "float32", "float16", "f16", "fp8_e4m3".
std::optional<DType> ParseDType(std::string_view name);

// `x` rounded to the nearest bf16 (ties to even, as CUDA's __float2bfloat16_rn), as its bits;
// a NaN stays a (quiet) NaN.
uint16_t Bf16Bits(float x);

}  // namespace kvd

#endif  // KVD_KERNELS_DTYPE_H_
