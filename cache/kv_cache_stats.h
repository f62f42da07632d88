#ifndef KVD_CACHE_KV_CACHE_STATS_H_
#define KVD_CACHE_KV_CACHE_STATS_H_

#include <cstdint>
#include <string>

#include "cache/defragmenter.h"

namespace kvd {

// A snapshot of KvCacheManager's gauges and counters (counters only grow).
// Blocks: free + used + cached == total_blocks; pinned_blocks is the part of used_blocks
// held by idle sessions between turns.
struct KvCacheStats {
  // Geometry.
  int32_t block_size = 0;
  int64_t block_bytes = 0;  // one block, all layers, K and V
  int32_t blocks_per_chunk = 0;
  int32_t num_chunks = 0;
  int32_t max_chunks = 0;
  // Gauges.
  int64_t total_blocks = 0;
  int64_t max_blocks = 0;
  int64_t free_blocks = 0;    // refcount 0, no prefix key
  int64_t used_blocks = 0;    // refcount > 0
  int64_t cached_blocks = 0;  // refcount 0 with a prefix key: evictable
  int64_t pinned_blocks = 0;  // held by detached sessions
  // Blocks as their holders see them: every sequence's block table and session chain
  // counted, so block_references - used_blocks is the copies sharing avoids (prefix hits,
  // forks, and idle sessions' pins, which are released under pressure rather than copied);
  // shared_blocks of the used ones have two holders or more.
  int64_t block_references = 0;
  int64_t shared_blocks = 0;
  // Blocks a sequence could get now (KvCacheManager::NumObtainableBlocks): free, evictable
  // cached, room to grow, and those only idle sessions pin (released for room).
  int64_t obtainable_blocks = 0;
  int64_t total_bytes = 0;    // arena bytes held now
  int64_t used_bytes = 0;
  int64_t cached_bytes = 0;
  int64_t max_bytes = 0;
  int32_t num_sequences = 0;
  int32_t num_sessions = 0;
  int64_t num_prefix_keys = 0;
  // Counters.
  // Counted per request's first admission that got its slots (KvCacheManager::Reserve), so
  // not again for attempts undone for want of room, nor for a preempted sequence's return
  // (AddSequence's Admission::kRecompute): every prompt token the engine received is looked
  // up once, and the hits are the prompt tokens it did not compute.
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up
  int64_t prefix_hit_tokens = 0;    // ...found computed in the prefix index
  int64_t session_hit_tokens = 0;   // ...found computed in a session's pinned chain
  // Cached blocks whose prefix keys were dropped: evicted for room, or by defragmentation
  // (cached slots a move takes as its destination, whether the move succeeds or fails) and
  // the release of the top chunk.
  int64_t evictions = 0;
  int64_t session_releases_idle = 0;
  int64_t session_releases_pin_cap = 0;
  int64_t session_releases_closed = 0;
  int64_t session_releases_pressure = 0;  // for room (SessionReleaseReason::kPressure)
  int64_t fork_copies = 0;                // partial blocks copied by Fork
  int64_t chunks_grown = 0;
  int64_t chunks_released = 0;
  // Chunks the arena failed to allocate below max_chunks (device or host memory ran out):
  // the pool stays at its size, evicting instead, until a chunk is released or a retry
  // (growth_retry_interval) adds one, each retry that fails counted too; and the last such
  // error's message ("" before the first).
  int64_t chunk_growth_failures = 0;
  std::string last_growth_error;
  // Whether the arena adds no chunk now, after a failed growth below max_chunks: true from
  // the failure until a chunk is released or a retry adds one (BlockPool::growth_stopped).
  bool chunk_growth_stopped = false;
  int64_t defrag_moves = 0;
  DefragPauseStats defrag_pauses;
};

}  // namespace kvd

#endif  // KVD_CACHE_KV_CACHE_STATS_H_
