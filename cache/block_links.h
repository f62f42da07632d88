#ifndef KVD_CACHE_BLOCK_LINKS_H_
#define KVD_CACHE_BLOCK_LINKS_H_

#include <cstdint>
#include <vector>

#include "cache/cache_check.h"

namespace kvd {

// KV block ids are dense: chunk c of the arena owns ids [c << shift, (c + 1) << shift).
using BlockId = int32_t;
inline constexpr BlockId kNoBlock = -1;

// The head, tail and length of one intrusive list threaded through a BlockLinks.
struct BlockList {
  BlockId head = kNoBlock;
  BlockId tail = kNoBlock;
  int32_t size = 0;
};

// Intrusive doubly linked lists over dense block ids: one prev/next pair per id, so
// pushing, popping and unlinking any block are O(1) and allocate nothing. A block is in at
// most one list of a given BlockLinks at a time. Not thread safe.
class BlockLinks {
 public:
  // Makes room for ids [0, num_blocks); new ids start unlinked. Never shrinks.
  void Resize(int32_t num_blocks) {
    if (num_blocks > static_cast<int32_t>(prev_.size())) {
      prev_.resize(num_blocks, kUnlinked);
      next_.resize(num_blocks, kUnlinked);
    }
  }
  bool linked(BlockId b) const { return prev_[b] != kUnlinked; }

  // REQUIRES: b is unlinked.
  void PushBack(BlockList* list, BlockId b) {
    KVD_CACHE_CHECK(!linked(b), "block already in a list");
    prev_[b] = list->tail;
    next_[b] = kNoBlock;
    if (list->tail != kNoBlock) next_[list->tail] = b;
    list->tail = b;
    if (list->head == kNoBlock) list->head = b;
    ++list->size;
  }
  // REQUIRES: b is unlinked.
  void PushFront(BlockList* list, BlockId b) {
    KVD_CACHE_CHECK(!linked(b), "block already in a list");
    prev_[b] = kNoBlock;
    next_[b] = list->head;
    if (list->head != kNoBlock) prev_[list->head] = b;
    list->head = b;
    if (list->tail == kNoBlock) list->tail = b;
    ++list->size;
  }
  // REQUIRES: b is in `list`.
  void Remove(BlockList* list, BlockId b) {
    KVD_CACHE_CHECK(linked(b), "block not in a list");
    const BlockId p = prev_[b];
    const BlockId n = next_[b];
    if (p != kNoBlock)
      next_[p] = n;
    else
      list->head = n;
    if (n != kNoBlock)
      prev_[n] = p;
    else
      list->tail = p;
    prev_[b] = kUnlinked;
    next_[b] = kUnlinked;
    --list->size;
  }
  BlockId next(BlockId b) const { return next_[b]; }

 private:
  // prev_ of a block in no list. (kNoBlock marks the ends of a list.)
  static constexpr BlockId kUnlinked = -2;

  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
};

}  // namespace kvd

#endif  // KVD_CACHE_BLOCK_LINKS_H_
