#ifndef KVD_KERNELS_CUDA_PREFILL_ATTENTION_H_
#define KVD_KERNELS_CUDA_PREFILL_ATTENTION_H_

// Paged prefill attention: the sequences of a PagedAttentionParams batch with two or more
// query rows (a prefill chunk over its cached prefix plus itself; decodes are left to the
// decode kernel). Causal or not, as the params say.
//
// The query rows of a sequence and KV head are packed as (token, head-in-group) pairs, so
// one tile of packed rows shares every K/V tile it loads across its GQA group:
//
//   packed row r -> token r / group, query head kv_head * group + r % group
//
// A planning kernel counts tiles per sequence into `tile_indptr` (device scratch of
// num_seqs + 1 ints; [0] doubles as the plain-bf16 kernel's work counter); the attention
// grid then walks the (sequence, KV head, tile) items, longest causal tiles first (a work
// counter in plain-bf16 mode, a persistent grid otherwise). No host synchronization, so the
// launch can be captured in a CUDA graph.
//
//   bf16 KV: a tensor-core kernel of prefill_attention_mma.h, 128 packed rows per tile in
//            plain-bf16 mode (64 in split mode).
//   f32 KV:  an fp32 kernel (32 packed rows per tile, 32-key tiles staged in shared memory,
//            online softmax in fp32), kept for exact comparisons with the CPU reference.
//
// Supported: head_dim 64 or 128, KV dtype f32 or bf16, block_size a power of two, K/V
// region offsets, block_bytes and chunk bases multiples of 16 bytes. The caller checks.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/prefill_attention_mma.h"
#include "kernels/params.h"

namespace kvd::cuda {

// Enqueues the planning kernel (one CTA scanning the batch) and the attention kernel.
// `num_ctas` caps the grid (e.g. a few per multiprocessor). `precision` picks the bf16 kernel's
// treatment of Q and P (prefill_attention_mma.h); the f32 kernel ignores it, and
// `allow_wgmma` (false: no Hopper kernel, prefill_attention_mma.h).
cudaError_t LaunchPrefillAttention(const PagedAttentionParams& p, int32_t* tile_indptr,
                                   int num_ctas, cudaStream_t stream,
                                   MmaPrecision precision = MmaPrecision::kSplit,
                                   bool allow_wgmma = true);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_PREFILL_ATTENTION_H_
