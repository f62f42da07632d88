#ifndef KVD_KERNELS_CUDA_RANDOM_FILL_KERNELS_H_
#define KVD_KERNELS_CUDA_RANDOM_FILL_KERNELS_H_

// Launcher for the device-side fill the engine tools need beside the Backend ops: seeded
// random weights and KV contents (random_fill.h). Enqueues on `stream` and returns the
// launch result.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/random_fill.h"
#include "kernels/dtype.h"

namespace kvd::cuda {

// out[i] = dtype(RandomFillValue(fill, i)) for i < count; dtype is kF32 or kBF16 (round to
// nearest even), anything else is cudaErrorInvalidValue.
cudaError_t LaunchRandomFill(void* out, DType dtype, int64_t count, const RandomFill& fill,
                             cudaStream_t stream);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_RANDOM_FILL_KERNELS_H_
