#ifndef KVD_KERNELS_CUDA_KV_CACHE_KERNELS_H_
#define KVD_KERNELS_CUDA_KV_CACHE_KERNELS_H_

// Launchers for the kernels that write the paged KV arena (kernels/params.h). The chunk
// table (`chunks`) and every other pointer are device memory. Callers validate; these
// enqueue on `stream` and return the launch result.

#include <cuda_runtime_api.h>

#include "kernels/params.h"

namespace kvd::cuda {

// Converts each token's fp32 K and V rows to the cache dtype (f32 or bf16, round to
// nearest even) and stores them at its slot. Tokens with a negative slot are skipped.
cudaError_t LaunchAppendKv(const AppendKvParams& p, cudaStream_t stream);

// Copies block src[i] to dst[i] in every region; 16-byte moves when every size and offset
// allows, bytes otherwise.
cudaError_t LaunchCopyBlocks(const CopyBlocksParams& p, cudaStream_t stream);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_KV_CACHE_KERNELS_H_
