#ifndef KVD_CACHE_BLOCK_POOL_H_
#define KVD_CACHE_BLOCK_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/block_links.h"
#include "cache/eviction_policy.h"
#include "cache/kv_arena.h"

namespace kvd {

// BlockPool owns KV block ids, their reference counts and the free lists; it knows
// nothing of requests (KvCacheManager does) or of keys (PrefixIndex does: the pool only
// knows whether a block is "cached", i.e. carries a prefix key).
//
// Every present block is in exactly one state:
//   used    refcount > 0 (it may also be cached: a shared, keyed block)
//   cached  refcount 0 and keyed: evictable, held in the EvictionPolicy's list
//   free    refcount 0 and not keyed: in its chunk's free list
// so free + used + cached == num_blocks() always.
//
// Some of a used block's holders may be pins: references an idle multi-turn session keeps
// and lets go when the pool needs room. The pool counts them per block so that the blocks
// held by pins alone (room that releasing sessions would give back) are counted in O(1).
//
// Allocate() takes a free block from the lowest chunk that has one (so live blocks
// gather low and the top chunk can drain), else grows the arena by a chunk while below
// max_chunks, else evicts the policy's victim (calling on_evict so the owner drops its
// key). Ids are dense: chunk c owns [c << chunk_shift, (c + 1) << chunk_shift); growth
// adds chunk num_chunks(), and only the top chunk can be released.
//
// Not thread safe: the engine thread only. The destructor checks that every block came
// back (no block is used). Does not own the arena (may be null: ids only, for benchmarks
// and tests), which must outlive the pool.
class BlockPool {
 public:
  struct Options {
    int32_t chunk_shift = 10;  // log2(blocks per chunk)
    int32_t initial_chunks = 1;
    int32_t max_chunks = 1;
  };
  // Called with a cached block, refcount 0, when the pool drops its key (eviction, or the
  // release of its chunk). The block is no longer cached when it runs.
  using EvictCallback = std::function<void(BlockId)>;

  // InvalidArgument for inconsistent options or an arena of another chunk geometry; the
  // arena's error if the initial chunks cannot be allocated.
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(const Options& options,
                                                           std::unique_ptr<EvictionPolicy> policy,
                                                           KvArena* arena, EvictCallback on_evict);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block with refcount 1, not cached; nullopt when nothing is free, the arena cannot
  // grow and nothing is evictable.
  std::optional<BlockId> Allocate();
  // One more holder. REQUIRES: b is used, or cached (a prefix hit revives it).
  void Acquire(BlockId b);
  // One fewer holder; at 0 the block goes to the eviction list if cached, else to its
  // chunk's free list. REQUIRES: b has a holder that is not a pin (Unpin first).
  void Release(BlockId b);
  // Marks one of b's holders as a pin. REQUIRES: b has a holder that is not a pin.
  void Pin(BlockId b);
  // The pin becomes an ordinary holder again. REQUIRES: b has a pin.
  void Unpin(BlockId b);
  // Records that b now carries a prefix key. REQUIRES: b is used and not cached.
  void MarkCached(BlockId b);
  // Drops the key of a cached, unused block now (on_evict runs); it becomes free.
  void Evict(BlockId b);
  // Defragmentation: dst takes over src's holders (pins included) and key; src becomes
  // free. The caller copies the bytes and rewrites every table naming src. REQUIRES: src
  // used, dst free, src != dst.
  void Move(BlockId src, BlockId dst);

  // Adds a chunk. ResourceExhausted at max_chunks or the arena's error; after an arena
  // failure CanGrow() is false until a chunk is released or ResumeGrowth().
  absl::Status Grow();
  bool CanGrow() const { return num_chunks_ < growth_limit_; }
  // A failed Grow() stopped growth below max_chunks, and neither a release nor
  // ResumeGrowth() has lifted the stop since.
  bool growth_stopped() const { return growth_limit_ < options_.max_chunks; }
  // Lifts the stop a failed Grow() left: CanGrow() is true again below max_chunks.
  void ResumeGrowth() { growth_limit_ = options_.max_chunks; }
  // Evicts the top chunk's cached blocks and frees the chunk.
  // REQUIRES: num_chunks() > 1 and no block of the top chunk is used.
  absl::Status ReleaseTopChunk();

  int32_t RefCount(BlockId b) const { return refcount_[b]; }
  int32_t PinCount(BlockId b) const { return pins_[b]; }
  // Used blocks whose every holder is a pin.
  int32_t num_only_pinned() const { return num_only_pinned_; }
  // Holders of all blocks (the sum of refcounts): the blocks every block table and session
  // chain names, so that num_references() - num_used() is the copies sharing avoids.
  int64_t num_references() const { return num_references_; }
  // Used blocks with two holders or more.
  int32_t num_shared() const { return num_shared_; }
  bool IsCached(BlockId b) const { return cached_[b] != 0; }
  bool IsFree(BlockId b) const { return refcount_[b] == 0 && cached_[b] == 0; }
  bool IsPresent(BlockId b) const { return b >= 0 && b < num_blocks(); }

  int32_t chunk_shift() const { return options_.chunk_shift; }
  int32_t blocks_per_chunk() const { return int32_t{1} << options_.chunk_shift; }
  int32_t num_chunks() const { return num_chunks_; }
  int32_t initial_chunks() const { return options_.initial_chunks; }
  int32_t max_chunks() const { return options_.max_chunks; }
  int32_t num_blocks() const { return num_chunks_ << options_.chunk_shift; }
  int32_t max_blocks() const { return options_.max_chunks << options_.chunk_shift; }
  int32_t num_free() const { return num_free_; }
  int32_t num_cached() const { return policy_->size(); }
  int32_t num_used() const { return num_used_; }
  int32_t NumUsedInChunk(int32_t chunk) const { return used_in_chunk_[chunk]; }
  int32_t NumFreeInChunk(int32_t chunk) const { return free_by_chunk_[chunk].size; }
  // Blocks Allocate() could hand out now: free + cached + room to grow.
  int64_t NumObtainable() const;
  int64_t num_evictions() const { return num_evictions_; }
  int64_t num_chunks_grown() const { return num_chunks_grown_; }
  // Grow()s the arena failed (not those refused at max_chunks), and the last one's error.
  int64_t num_growth_failures() const { return num_growth_failures_; }
  const std::string& last_growth_error() const { return last_growth_error_; }
  int64_t num_chunks_released() const { return num_chunks_released_; }
  const EvictionPolicy& policy() const { return *policy_; }

  // Recomputes every count from per-block state and cross-checks lists and policy.
  absl::Status CheckInvariants() const;

 private:
  BlockPool(const Options& options, std::unique_ptr<EvictionPolicy> policy, KvArena* arena,
            EvictCallback on_evict);

  void AddFreeBlocksOfChunk(int32_t chunk);
  void PushFree(BlockId b);
  void RemoveFree(BlockId b);
  std::optional<BlockId> PopLowestFree();
  void DropKey(BlockId b);

  const Options options_;
  std::unique_ptr<EvictionPolicy> policy_;
  KvArena* const arena_;
  EvictCallback on_evict_;

  int32_t num_chunks_ = 0;
  int32_t growth_limit_ = 0;       // chunks the arena may reach; < max after a failure
  std::vector<int32_t> refcount_;  // [num_blocks]
  std::vector<uint8_t> cached_;    // [num_blocks] 1 when keyed
  std::vector<int32_t> pins_;      // [num_blocks] holders that are pins, <= refcount
  BlockLinks free_links_;
  std::vector<BlockList> free_by_chunk_;  // [max_chunks]
  std::vector<uint64_t> nonempty_free_;   // bit c set when free_by_chunk_[c] is non-empty
  std::vector<int32_t> used_in_chunk_;    // [max_chunks]
  int32_t num_free_ = 0;
  int32_t num_used_ = 0;
  int32_t num_only_pinned_ = 0;  // blocks with 0 < pins == refcount
  int64_t num_references_ = 0;   // sum of refcount_
  int32_t num_shared_ = 0;       // blocks with refcount >= 2
  int64_t num_evictions_ = 0;
  int64_t num_chunks_grown_ = 0;
  int64_t num_growth_failures_ = 0;
  std::string last_growth_error_;
  int64_t num_chunks_released_ = 0;
};

}  // namespace kvd

#endif  // KVD_CACHE_BLOCK_POOL_H_
