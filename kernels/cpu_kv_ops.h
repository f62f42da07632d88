#ifndef KVD_KERNELS_CPU_KV_OPS_H_
#define KVD_KERNELS_CPU_KV_OPS_H_

#include "absl/status/status.h"
#include "kernels/params.h"
#include "kernels/thread_pool.h"

namespace kvd {

// The CPU backend's writes into the paged KV arena (layout in kernels/params.h and
// kernels/kv_addressing.h). Both validate every block id before writing anything, so a
// non-OK status means the arena is unchanged. Thread safe if `pool` is and callers write
// disjoint blocks.

// For token t with slot = slot_mapping[t], block = slot / block_size and
// offset = slot % block_size: K row t's head h goes to K region of `block`, head h, row
// `offset` (V likewise); a token whose slot is kNoSlot (-1, a padding row) is skipped.
// InvalidArgument for any other negative slot, a block outside the arena or
// in a null chunk, null pointers, strides narrower than num_kv_heads * head_dim or a bad
// view; Unimplemented for a cache dtype other than f32 and int8. An int8 cache stores each
// row quantized with its scale (kernels/kv_quant.h). num_tokens == 0 is a no-op.
absl::Status CpuAppendKv(const AppendKvParams& p, ThreadPool& pool);

// CpuAppendKv's checks alone: OK exactly when CpuAppendKv would accept `p`.
absl::Status ValidateAppendKv(const AppendKvParams& p);

// Copies block src[i] to dst[i] in every one of num_regions regions (each layer's K and
// V), block_bytes each. InvalidArgument, before anything is copied, for null pointers,
// non-positive sizes, a region that cannot hold (1 << chunk_shift) blocks, or a negative id
// or one in a null chunk. num_pairs == 0 is a no-op. REQUIRES (not checked): no block is
// both a source and a destination; every id < (length of the chunk table) << chunk_shift,
// because CopyBlocksParams does not carry the table's length.
absl::Status CpuCopyBlocks(const CopyBlocksParams& p, ThreadPool& pool);

}  // namespace kvd

#endif  // KVD_KERNELS_CPU_KV_OPS_H_
