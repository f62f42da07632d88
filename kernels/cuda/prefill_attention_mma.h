#ifndef KVD_KERNELS_CUDA_PREFILL_ATTENTION_MMA_H_
#define KVD_KERNELS_CUDA_PREFILL_ATTENTION_MMA_H_

// Tensor-core paged prefill attention for a bf16 KV cache (FlashAttention-2 style), used by
// LaunchPrefillAttention (prefill_attention.h) for bf16 KV.
//
// Work item = (sequence, KV head, tile of kMmaPrefillTileRows packed query rows), packed as
// in prefill_attention.h (row r -> token r / group, query head kv_head * group + r % group),
// so every K/V tile loaded serves the whole GQA group. A CTA of four warps, 16 rows per
// warp, walks the items of a persistent grid, costliest (latest causal) tiles first:
//
//   for each 64-key tile (double-buffered, gathered from the paged arena by cp.async into
//   shared memory, 16-byte chunks XOR-swizzled by key so ldmatrix is conflict-free):
//     S = Q K^T             mma.m16n8k16 bf16 -> fp32, Q fragments held in registers
//     causal / length mask  only on tiles that cross a row's last visible key
//     online softmax        fp32, per row, in registers (base-2 logits)
//     O += P V              P from the S registers, V through ldmatrix.trans
//
// Precision: the KV values are exact in bf16, but Q (fp32 in the params) and P are not.
// kSplit rounds each of them to a bf16 high part plus a bf16 residual and issues two MMAs,
// which keeps ~16 significant bits (results within ~1e-6 of fp32 math, what the tests
// against the CPU reference require); kBf16 rounds them to plain bf16 (the usual
// FlashAttention trade: half the tensor-core work, errors ~1e-3).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/params.h"

namespace kvd::cuda {

// Packed query rows per work item of the tensor-core kernel.
inline constexpr int kMmaPrefillTileRows = 64;

enum class MmaPrecision : int32_t { kSplit = 0, kBf16 = 1 };

// Enqueues the attention kernel for the items counted in `tile_indptr` (per sequence,
// CeilDiv(q_len * group, kMmaPrefillTileRows) * num_kv_heads; 0 for decodes).
// REQUIRES: p.cache.dtype bf16; the rest as LaunchPrefillAttention; `max_ctas` >= 1 caps the
// persistent grid (it is also capped at what fits on the device at once).
cudaError_t LaunchPrefillAttentionMma(const PagedAttentionParams& p, const int32_t* tile_indptr,
                                      int max_ctas, MmaPrecision precision, cudaStream_t stream);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_PREFILL_ATTENTION_MMA_H_
