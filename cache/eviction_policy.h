#ifndef KVD_CACHE_EVICTION_POLICY_H_
#define KVD_CACHE_EVICTION_POLICY_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache/block_links.h"

namespace kvd {

// Decides which evictable block goes first. The evictable set is the cached blocks (they
// carry a prefix key) with reference count 0; BlockPool adds a block when its last holder
// lets go and removes it when a prefix hit reuses it or it is evicted. Every operation is
// O(1) (O(num_chunks) for Victim() of "chunk_lru" in the worst case). Not thread safe.
//
// Policies (the `eviction_policy` option):
//   "lru"       (default) least recently released first; a sequence releases its tail
//               blocks first, so for one sequence the tail goes before the prefix.
//   "chunk_lru" least recently released block of the highest chunk that has one: keeps
//               the cache in low chunks so the arena can shrink without losing hits.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  virtual std::string_view name() const = 0;
  // Makes room for ids [0, num_blocks). Never shrinks.
  virtual void Resize(int32_t num_blocks) = 0;
  // REQUIRES: b is not in the set.
  virtual void Add(BlockId b) = 0;
  // REQUIRES: b is in the set.
  virtual void Remove(BlockId b) = 0;
  virtual bool Contains(BlockId b) const = 0;
  // The next block to evict; it stays in the set. REQUIRES: size() > 0.
  virtual BlockId Victim() const = 0;
  virtual int32_t size() const = 0;
};

// InvalidArgument naming the allowed values for an unknown `name`.
// REQUIRES: chunk_shift >= 0 (block b lives in chunk b >> chunk_shift).
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                                   int32_t chunk_shift);

}  // namespace kvd

#endif  // KVD_CACHE_EVICTION_POLICY_H_
