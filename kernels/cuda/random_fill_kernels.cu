#include <cuda_bf16.h>

#include <cfloat>

#include "kernels/cuda/random_fill_kernels.h"

namespace kvd::cuda {
namespace {

constexpr int kFillThreads = 256;
constexpr int kArgmaxThreads = 512;

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

// (value, index) that wins: larger value, then lower index; NaN loses to any number.
__device__ bool Better(float v, int32_t i, float best, int32_t best_i) {
  if (isnan(v)) return false;
  if (isnan(best)) return true;
  return v > best || (v == best && i < best_i);
}

__global__ void ArgmaxRowsKernel(const float* __restrict__ in, int32_t cols,
                                 int32_t* __restrict__ ids) {
  const float* row = in + int64_t{blockIdx.x} * cols;
  float best = NAN;
  int32_t best_i = 0;
  for (int32_t i = threadIdx.x; i < cols; i += blockDim.x) {
    if (Better(row[i], i, best, best_i)) {
      best = row[i];
      best_i = i;
    }
  }
  // Warp reduction, then across warps through shared memory.
  for (int offset = 16; offset > 0; offset /= 2) {
    const float v = __shfl_down_sync(0xFFFFFFFFu, best, offset);
    const int32_t i = __shfl_down_sync(0xFFFFFFFFu, best_i, offset);
    if (Better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  __shared__ float warp_best[kArgmaxThreads / 32];
  __shared__ int32_t warp_index[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    warp_best[warp] = best;
    warp_index[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (Better(warp_best[w], warp_index[w], best, best_i)) {
        best = warp_best[w];
        best_i = warp_index[w];
      }
    }
    ids[blockIdx.x] = best_i;
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

cudaError_t LaunchArgmaxRows(const float* in, int32_t rows, int32_t cols, int32_t* ids,
                             cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cols <= 0) return cudaErrorInvalidValue;
  ArgmaxRowsKernel<<<rows, kArgmaxThreads, 0, stream>>>(in, cols, ids);
  return cudaGetLastError();
}

}  // namespace kvd::cuda
