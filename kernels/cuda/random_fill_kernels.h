#ifndef KVD_KERNELS_CUDA_RANDOM_FILL_KERNELS_H_
#define KVD_KERNELS_CUDA_RANDOM_FILL_KERNELS_H_

// Launchers for the device-side fills and reductions the engine tools need beside the
// Backend ops: seeded random weights and KV contents (random_fill.h) and greedy argmax.
// Each enqueues on `stream` and returns the launch result.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/random_fill.h"
#include "kernels/dtype.h"

namespace kvd::cuda {

// out[i] = dtype(RandomFillValue(fill, i)) for i < count; dtype is kF32 or kBF16 (round to
// nearest even), anything else is cudaErrorInvalidValue.
cudaError_t LaunchRandomFill(void* out, DType dtype, int64_t count, const RandomFill& fill,
                             cudaStream_t stream);

// ids[r] = the index of the largest of in[r][0..cols) (the lowest such index on ties; NaN
// never wins unless the whole row is NaN, then 0). One CTA per row.
cudaError_t LaunchArgmaxRows(const float* in, int32_t rows, int32_t cols, int32_t* ids,
                             cudaStream_t stream);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_RANDOM_FILL_KERNELS_H_
