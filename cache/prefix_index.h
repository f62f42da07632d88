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
// ids), starting from root_key(); every step mixes in the caller's extra key (model and KV
// layout) and a secret, so a key names the whole prefix up to and including the block.
//
// A lookup is verified: the stored parent key and the block's own tokens must equal the
// asked ones. The tokens before the block are not compared, so a hit holds KV of another
// prefix only if two different prefixes share a key up the chain, and two defences leave
// that to chance (~n^2 / 2^65 among n keys): the secret, drawn from the OS entropy source
// and never persisted or exposed, keeps clients from searching for colliding blocks
// (against unkeyed keys a pair took seconds); and callers key a block under a parent key
// only while Claim() says the index resolves that key to their own prefix, so a collision
// met at registration chains nothing. Not detected: a prefix that takes a key after
// another prefix's block was keyed as its child.
//
// Keys are write-once: Insert() of a key that is present (another block computed the
// same prefix) or onto a block that is already keyed changes nothing and returns false.
// Entries are removed when the pool evicts the block, and rebound when defragmentation
// moves it. Not thread safe: the engine thread only.
class PrefixIndex {
 public:
  // What Claim() found for a block's key.
  enum class KeyClaim {
    kInserted,   // the block now holds the key (newly cached)
    kHeld,       // the block already held the key
    kDuplicate,  // another block holds the key with the same parent key and tokens
    kCollision,  // the key is held for another prefix, or the block holds another key
  };

  // REQUIRES: block_size > 0. `secret` is mixed into every key; pass RandomSecret() (tests
  // pass fixed ones).
  PrefixIndex(int32_t block_size, uint64_t extra_key, uint64_t secret);

  // 64 bits from the OS entropy source (std::random_device); aborts if there is none.
  static uint64_t RandomSecret();

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
  // Insert(), then whether the index resolves `key` to this prefix (kInserted, kHeld,
  // kDuplicate): only then may a child be keyed under `key`. Changes the index only when
  // it returns kInserted. REQUIRES: key == ChildKey(parent_key, tokens).
  KeyClaim Claim(BlockId b, uint64_t key, uint64_t parent_key, absl::Span<const int32_t> tokens);
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
  const uint64_t salt_;  // extra key ^ secret, mixed into every ChildKey step
  const uint64_t root_key_;
  absl::flat_hash_map<uint64_t, BlockId> map_;
  std::vector<uint64_t> key_;     // [num_blocks]
  std::vector<uint64_t> parent_;  // [num_blocks]
  std::vector<uint8_t> has_key_;  // [num_blocks]
  std::vector<int32_t> tokens_;   // [num_blocks][block_size]
};

}  // namespace kvd

#endif  // KVD_CACHE_PREFIX_INDEX_H_
