#include "cache/block_pool.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvd {

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(const Options& options,
                                                             std::unique_ptr<EvictionPolicy> policy,
                                                             KvArena* arena,
                                                             EvictCallback on_evict) {
  if (options.chunk_shift < 0 || options.chunk_shift > 24) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPool chunk_shift must be in [0, 24], got ", options.chunk_shift));
  }
  if (options.initial_chunks < 1 || options.max_chunks < options.initial_chunks) {
    return absl::InvalidArgumentError(
        absl::StrFormat("BlockPool needs 1 <= initial_chunks <= max_chunks, got %d and %d",
                        options.initial_chunks, options.max_chunks));
  }
  if ((int64_t{options.max_chunks} << options.chunk_shift) > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("BlockPool: %d chunks of 2^%d blocks are more than 2^30 blocks",
                        options.max_chunks, options.chunk_shift));
  }
  if (policy == nullptr) return absl::InvalidArgumentError("BlockPool needs an eviction policy");
  if (arena != nullptr && (arena->chunk_shift() != options.chunk_shift ||
                           arena->max_chunks() < options.max_chunks || arena->num_chunks() != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "BlockPool: the arena (chunks of 2^%d blocks, at most %d, %d made) does not fit the "
        "pool (chunks of 2^%d blocks, at most %d, none made yet)",
        arena->chunk_shift(), arena->max_chunks(), arena->num_chunks(), options.chunk_shift,
        options.max_chunks));
  }
  std::unique_ptr<BlockPool> pool(
      new BlockPool(options, std::move(policy), arena, std::move(on_evict)));
  for (int32_t c = 0; c < options.initial_chunks; ++c) {
    if (absl::Status s = pool->Grow(); !s.ok()) return s;
  }
  pool->num_chunks_grown_ = 0;  // the initial chunks are not growth
  return pool;
}

BlockPool::BlockPool(const Options& options, std::unique_ptr<EvictionPolicy> policy, KvArena* arena,
                     EvictCallback on_evict)
    : options_(options),
      policy_(std::move(policy)),
      arena_(arena),
      on_evict_(std::move(on_evict)),
      growth_limit_(options.max_chunks),
      free_by_chunk_(options.max_chunks),
      nonempty_free_((options.max_chunks + 63) / 64, 0),
      used_in_chunk_(options.max_chunks, 0) {}

BlockPool::~BlockPool() {
  if (num_used_ != 0) {
    std::fprintf(stderr, "~BlockPool: %d blocks were never released\n", num_used_);
  }
  KVD_CACHE_CHECK(num_used_ == 0, "every block must come back before the pool is destroyed");
}

void BlockPool::PushFree(BlockId b) {
  const int32_t c = b >> options_.chunk_shift;
  // LIFO within a chunk: a block freed a moment ago is the warmest to reuse.
  free_links_.PushFront(&free_by_chunk_[c], b);
  nonempty_free_[c >> 6] |= uint64_t{1} << (c & 63);
  ++num_free_;
}

void BlockPool::RemoveFree(BlockId b) {
  const int32_t c = b >> options_.chunk_shift;
  free_links_.Remove(&free_by_chunk_[c], b);
  if (free_by_chunk_[c].size == 0) nonempty_free_[c >> 6] &= ~(uint64_t{1} << (c & 63));
  --num_free_;
}

std::optional<BlockId> BlockPool::PopLowestFree() {
  for (size_t w = 0; w < nonempty_free_.size(); ++w) {
    if (nonempty_free_[w] == 0) continue;
    const int32_t c = static_cast<int32_t>(w * 64 + std::countr_zero(nonempty_free_[w]));
    const BlockId b = free_by_chunk_[c].head;
    RemoveFree(b);
    return b;
  }
  return std::nullopt;
}

void BlockPool::DropKey(BlockId b) {
  cached_[b] = 0;
  ++num_evictions_;
  if (on_evict_) on_evict_(b);
}

std::optional<BlockId> BlockPool::Allocate() {
  std::optional<BlockId> b = PopLowestFree();
  if (!b.has_value() && CanGrow() && Grow().ok()) b = PopLowestFree();
  if (!b.has_value() && policy_->size() > 0) {
    const BlockId victim = policy_->Victim();
    policy_->Remove(victim);
    DropKey(victim);
    b = victim;
  }
  if (!b.has_value()) return std::nullopt;
  refcount_[*b] = 1;
  ++num_references_;
  ++used_in_chunk_[*b >> options_.chunk_shift];
  ++num_used_;
  return b;
}

void BlockPool::Acquire(BlockId b) {
  KVD_CACHE_CHECK(IsPresent(b), "Acquire: block not present");
  if (refcount_[b] == 0) {
    KVD_CACHE_CHECK(cached_[b] != 0, "Acquire: block is free");
    policy_->Remove(b);
    ++used_in_chunk_[b >> options_.chunk_shift];
    ++num_used_;
  }
  if (pins_[b] > 0 && pins_[b] == refcount_[b]) --num_only_pinned_;
  if (++refcount_[b] == 2) ++num_shared_;
  ++num_references_;
}

void BlockPool::Release(BlockId b) {
  KVD_CACHE_CHECK(IsPresent(b) && refcount_[b] > pins_[b],
                  "Release: block has no holder that is not a pin");
  --num_references_;
  if (refcount_[b]-- == 2) --num_shared_;
  if (refcount_[b] > 0) {
    if (pins_[b] == refcount_[b]) ++num_only_pinned_;
    return;
  }
  --used_in_chunk_[b >> options_.chunk_shift];
  --num_used_;
  if (cached_[b] != 0) {
    policy_->Add(b);
  } else {
    PushFree(b);
  }
}

void BlockPool::Pin(BlockId b) {
  KVD_CACHE_CHECK(IsPresent(b) && refcount_[b] > pins_[b],
                  "Pin: block has no holder that is not a pin");
  if (++pins_[b] == refcount_[b]) ++num_only_pinned_;
}

void BlockPool::Unpin(BlockId b) {
  KVD_CACHE_CHECK(IsPresent(b) && pins_[b] > 0, "Unpin: block has no pin");
  if (pins_[b]-- == refcount_[b]) --num_only_pinned_;
}

void BlockPool::MarkCached(BlockId b) {
  KVD_CACHE_CHECK(IsPresent(b) && refcount_[b] > 0 && cached_[b] == 0,
                  "MarkCached: block must be used and not cached");
  cached_[b] = 1;
}

void BlockPool::Evict(BlockId b) {
  KVD_CACHE_CHECK(IsPresent(b) && refcount_[b] == 0 && cached_[b] != 0,
                  "Evict: block must be cached and unused");
  policy_->Remove(b);
  DropKey(b);
  PushFree(b);
}

void BlockPool::Move(BlockId src, BlockId dst) {
  KVD_CACHE_CHECK(src != dst && IsPresent(src) && IsPresent(dst), "Move: bad ids");
  KVD_CACHE_CHECK(refcount_[src] > 0, "Move: source is not used");
  KVD_CACHE_CHECK(IsFree(dst), "Move: destination is not free");
  RemoveFree(dst);
  refcount_[dst] = refcount_[src];
  cached_[dst] = cached_[src];
  pins_[dst] = pins_[src];
  pins_[src] = 0;
  ++used_in_chunk_[dst >> options_.chunk_shift];
  refcount_[src] = 0;
  cached_[src] = 0;
  --used_in_chunk_[src >> options_.chunk_shift];
  PushFree(src);
}

absl::Status BlockPool::Grow() {
  if (num_chunks_ >= options_.max_chunks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block pool is at its maximum of ", options_.max_chunks, " chunks"));
  }
  if (arena_ != nullptr) {
    if (absl::Status s = arena_->AddChunk(); !s.ok()) {
      growth_limit_ = num_chunks_;
      ++num_growth_failures_;
      last_growth_error_ = std::string(s.message());
      return s;
    }
  }
  const int32_t c = num_chunks_++;
  const int32_t n = num_blocks();
  refcount_.resize(n, 0);
  cached_.resize(n, 0);
  pins_.resize(n, 0);
  // A chunk added back after a release starts with no pins, whatever its ids held before.
  std::fill(pins_.begin() + (c << options_.chunk_shift), pins_.begin() + n, 0);
  free_links_.Resize(n);
  policy_->Resize(n);
  // Push in descending order so the chunk's lowest id is handed out first.
  for (BlockId b = n - 1; b >= (c << options_.chunk_shift); --b) PushFree(b);
  ++num_chunks_grown_;
  return absl::OkStatus();
}

absl::Status BlockPool::ReleaseTopChunk() {
  KVD_CACHE_CHECK(num_chunks_ > 1, "ReleaseTopChunk: the last chunk stays");
  const int32_t c = num_chunks_ - 1;
  KVD_CACHE_CHECK(used_in_chunk_[c] == 0, "ReleaseTopChunk: chunk has used blocks");
  const BlockId first = c << options_.chunk_shift;
  for (BlockId b = first; b < num_blocks(); ++b) {
    if (cached_[b] != 0) {
      policy_->Remove(b);
      DropKey(b);
    } else {
      RemoveFree(b);
    }
  }
  if (arena_ != nullptr) {
    if (absl::Status s = arena_->ReleaseTopChunk(); !s.ok()) {
      // The chunk is gone from the pool's view either way; its ids are never handed out.
      --num_chunks_;
      ++num_chunks_released_;
      growth_limit_ = options_.max_chunks;
      return s;
    }
  }
  --num_chunks_;
  ++num_chunks_released_;
  growth_limit_ = options_.max_chunks;
  return absl::OkStatus();
}

int64_t BlockPool::NumObtainable() const {
  const int64_t growth =
      CanGrow() ? int64_t{growth_limit_ - num_chunks_} << options_.chunk_shift : 0;
  return int64_t{num_free_} + policy_->size() + growth;
}

absl::Status BlockPool::CheckInvariants() const {
  int32_t free = 0, used = 0, cached = 0, only_pinned = 0, shared = 0;
  int64_t references = 0;
  for (int32_t c = 0; c < num_chunks_; ++c) {
    int32_t used_here = 0;
    int32_t free_here = 0;
    for (BlockId b = c << options_.chunk_shift; b < (c + 1) << options_.chunk_shift; ++b) {
      if (refcount_[b] < 0) return absl::InternalError(absl::StrCat("block ", b, " refcount < 0"));
      if (pins_[b] < 0 || pins_[b] > refcount_[b]) {
        return absl::InternalError(
            absl::StrCat("block ", b, " has ", pins_[b], " pins and refcount ", refcount_[b]));
      }
      only_pinned += pins_[b] > 0 && pins_[b] == refcount_[b] ? 1 : 0;
      references += refcount_[b];
      shared += refcount_[b] >= 2 ? 1 : 0;
      const bool in_free = free_links_.linked(b);
      const bool in_policy = policy_->Contains(b);
      if (refcount_[b] > 0) {
        ++used;
        ++used_here;
        if (in_free || in_policy) {
          return absl::InternalError(absl::StrCat("block ", b, " is used and on a free list"));
        }
      } else if (cached_[b] != 0) {
        ++cached;
        if (!in_policy || in_free) {
          return absl::InternalError(absl::StrCat("cached block ", b, " not (only) evictable"));
        }
      } else {
        ++free;
        ++free_here;
        if (!in_free || in_policy) {
          return absl::InternalError(absl::StrCat("free block ", b, " not (only) on free list"));
        }
      }
    }
    if (used_here != used_in_chunk_[c]) {
      return absl::InternalError(
          absl::StrCat("chunk ", c, " used count ", used_in_chunk_[c], " != ", used_here));
    }
    if (free_here != free_by_chunk_[c].size) {  // a free block on another chunk's list
      return absl::InternalError(absl::StrCat("chunk ", c, " free list holds ",
                                              free_by_chunk_[c].size, " blocks, not ", free_here));
    }
    const bool bit = (nonempty_free_[c >> 6] >> (c & 63)) & 1;
    if (bit != (free_by_chunk_[c].size > 0)) {
      return absl::InternalError(absl::StrCat("chunk ", c, " free bitmap is stale"));
    }
  }
  if (free != num_free_ || used != num_used_ || cached != policy_->size()) {
    return absl::InternalError(absl::StrFormat("counts: free %d/%d used %d/%d cached %d/%d", free,
                                               num_free_, used, num_used_, cached,
                                               policy_->size()));
  }
  if (references != num_references_ || shared != num_shared_) {
    return absl::InternalError(
        absl::StrFormat("holders: %d counted, %d kept; shared blocks: %d counted, %d kept",
                        references, num_references_, shared, num_shared_));
  }
  if (only_pinned != num_only_pinned_) {
    return absl::InternalError(absl::StrFormat("blocks held by pins only: %d counted, %d kept",
                                               only_pinned, num_only_pinned_));
  }
  // Each present block was counted in exactly one state above, so free + used + cached ==
  // num_blocks() follows; what remains is that no list names a block of an absent chunk.
  for (int32_t c = num_chunks_; c < options_.max_chunks; ++c) {
    if (free_by_chunk_[c].size != 0 || used_in_chunk_[c] != 0) {
      return absl::InternalError(absl::StrCat("absent chunk ", c, " has blocks"));
    }
  }
  // Nor holders or pins: Move leaves none behind on a chunk that is then released.
  for (size_t b = num_blocks(); b < pins_.size(); ++b) {
    if (refcount_[b] != 0 || pins_[b] != 0) {
      return absl::InternalError(absl::StrCat("block ", b, " of an absent chunk has holders"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvd
