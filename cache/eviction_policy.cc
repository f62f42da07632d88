#include "cache/eviction_policy.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvd {
namespace {

// One list in release order: head is the least recently released block.
class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void Resize(int32_t num_blocks) override { links_.Resize(num_blocks); }
  void Add(BlockId b) override { links_.PushBack(&list_, b); }
  void Remove(BlockId b) override { links_.Remove(&list_, b); }
  bool Contains(BlockId b) const override { return links_.linked(b); }
  BlockId Victim() const override {
    KVD_CACHE_CHECK(list_.size > 0, "no evictable block");
    return list_.head;
  }
  int32_t size() const override { return list_.size; }

 private:
  BlockLinks links_;
  BlockList list_;
};

// One release-ordered list per chunk; victims come from the highest non-empty chunk.
class ChunkLruPolicy final : public EvictionPolicy {
 public:
  explicit ChunkLruPolicy(int32_t chunk_shift) : chunk_shift_(chunk_shift) {}

  std::string_view name() const override { return "chunk_lru"; }
  void Resize(int32_t num_blocks) override {
    links_.Resize(num_blocks);
    const int32_t num_chunks = ((num_blocks - 1) >> chunk_shift_) + 1;
    if (num_chunks > static_cast<int32_t>(lists_.size())) lists_.resize(num_chunks);
  }
  void Add(BlockId b) override {
    links_.PushBack(&lists_[b >> chunk_shift_], b);
    ++size_;
  }
  void Remove(BlockId b) override {
    links_.Remove(&lists_[b >> chunk_shift_], b);
    --size_;
  }
  bool Contains(BlockId b) const override { return links_.linked(b); }
  BlockId Victim() const override {
    KVD_CACHE_CHECK(size_ > 0, "no evictable block");
    for (int32_t c = static_cast<int32_t>(lists_.size()) - 1; c >= 0; --c) {
      if (lists_[c].size > 0) return lists_[c].head;
    }
    return kNoBlock;
  }
  int32_t size() const override { return size_; }

 private:
  const int32_t chunk_shift_;
  BlockLinks links_;
  std::vector<BlockList> lists_;  // [num_chunks]
  int32_t size_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                                   int32_t chunk_shift) {
  if (name == "lru") return std::make_unique<LruPolicy>();
  if (name == "chunk_lru") return std::make_unique<ChunkLruPolicy>(chunk_shift);
  return absl::InvalidArgumentError(absl::StrCat("eviction_policy: unknown value \"",
                                                 std::string(name), "\"; allowed: lru, chunk_lru"));
}

}  // namespace kvd
