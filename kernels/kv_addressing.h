#ifndef KVD_KERNELS_KV_ADDRESSING_H_
#define KVD_KERNELS_KV_ADDRESSING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/params.h"

namespace kvd {

// Host-side address arithmetic and validation for the paged KV arena described by
// KvCacheView / CopyBlocksParams (kernels/params.h), shared by the CPU backend's KV ops:
//
//   chunks[b >> chunk_shift] + region_offset + (b & (blocks_per_chunk - 1)) * block_bytes
//     -> [num_kv_heads][block_size][head_dim]   (one block of one region)
//
// Stateless free functions; thread safe.

// Checks the view's scalar fields: non-null chunk table, positive counts and sizes,
// 0 <= chunk_shift <= 30, a dtype the CPU backend stores (f32, or int8 with its scales),
// block_bytes at least num_kv_heads * block_size * head_dim elements (and, for int8, the
// scales at scale_offset_bytes after them), and offsets that keep fp32 values aligned. `op`
// names the caller in the InvalidArgument / Unimplemented message.
absl::Status ValidateKvCacheView(absl::string_view op, const KvCacheView& view);

// Checks that block id `block` lies inside the arena and its chunk is present.
// `field` names the block's source (e.g. "blocks.indices") in the message.
absl::Status ValidateBlockId(absl::string_view op, absl::string_view field, int64_t block,
                             void* const* chunks, int32_t num_chunks, int32_t chunk_shift);

// Address of block `block` in the region that starts `region_offset_bytes` into its chunk.
// REQUIRES: ValidateBlockId(block) is OK.
inline char* BlockAddress(void* const* chunks, int32_t chunk_shift, int64_t region_offset_bytes,
                          int64_t block_bytes, int64_t block) {
  const int64_t slot = block & ((int64_t{1} << chunk_shift) - 1);
  return static_cast<char*>(chunks[block >> chunk_shift]) + region_offset_bytes +
         slot * block_bytes;
}

// Start of block `block` in the view's K or V region.
// REQUIRES: the view and the block id are valid.
inline char* KeyBlock(const KvCacheView& v, int64_t block) {
  return BlockAddress(v.chunks, v.chunk_shift, v.k_offset_bytes, v.block_bytes, block);
}
inline char* ValueBlock(const KvCacheView& v, int64_t block) {
  return BlockAddress(v.chunks, v.chunk_shift, v.v_offset_bytes, v.block_bytes, block);
}

// Rows of `head` in a block of an f32 view: [block_size][head_dim] floats.
// REQUIRES: 0 <= head < num_kv_heads.
inline float* F32BlockHead(const KvCacheView& v, char* block, int32_t head) {
  return reinterpret_cast<float*>(block) + int64_t{head} * v.block_size * v.head_dim;
}

// An int8 view's rows of `head` in a block ([block_size][head_dim] int8) and their scales
// ([block_size] floats, one a row): row value = int8 * scale.
inline int8_t* Int8BlockHead(const KvCacheView& v, char* block, int32_t head) {
  return reinterpret_cast<int8_t*>(block) + int64_t{head} * v.block_size * v.head_dim;
}
inline float* Int8BlockScales(const KvCacheView& v, char* block, int32_t head) {
  return reinterpret_cast<float*>(block + v.scale_offset_bytes) + int64_t{head} * v.block_size;
}

}  // namespace kvd

#endif  // KVD_KERNELS_KV_ADDRESSING_H_
