#ifndef KVD_KERNELS_CUDA_DISPATCH_H_
#define KVD_KERNELS_CUDA_DISPATCH_H_

// Maps runtime sizes and dtypes to compile-time ones for kernel templates. Each macro is an
// expression of type cudaError_t: it binds NAME (a constexpr int, or a type alias) and
// evaluates the trailing expression, or yields cudaErrorInvalidValue for a value no kernel
// is instantiated for. Usage:
//
//   return KVD_DISPATCH_HEAD_DIM(p.cache.head_dim, kHeadDim, Launch<kHeadDim>(p, stream));
//
// Host code in .cu files only.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

// head_dim in {64, 128}.
#define KVD_DISPATCH_HEAD_DIM(value, NAME, ...) \
  [&]() -> cudaError_t {                        \
    switch (value) {                            \
      case 64: {                                \
        constexpr int NAME = 64;                \
        return __VA_ARGS__;                     \
      }                                         \
      case 128: {                               \
        constexpr int NAME = 128;               \
        return __VA_ARGS__;                     \
      }                                         \
      default:                                  \
        return cudaErrorInvalidValue;           \
    }                                           \
  }()

// GQA group size (query heads per KV head) rounded up to the next of {1, 2, 4, 8}; larger
// groups map to 8. The kernel sizes its register arrays for NAME heads, covers a larger
// group in several CTAs of NAME heads each, and masks heads past `value`.
#define KVD_DISPATCH_GROUP_SIZE(value, NAME, ...) \
  [&]() -> cudaError_t {                          \
    if ((value) <= 1) {                           \
      constexpr int NAME = 1;                     \
      return __VA_ARGS__;                         \
    } else if ((value) <= 2) {                    \
      constexpr int NAME = 2;                     \
      return __VA_ARGS__;                         \
    } else if ((value) <= 4) {                    \
      constexpr int NAME = 4;                     \
      return __VA_ARGS__;                         \
    }                                             \
    constexpr int NAME = 8;                       \
    return __VA_ARGS__;                           \
  }()

// Storage element type of a KV cache or weight: kvd::DType::kF32 -> float,
// kvd::DType::kBF16 -> __nv_bfloat16.
#define KVD_DISPATCH_STORAGE_DTYPE(value, NAME, ...) \
  [&]() -> cudaError_t {                             \
    switch (value) {                                 \
      case ::kvd::DType::kF32: {                     \
        using NAME = float;                          \
        return __VA_ARGS__;                          \
      }                                              \
      case ::kvd::DType::kBF16: {                    \
        using NAME = __nv_bfloat16;                  \
        return __VA_ARGS__;                          \
      }                                              \
      default:                                       \
        return cudaErrorInvalidValue;                \
    }                                                \
  }()

#endif  // KVD_KERNELS_CUDA_DISPATCH_H_
