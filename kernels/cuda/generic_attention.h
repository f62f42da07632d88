#ifndef KVD_KERNELS_CUDA_GENERIC_ATTENTION_H_
#define KVD_KERNELS_CUDA_GENERIC_ATTENTION_H_

// A simple paged attention kernel for head sizes the fast kernels (decode_attention.h,
// prefill_attention.h: head_dim 64 and 128) do not cover, e.g. stories260K's head_dim 8,
// so small real models run end to end on the GPU. Correct for any mix of prefill chunks
// and decodes, causal or not, GQA; not fast: one CTA per (sequence, query head), whose
// warps each walk one query row's keys in order with an online softmax. Same semantics as
// Backend::PagedAttention (kernels/params.h).

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_support.h"  // kGenericAttentionMaxHeadDim
#include "kernels/params.h"

namespace kvd::cuda {

// Also the int8 cache's only kernel yet, for head sizes up to 32 and the fast kernels' 64 and
// 128 (CudaBackend refuses the others, as for every dtype; the kernel itself takes any up to
// kGenericAttentionMaxInt8HeadDim).
//
// REQUIRES (validated by the caller): KV dtype f32, bf16 or int8, 0 < head_dim <=
// kGenericAttentionMaxInt8HeadDim, num_q_heads a multiple of num_kv_heads, at most 65535
// query heads. cudaErrorInvalidValue for a longer head or another dtype.
cudaError_t LaunchGenericAttention(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_GENERIC_ATTENTION_H_
