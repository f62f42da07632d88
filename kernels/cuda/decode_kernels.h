#ifndef KVD_KERNELS_CUDA_DECODE_KERNELS_H_
#define KVD_KERNELS_CUDA_DECODE_KERNELS_H_

// The two decode attention kernels behind LaunchDecodeAttention (decode_attention.h), for
// decode_attention.cu: the same contract, workspace and split plan; each enqueues one
// kernel launch and returns its error.

#include <cuda_runtime_api.h>

#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/kv_row_map.h"
#include "kernels/params.h"

namespace kvd::cuda {

// CUDA cores, any supported KV dtype (f32 or bf16), head_dim 64 or 128, any GQA group.
cudaError_t LaunchDecodeSimt(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                             cudaStream_t stream);

// Keys a split of LaunchDecodeSimt's kernel starts on a multiple of (its split granule,
// PlanSplits) for these sizes; 0 for sizes it does not run.
int DecodeSimtSplitGranule(DType dtype, int head_dim, int group_size);

// Tensor cores, bf16 KV, head_dim 64 or 128, any GQA group (subgroups of 8 heads). With a
// non-empty `rows_map` at head_dim 128, K and V go through its TMA boxes where they can; with
// `ws.trace` set too, in the traced instantiation (LaunchDecodeAttention refuses a trace in
// any other case, so none reaches here).
cudaError_t LaunchDecodeMma(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                            cudaStream_t stream, const KvRowMap* rows_map);

// LaunchDecodeMma's split granule at head_dim 64 or 128 (the same with TMA boxes or
// without); 0 for other head sizes.
int DecodeMmaSplitGranule(int head_dim);

// Benchmark only: the tensor-core kernel at head_dim 128 under launch shape `shape`:
// 0 4 warps, 3 stages, 2 CTAs per SM, cp.async; 1 8 warps and 1 CTA per SM; 2 shape 0 with
// an L2::128B prefetch hint; 3 TMA boxes (needs a non-empty rows_map), 2 stages. Sets
// *name; cudaErrorInvalidValue otherwise.
cudaError_t LaunchDecodeMmaShape(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                 int shape, const KvRowMap* rows_map, cudaStream_t stream,
                                 const char** name);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_DECODE_KERNELS_H_
