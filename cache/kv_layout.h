#ifndef KVD_CACHE_KV_LAYOUT_H_
#define KVD_CACHE_KV_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace kvd {

// The attention shape that decides KV size (d_model and query heads do not matter).
struct KvShape {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

// KvLayout computes every byte of the paged KV cache for one model shape, storage dtype
// and block size. A block holds `block_size` tokens of K and V for every layer. A chunk of
// the arena holds `blocks_per_chunk` blocks in 2 * num_layers regions (kernels/params.h):
//
//   chunk:  | L0 K | L0 V | L1 K | L1 V | ... | L(n-1) K | L(n-1) V |
//   region: [blocks_per_chunk] blocks of region_block_bytes()
//   block:  [num_kv_heads][block_size][head_dim] elements of dtype, then (quantized dtypes)
//           the scales of those elements at region_scale_offset_bytes()
//
// A quantized block carries its own scales, so that everything that moves or frees a block
// (copy-on-write, defragmentation, eviction, a released chunk) moves or frees its scales
// with it, through the one chunk table. Per block and region:
//   int8:       one fp32 scale per KV head and token, [num_kv_heads][block_size]
//                                                            -> 4 * H * block_size bytes
//   fp8 (e4m3): one fp32 scale per KV head                   -> 4 * H bytes
//   int4:       per KV head, token and group of kInt4GroupSize values along head_dim
//               (whole head_dim if smaller), an fp16 scale and an fp16 zero point
//                                                            -> 4 * H * block_size * groups
//   f32, bf16, fp16: none.
// A quantized block's scales start, and its slot ends, on a 16-byte boundary (kernels load
// 16 bytes at a time); an unquantized block is its element data exactly.
//
// Immutable value type; thread safe.
class KvLayout {
 public:
  static constexpr int32_t kInt4GroupSize = 32;
  static constexpr int64_t kQuantizedAlignment = 16;

  // InvalidArgument for non-positive sizes, for a head that is not a whole number of
  // bytes, or (int4) a head_dim not divisible by its group size.
  static absl::StatusOr<KvLayout> Create(const KvShape& shape, DType dtype, int32_t block_size);

  const KvShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int32_t block_size() const { return block_size_; }
  int32_t num_layers() const { return shape_.num_layers; }
  int32_t num_regions() const { return 2 * shape_.num_layers; }
  bool quantized() const { return region_block_scale_bytes_ > 0; }

  // One block of one region (one layer's K or V): its slot in the arena, element data,
  // scales and padding.
  int64_t region_block_bytes() const { return region_block_bytes_; }
  // ...its element data alone, and its scales alone (0 for unquantized dtypes).
  int64_t region_block_data_bytes() const { return region_block_data_bytes_; }
  int64_t region_block_scale_bytes() const { return region_block_scale_bytes_; }
  // Where the scales start inside the block's slot (its element data's end, rounded up).
  int64_t region_scale_offset_bytes() const { return region_scale_offset_bytes_; }
  // One whole block, all layers, K and V: arena bytes (what the pool counts), and of them
  // element data and scales.
  int64_t block_bytes() const { return region_block_bytes_ * num_regions(); }
  int64_t block_data_bytes() const { return region_block_data_bytes_ * num_regions(); }
  int64_t block_scale_bytes() const { return region_block_scale_bytes_ * num_regions(); }

  // K and V of one token over all layers, element data only: 2 * L * H * D * bytes(dtype).
  int64_t data_bytes_per_token() const { return block_data_bytes() / block_size_; }
  // Arena bytes per token: a block's bytes over its tokens (fractional for fp8's scales).
  double bytes_per_token() const { return static_cast<double>(block_bytes()) / block_size_; }

  // Offsets inside a chunk of `blocks_per_chunk` blocks. REQUIRES: 0 <= layer < num_layers.
  int64_t region_bytes(int32_t blocks_per_chunk) const {
    return region_block_bytes_ * blocks_per_chunk;
  }
  int64_t chunk_bytes(int32_t blocks_per_chunk) const {
    return region_bytes(blocks_per_chunk) * num_regions();
  }
  int64_t k_offset_bytes(int32_t layer, int32_t blocks_per_chunk) const {
    return region_bytes(blocks_per_chunk) * (2 * layer);
  }
  int64_t v_offset_bytes(int32_t layer, int32_t blocks_per_chunk) const {
    return region_bytes(blocks_per_chunk) * (2 * layer + 1);
  }

  // Blocks needed for `num_tokens` tokens (ceil).
  int64_t BlocksForTokens(int64_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // A 64-bit digest of shape, dtype and block size: the "extra key" that keeps prefix
  // keys of differently laid out caches apart.
  uint64_t Fingerprint() const;

  // e.g. "32 layers x 8 KV heads x 128 head_dim, bf16, 16 tokens/block".
  std::string DebugString() const;

 private:
  KvLayout() = default;

  KvShape shape_;
  DType dtype_ = DType::kF32;
  int32_t block_size_ = 0;
  int64_t region_block_bytes_ = 0;
  int64_t region_block_data_bytes_ = 0;
  int64_t region_block_scale_bytes_ = 0;
  int64_t region_scale_offset_bytes_ = 0;
};

}  // namespace kvd

#endif  // KVD_CACHE_KV_LAYOUT_H_
