#ifndef KVD_CACHE_KV_CACHE_OPTIONS_H_
#define KVD_CACHE_KV_CACHE_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/kv_layout.h"
#include "kernels/dtype.h"

namespace kvd {

// Options of the KV cache. Plain aggregate with defaults; Validate() names the first bad
// key, its value and what is allowed.
struct KvCacheOptions {
  int32_t block_size = 16;       // tokens per block
  DType kv_dtype = DType::kF32;  // the arena stores f32, bf16, fp16 and int8 for now
  // Arena sizes (see KvPoolGeometry for the rounding).
  int64_t initial_pool_bytes = int64_t{64} << 20;
  int64_t max_pool_bytes = int64_t{256} << 20;
  int64_t chunk_bytes = int64_t{16} << 20;
  // Device memory the arena leaves free when it adds a chunk: a chunk that would take the
  // backend's free memory (Backend::QueryDeviceMemory, every process's use counted) below
  // this is refused as a failed growth, so that the engine's buffers, which grow with the
  // batch, still find room. 0 = none; no effect on a backend that cannot say (the CPU).
  int64_t device_headroom_bytes = 0;
  // After a failed growth the arena adds no chunk until one is released (memory that ran out
  // stays out, as a rule), or until this long has passed, when Tick() tries one chunk again:
  // memory another process held may have come back. Measured from the first Tick() after the
  // failure; no try while defragmentation would shrink the pool. Infinite = only after a
  // release.
  absl::Duration growth_retry_interval = absl::InfiniteDuration();
  bool enable_prefix_caching = true;
  std::string eviction_policy = "lru";  // "lru" or "chunk_lru" (eviction_policy.h)
  absl::Duration session_idle_timeout = absl::Seconds(30);
  // Pinned session blocks may use at most this fraction of max_pool_bytes' blocks.
  double max_pinned_fraction = 0.5;
  bool enable_defrag = true;
  int32_t defrag_max_moves_per_step = 32;
  // ...and at most this many bytes copied per step (at least one block), so the pause
  // stays bounded for large blocks on a backend whose copies are synchronous (CPU).
  int64_t defrag_max_bytes_per_step = int64_t{4} << 20;
  double defrag_low_water = 0.5;  // DefragOptions::low_water
  // Least time between two defragmentation steps (Tick() calls in between skip it).
  absl::Duration defrag_interval = absl::ZeroDuration();
  // Pause budget of one step: the moves per step adapt to the measured cost of a move so a
  // pause stays near this (at least one move per step; the caps above still apply).
  absl::Duration defrag_max_pause = absl::Milliseconds(2);
  bool defrag_background_planning = true;
  // Mixed into every prefix key with the KV layout: e.g. a digest of the model's weights,
  // so caches of different models can never match.
  uint64_t prefix_extra_key = 0;
  // The secret mixed into every prefix key (PrefixIndex). Unset, the default: drawn from the
  // OS entropy source per cache. Tests set it (0 gives the unkeyed keys, where crafted
  // collisions are known) to exercise what happens when keys collide.
  std::optional<uint64_t> prefix_key_secret;

  absl::Status Validate() const;
};

// How the byte sizes of KvCacheOptions become whole blocks and chunks:
//   blocks_per_chunk = the largest power of two <= chunk_bytes / block bytes
//                      (InvalidArgument if chunk_bytes is smaller than one block),
//   max_chunks       = floor(max_pool_bytes / actual chunk bytes) (never above the
//                      budget; InvalidArgument if it is smaller than one chunk, or above
//                      kMaxChunks chunks or kMaxBlocks blocks),
//   initial_chunks   = ceil(initial_pool_bytes / actual chunk bytes), at least 1 and at
//                      most max_chunks.
// Block bytes are the arena bytes of one block, all layers, K and V (KvLayout).
struct KvPoolGeometry {
  // Most chunks and most blocks one pool may have (BlockPool refuses more blocks too).
  static constexpr int64_t kMaxChunks = int64_t{1} << 20;
  static constexpr int64_t kMaxBlocks = int64_t{1} << 30;
  // ChunkBytesFor's aims: chunks of at most this many bytes...
  static constexpr int64_t kTargetChunkBytes = int64_t{16} << 20;
  // ...and at least this many of them in a pool, so that rounding the pool down to whole
  // chunks loses less than 1/kMinChunks of it.
  static constexpr int64_t kMinChunks = 16;

  int32_t chunk_shift = 0;
  int32_t initial_chunks = 0;
  int32_t max_chunks = 0;
  int64_t chunk_bytes = 0;  // actual, after rounding

  int32_t blocks_per_chunk() const { return int32_t{1} << chunk_shift; }
  int64_t max_blocks() const { return int64_t{max_chunks} << chunk_shift; }

  // The chunk_bytes for a pool of at most `max_pool_bytes` of blocks of `block_bytes` (the
  // arena bytes of one block), as `kvd serve` picks it: the most blocks, a power of two, that
  // fit in min(kTargetChunkBytes, max_pool_bytes / kMinChunks), but at least one block; then
  // doubled while the pool would have more than kMaxChunks chunks (pools past 16 TiB). For a
  // pool of at most kMaxBlocks blocks the result is a whole chunk as Compute makes it, and the
  // pool loses less than max(max_pool_bytes / kMinChunks, block_bytes) to whole chunks.
  // REQUIRES: max_pool_bytes > 0, block_bytes > 0.
  static int64_t ChunkBytesFor(int64_t max_pool_bytes, int64_t block_bytes);

  // REQUIRES: options.Validate() is OK.
  static absl::StatusOr<KvPoolGeometry> Compute(const KvCacheOptions& options,
                                                const KvLayout& layout);
};

}  // namespace kvd

#endif  // KVD_CACHE_KV_CACHE_OPTIONS_H_
