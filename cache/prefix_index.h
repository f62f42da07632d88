#ifndef KVD_CACHE_PREFIX_INDEX_H_
#define KVD_CACHE_PREFIX_INDEX_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cache/block_links.h"

namespace kvd {

// PrefixIndex maps chained 64-bit keys of full blocks to the blocks that hold them.
//
// The key of block i of a sequence is ChildKey(key of block i - 1, its block_size token
// ids), starting from root_key(), which mixes in the caller's extra key (model and KV
// layout), so a key names the whole prefix up to and including the block. A lookup is
// verified: the stored parent key and tokens must equal the asked ones, so a 64-bit
// collision can never hand out wrong KV (the parent, in turn, was verified one step up).
//
// Keys are write-once: Insert() of a key that is present (another block computed the
// same prefix) or onto a block that is already keyed changes nothing and returns false.
// Entries are removed when the pool evicts the block, and rebound when defragmentation
// moves it. Not thread safe: the engine thread only.
class PrefixIndex {
 public:
  // REQUIRES: block_size > 0.
  PrefixIndex(int32_t block_size, uint64_t extra_key);

  int32_t block_size() const { return block_size_; }
  uint64_t root_key() const { return root_key_; }
  // REQUIRES: tokens.size() == block_size().
  uint64_t ChildKey(uint64_t parent_key, absl::Span<const int32_t> tokens) const;

  // The block keyed `key` if its stored parent key and tokens match, else nullopt.
  std::optional<BlockId> Find(uint64_t key, uint64_t parent_key,
                              absl::Span<const int32_t> tokens) const;
  // Keys block b. Returns false (and changes nothing) if the key is taken or b is keyed.
  // REQUIRES: key == ChildKey(parent_key, tokens).
  bool Insert(BlockId b, uint64_t key, uint64_t parent_key, absl::Span<const int32_t> tokens);
  // REQUIRES: HasKey(b).
  void Remove(BlockId b);
  // Moves b's entry to `to`. REQUIRES: HasKey(from), !HasKey(to).
  void Rebind(BlockId from, BlockId to);

  bool HasKey(BlockId b) const { return b < static_cast<BlockId>(has_key_.size()) && has_key_[b]; }
  // REQUIRES: HasKey(b).
  uint64_t KeyOf(BlockId b) const { return key_[b]; }
  absl::Span<const int32_t> TokensOf(BlockId b) const {
    return absl::MakeConstSpan(tokens_).subspan(static_cast<size_t>(b) * block_size_, block_size_);
  }
  int64_t size() const { return static_cast<int64_t>(map_.size()); }

  // Every entry's key equals ChildKey(its parent key, its tokens) and map and per-block
  // state agree.
  absl::Status CheckInvariants() const;

 private:
  void EnsureBlock(BlockId b);

  const int32_t block_size_;
  const uint64_t root_key_;
  const uint64_t extra_key_;
  absl::flat_hash_map<uint64_t, BlockId> map_;
  std::vector<uint64_t> key_;     // [num_blocks]
  std::vector<uint64_t> parent_;  // [num_blocks]
  std::vector<uint8_t> has_key_;  // [num_blocks]
  std::vector<int32_t> tokens_;   // [num_blocks][block_size]
};

}  // namespace kvd

#endif  // KVD_CACHE_PREFIX_INDEX_H_
