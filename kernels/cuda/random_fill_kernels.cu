#include <cuda_bf16.h>

#include <cfloat>

#include "kernels/cuda/random_fill_kernels.h"

namespace kvd::cuda {
namespace {

constexpr int kFillThreads = 256;

template <typename T>
__device__ T FromFloat(float x);
template <>
__device__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Grid-stride over elements: the grid is capped, so one launch fills any size.
template <typename T>
__global__ void RandomFillKernel(T* __restrict__ out, int64_t count, RandomFill fill) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = FromFloat<T>(RandomFillValue(fill, static_cast<uint64_t>(i)));
  }
}

}  // namespace

cudaError_t LaunchRandomFill(void* out, DType dtype, int64_t count, const RandomFill& fill,
                             cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const int64_t wanted = (count + kFillThreads - 1) / kFillThreads;
  const int blocks = static_cast<int>(wanted < 65536 ? wanted : 65536);
  switch (dtype) {
    case DType::kF32:
      RandomFillKernel<<<blocks, kFillThreads, 0, stream>>>(static_cast<float*>(out), count, fill);
      break;
    case DType::kBF16:
      RandomFillKernel<<<blocks, kFillThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(out), count,
                                                            fill);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kvd::cuda
