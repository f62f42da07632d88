#include "cache/kv_cache_options.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvd {

absl::Status KvCacheOptions::Validate() const {
  if (block_size <= 0 || block_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size: must be in [1, 4096], got ", block_size));
  }
  if (initial_pool_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial_pool_bytes: must be positive, got ", initial_pool_bytes));
  }
  if (max_pool_bytes < initial_pool_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_pool_bytes: must be >= initial_pool_bytes (", initial_pool_bytes,
                     "), got ", max_pool_bytes));
  }
  if (chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: must be positive, got ", chunk_bytes));
  }
  if (device_headroom_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_headroom_bytes: must be >= 0, got ", device_headroom_bytes));
  }
  if (growth_retry_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("growth_retry_interval: must be > 0, got ",
                                                   absl::FormatDuration(growth_retry_interval)));
  }
  if (eviction_policy != "lru" && eviction_policy != "chunk_lru") {
    return absl::InvalidArgumentError(absl::StrCat("eviction_policy: unknown value \"",
                                                   eviction_policy, "\"; allowed: lru, chunk_lru"));
  }
  if (session_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("session_idle_timeout: must be >= 0, got ",
                                                   absl::FormatDuration(session_idle_timeout)));
  }
  if (!(max_pinned_fraction >= 0.0 && max_pinned_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_pinned_fraction: must be in [0, 1], got ", max_pinned_fraction));
  }
  if (defrag_max_moves_per_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("defrag_max_moves_per_step: must be >= 1, got ", defrag_max_moves_per_step));
  }
  if (defrag_max_bytes_per_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("defrag_max_bytes_per_step: must be >= 1, got ", defrag_max_bytes_per_step));
  }
  if (defrag_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("defrag_interval: must be >= 0, got ",
                                                   absl::FormatDuration(defrag_interval)));
  }
  if (defrag_max_pause <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("defrag_max_pause: must be > 0, got ",
                                                   absl::FormatDuration(defrag_max_pause)));
  }
  if (!(defrag_low_water >= 0.0 && defrag_low_water <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("defrag_low_water: must be in [0, 1], got ", defrag_low_water));
  }
  return absl::OkStatus();
}

int64_t KvPoolGeometry::ChunkBytesFor(int64_t max_pool_bytes, int64_t block_bytes) {
  // Chunks are the unit of growth and of return: not too large (a pool grows and shrinks
  // by one at a time), not so large that a small pool rounds down by a large part of
  // itself (10 MiB chunks of stories260K once made a 64 MiB pool 60 MiB, and one just under
  // 20 MiB 10 MiB), not more than kMaxChunks of them.
  const int64_t aim = std::min(kTargetChunkBytes, max_pool_bytes / kMinChunks);
  int64_t chunk_bytes = block_bytes;
  while (chunk_bytes <= aim / 2) chunk_bytes *= 2;
  while (max_pool_bytes / chunk_bytes > kMaxChunks) chunk_bytes *= 2;
  return chunk_bytes;
}

absl::StatusOr<KvPoolGeometry> KvPoolGeometry::Compute(const KvCacheOptions& options,
                                                       const KvLayout& layout) {
  const int64_t block_bytes = layout.block_bytes();
  if (options.chunk_bytes < block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("chunk_bytes: %d is smaller than one KV block (%d bytes for %s)",
                        options.chunk_bytes, block_bytes, layout.DebugString()));
  }
  KvPoolGeometry g;
  const int64_t blocks = options.chunk_bytes / block_bytes;
  while (g.chunk_shift < 24 && (int64_t{2} << g.chunk_shift) <= blocks) ++g.chunk_shift;
  g.chunk_bytes = block_bytes << g.chunk_shift;
  const int64_t max_chunks = options.max_pool_bytes / g.chunk_bytes;
  if (max_chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_pool_bytes: %d is smaller than one chunk (%d bytes)",
                        options.max_pool_bytes, g.chunk_bytes));
  }
  if (max_chunks > kMaxChunks || (max_chunks << g.chunk_shift) > kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_pool_bytes: %d makes %d chunks of %d bytes, %d KV blocks of %d bytes; allowed: at "
        "most %d chunks and %d blocks",
        options.max_pool_bytes, max_chunks, g.chunk_bytes, max_chunks << g.chunk_shift, block_bytes,
        kMaxChunks, kMaxBlocks));
  }
  g.max_chunks = static_cast<int32_t>(max_chunks);
  // Rounded up without adding first: initial_pool_bytes may be as large as int64 allows.
  const int64_t initial = options.initial_pool_bytes / g.chunk_bytes +
                          (options.initial_pool_bytes % g.chunk_bytes != 0 ? 1 : 0);
  g.initial_chunks = static_cast<int32_t>(std::clamp<int64_t>(initial, 1, g.max_chunks));
  return g;
}

}  // namespace kvd
