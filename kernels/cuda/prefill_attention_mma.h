#ifndef KVD_KERNELS_CUDA_PREFILL_ATTENTION_MMA_H_
#define KVD_KERNELS_CUDA_PREFILL_ATTENTION_MMA_H_

// Tensor-core paged prefill attention for a bf16 KV cache (FlashAttention-2 style), used by
// LaunchPrefillAttention (prefill_attention.h) for bf16 KV. Two kernels, by precision:
//
// kBf16 (prefill_attention_wide.cu; CudaBackend::PagedAttention's choice for batches of at
// least two work items per SM, and on Hopper at head_dim 128, where the items run the wgmma
// kernel below): Q and P rounded to plain bf16, fp32 accumulation, the usual FlashAttention
// trade (errors ~1e-3). Work item = (sequence, KV head, tile of 128 packed query rows),
// packed as in prefill_attention.h (row r -> token r / group, query head
// kv_head * group + r % group), so every K/V tile loaded serves the whole GQA group. A CTA of
// four warps, 32 rows per warp (two m16 tiles sharing every K and V fragment), takes items
// from a work counter, costliest (latest causal) tiles first:
//
//   Q tile -> bf16 in shared memory (scaled to base-2 logits), read by ldmatrix
//   for each K/V tile (32 keys at head_dim 128, 64 at 64; three stages, gathered from the
//   paged arena by cp.async into shared memory, 16-byte chunks XOR-swizzled by row so
//   ldmatrix is conflict-free), skipping tiles past the last row's causal end (per warp):
//     S = Q K^T             mma.m16n8k16 bf16 -> fp32, K through ldmatrix
//     causal / length mask  only on tiles that cross a row's last visible key
//     online softmax        fp32, per row, in registers (base-2 logits, exp2)
//     O += P V              P packed from the S registers, V through ldmatrix.trans
//
// On Hopper (compute capability 9.0) with head_dim 128, kBf16 items run a warpgroup-MMA
// kernel instead (prefill_attention_sm90a.cu): the same items, rows and precision; a producer
// warpgroup gathers 128-key K/V tiles into a ring of shared-memory buffers (and Q rows too,
// where PagedAttentionParams::q_bf16 gives them in bf16), two consumer warpgroups of 64 rows
// take turns on the tensor cores (wgmma) and run the softmax. The other kernels read fp32 Q.
//
// kSplit (this file's .cu; the backend's choice, where the wgmma kernel does not run, for
// batches of fewer than two kBf16 work items per SM): 64-row items, 16 rows per warp, Q's bf16 high
// part in registers and its residual in shared memory; Q and P are each rounded to a bf16 high part
// plus a bf16 residual and every product is two MMAs, which keeps ~16 significant bits (results
// within ~1e-6 of fp32 math).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/params.h"

namespace kvd::cuda {

enum class MmaPrecision : int32_t { kSplit = 0, kBf16 = 1 };

// Packed query rows per work item of the kernel for `precision`.
inline constexpr int MmaPrefillTileRows(MmaPrecision precision) {
  return precision == MmaPrecision::kSplit ? 64 : 128;
}

// Enqueues the attention kernel for the items counted in `tile_indptr` (per sequence,
// CeilDiv(q_len * group, MmaPrefillTileRows(precision)) * num_kv_heads; 0 for decodes), as
// prefill_attention.h's planning kernel writes it just before on `stream`. tile_indptr[0]
// must be 0: the kBf16 kernel uses it as its work counter (the value afterwards is
// unspecified).
// REQUIRES: p.cache.dtype bf16; the rest as LaunchPrefillAttention; `max_ctas` >= 1 caps the
// grid (kSplit: also capped at what fits on the device at once; kBf16: CTAs past the resident
// ones find the counter exhausted and exit).
// `allow_wgmma` false keeps kBf16 on the wide kernel where the Hopper one would run (tests
// and benchmarks compare the two).
cudaError_t LaunchPrefillAttentionMma(const PagedAttentionParams& p, int32_t* tile_indptr,
                                      int max_ctas, MmaPrecision precision, cudaStream_t stream,
                                      bool allow_wgmma = true);

// The kBf16 kernel alone (prefill_attention_wide.cu), launched as a programmatic dependent of
// the planning kernel. REQUIRES: as LaunchPrefillAttentionMma.
cudaError_t LaunchPrefillAttentionWide(const PagedAttentionParams& p, int32_t* tile_indptr,
                                       int max_ctas, cudaStream_t stream);

// The kBf16 kernel for Hopper (prefill_attention_sm90a.cu), a programmatic dependent of the
// planning kernel; at most one CTA per multiprocessor. Reads p.q_bf16 in place of p.q when it
// is given, 16-byte aligned, with q_bf16_stride a multiple of 8 (and >= num_q_heads * 128),
// and sm_scale is positive and finite. REQUIRES: as LaunchPrefillAttentionMma,
// head_dim 128, HopperPrefillSupported() (elsewhere the launch fails: no kernel image).
// cudaErrorNotSupported, launching nothing, where the compiled kernel holds fewer registers
// than its warpgroups' budgets need (LaunchPrefillAttentionMma then runs the wide kernel).
cudaError_t LaunchPrefillAttentionHopper(const PagedAttentionParams& p, int32_t* tile_indptr,
                                         int max_ctas, cudaStream_t stream);

// Whether the current device runs sm_90a code (compute capability 9.0 exactly).
bool HopperPrefillSupported();

// The one head_dim the Hopper kernel is built for.
inline constexpr int kHopperPrefillHeadDim = 128;

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_PREFILL_ATTENTION_MMA_H_
