#include "cache/prefix_index.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>

#include "absl/strings/str_cat.h"

namespace kvd {
namespace {

// splitmix64's finalizer: a cheap bijective mixer with good avalanche.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

PrefixIndex::PrefixIndex(int32_t block_size, uint64_t extra_key, uint64_t secret)
    : block_size_(block_size),
      salt_(extra_key ^ secret),
      root_key_(Mix64(salt_ ^ 0x70726566697821ULL)) {
  KVD_CACHE_CHECK(block_size > 0, "block_size must be positive");
}

uint64_t PrefixIndex::RandomSecret() {
  // Falling back to a fixed secret would let clients craft colliding keys again, so no
  // entropy source is fatal (random_device throws only then).
  try {
    std::random_device entropy;
    return (uint64_t{entropy()} << 32) ^ entropy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "PrefixIndex: no entropy source for the prefix-key secret: %s\n",
                 e.what());
    std::abort();
  }
}

uint64_t PrefixIndex::ChildKey(uint64_t parent_key, absl::Span<const int32_t> tokens) const {
  KVD_CACHE_CHECK(static_cast<int32_t>(tokens.size()) == block_size_, "not a full block");
  uint64_t h = Mix64(parent_key ^ salt_);
  for (int32_t t : tokens) {
    h = Mix64(h + static_cast<uint32_t>(t) * 0x9e3779b97f4a7c15ULL);
  }
  return h;
}

void PrefixIndex::EnsureBlock(BlockId b) {
  if (b < static_cast<BlockId>(has_key_.size())) return;
  const size_t n = std::max<size_t>(static_cast<size_t>(b) + 1, has_key_.size() * 2);
  key_.resize(n, 0);
  parent_.resize(n, 0);
  has_key_.resize(n, 0);
  tokens_.resize(n * block_size_, 0);
}

std::optional<BlockId> PrefixIndex::Find(uint64_t key, uint64_t parent_key,
                                         absl::Span<const int32_t> tokens) const {
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  const BlockId b = it->second;
  if (parent_[b] != parent_key) return std::nullopt;
  if (!std::equal(tokens.begin(), tokens.end(), TokensOf(b).begin(), TokensOf(b).end())) {
    return std::nullopt;
  }
  return b;
}

bool PrefixIndex::Insert(BlockId b, uint64_t key, uint64_t parent_key,
                         absl::Span<const int32_t> tokens) {
  KVD_CACHE_CHECK(b >= 0 && static_cast<int32_t>(tokens.size()) == block_size_,
                  "Insert: bad block or token count");
  if (HasKey(b)) return false;
  if (!map_.emplace(key, b).second) return false;
  EnsureBlock(b);
  key_[b] = key;
  parent_[b] = parent_key;
  has_key_[b] = 1;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_);
  return true;
}

PrefixIndex::KeyClaim PrefixIndex::Claim(BlockId b, uint64_t key, uint64_t parent_key,
                                         absl::Span<const int32_t> tokens) {
  if (Insert(b, key, parent_key, tokens)) return KeyClaim::kInserted;
  const std::optional<BlockId> holder = Find(key, parent_key, tokens);
  if (!holder.has_value()) return KeyClaim::kCollision;
  if (*holder == b) return KeyClaim::kHeld;
  // b is keyed for another prefix, so its KV is not this prefix's to vouch for.
  return HasKey(b) ? KeyClaim::kCollision : KeyClaim::kDuplicate;
}

void PrefixIndex::Remove(BlockId b) {
  KVD_CACHE_CHECK(HasKey(b), "Remove: block has no key");
  map_.erase(key_[b]);
  has_key_[b] = 0;
}

void PrefixIndex::Rebind(BlockId from, BlockId to) {
  KVD_CACHE_CHECK(HasKey(from) && !HasKey(to), "Rebind: bad blocks");
  EnsureBlock(to);
  key_[to] = key_[from];
  parent_[to] = parent_[from];
  has_key_[to] = 1;
  const auto src = tokens_.begin() + static_cast<size_t>(from) * block_size_;
  std::copy(src, src + block_size_, tokens_.begin() + static_cast<size_t>(to) * block_size_);
  has_key_[from] = 0;
  map_[key_[to]] = to;
}

absl::Status PrefixIndex::CheckInvariants() const {
  int64_t keyed = 0;
  for (BlockId b = 0; b < static_cast<BlockId>(has_key_.size()); ++b) {
    if (!has_key_[b]) continue;
    ++keyed;
    if (ChildKey(parent_[b], TokensOf(b)) != key_[b]) {
      return absl::InternalError(absl::StrCat("block ", b, ": key does not match its tokens"));
    }
    auto it = map_.find(key_[b]);
    if (it == map_.end() || it->second != b) {
      return absl::InternalError(absl::StrCat("block ", b, ": key not mapped to it"));
    }
  }
  if (keyed != size()) {
    return absl::InternalError(absl::StrCat("index has ", size(), " keys, ", keyed, " blocks"));
  }
  return absl::OkStatus();
}

}  // namespace kvd
