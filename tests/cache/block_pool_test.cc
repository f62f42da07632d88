#include "cache/block_pool.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cache/fake_backend.h"

namespace kvd {
namespace {

class BlockPoolTest : public ::testing::Test {
 protected:
  // 4 blocks per chunk, ids only.
  std::unique_ptr<BlockPool> Make(int32_t initial_chunks, int32_t max_chunks,
                                  std::string_view policy = "lru") {
    auto p = BlockPool::Create({2, initial_chunks, max_chunks}, *MakeEvictionPolicy(policy, 2),
                               nullptr, [this](BlockId b) { evicted_.push_back(b); });
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  }
  void ExpectValid(const BlockPool& p) {
    ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  }

  std::vector<BlockId> evicted_;
};

TEST_F(BlockPoolTest, HandsOutTheLowestChunkFirstAndGrowsOnlyWhenNothingIsFree) {
  auto p = Make(2, 3);
  EXPECT_EQ(p->num_blocks(), 8);
  std::vector<BlockId> got;
  for (int i = 0; i < 8; ++i) got.push_back(*p->Allocate());
  EXPECT_EQ(got, (std::vector<BlockId>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p->num_chunks(), 2);
  p->Release(5);
  p->Release(1);
  EXPECT_EQ(*p->Allocate(), 1);  // chunk 0 before chunk 1
  EXPECT_EQ(*p->Allocate(), 5);
  EXPECT_EQ(*p->Allocate(), 8);  // grew
  EXPECT_EQ(p->num_chunks(), 3);
  EXPECT_EQ(p->num_chunks_grown(), 1);
  ExpectValid(*p);
  for (BlockId b = 0; b < 9; ++b) p->Release(b);
}

TEST_F(BlockPoolTest, CachedBlocksAreEvictedOnlyWhenNothingIsFreeOldestFirst) {
  auto p = Make(1, 1);
  std::vector<BlockId> b;
  for (int i = 0; i < 4; ++i) b.push_back(*p->Allocate());
  p->MarkCached(b[2]);
  p->MarkCached(b[0]);
  p->Release(b[2]);  // cached first: least recently used
  p->Release(b[0]);
  p->Release(b[1]);  // free
  EXPECT_EQ(p->num_cached(), 2);
  EXPECT_EQ(p->num_free(), 1);
  EXPECT_EQ(p->NumObtainable(), 3);
  EXPECT_EQ(*p->Allocate(), b[1]);
  EXPECT_TRUE(evicted_.empty());
  EXPECT_EQ(*p->Allocate(), b[2]);
  EXPECT_EQ(evicted_, std::vector<BlockId>{b[2]});
  EXPECT_FALSE(p->IsCached(b[2]));
  EXPECT_EQ(p->num_evictions(), 1);
  ExpectValid(*p);
  EXPECT_EQ(*p->Allocate(), b[0]);
  EXPECT_FALSE(p->Allocate().has_value());
  for (BlockId id : b) p->Release(id);
}

TEST_F(BlockPoolTest, AcquireRevivesACachedBlockAndTakesItOffTheEvictionList) {
  auto p = Make(1, 1);
  const BlockId b = *p->Allocate();
  p->MarkCached(b);
  p->Release(b);
  EXPECT_EQ(p->num_cached(), 1);
  p->Acquire(b);
  EXPECT_EQ(p->RefCount(b), 1);
  EXPECT_EQ(p->num_cached(), 0);
  p->Acquire(b);
  p->Release(b);
  EXPECT_EQ(p->RefCount(b), 1);
  ExpectValid(*p);
  p->Release(b);
  EXPECT_EQ(p->num_cached(), 1);
}

TEST_F(BlockPoolTest, MoveTransfersHoldersAndKeyToTheDestination) {
  auto p = Make(2, 2);
  std::vector<BlockId> b;
  for (int i = 0; i < 5; ++i) b.push_back(*p->Allocate());
  p->Acquire(b[4]);
  p->MarkCached(b[4]);
  p->Release(b[1]);
  p->Move(b[4], b[1]);
  EXPECT_EQ(p->RefCount(b[1]), 2);
  EXPECT_TRUE(p->IsCached(b[1]));
  EXPECT_TRUE(p->IsFree(b[4]));
  EXPECT_EQ(p->NumUsedInChunk(1), 0);
  ExpectValid(*p);
  p->Release(b[1]);
  p->Release(b[1]);
  for (BlockId id : {b[0], b[2], b[3]}) p->Release(id);
}

// A pin is a holder an idle session keeps; the pool counts the blocks held by pins alone
// (the room releasing sessions would give back) as holders come and go.
TEST_F(BlockPoolTest, CountsTheBlocksThatOnlyPinsHold) {
  auto p = Make(1, 1);
  const BlockId b = *p->Allocate();
  const BlockId c = *p->Allocate();
  p->Pin(b);  // the session keeps the allocating sequence's reference
  EXPECT_EQ(p->PinCount(b), 1);
  EXPECT_EQ(p->num_only_pinned(), 1);
  p->Acquire(b);  // a new turn's sequence holds it too
  EXPECT_EQ(p->num_only_pinned(), 0);
  ExpectValid(*p);
  p->Release(b);  // that sequence ends
  EXPECT_EQ(p->num_only_pinned(), 1);
  p->Acquire(c);  // c: two sessions pin it
  p->Pin(c);
  EXPECT_EQ(p->num_only_pinned(), 1);
  p->Pin(c);
  EXPECT_EQ(p->num_only_pinned(), 2);
  ExpectValid(*p);
  p->Unpin(c);  // one session lets go: c is held by a holder that is not a pin
  EXPECT_EQ(p->num_only_pinned(), 1);
  p->Unpin(b);
  EXPECT_EQ(p->num_only_pinned(), 0);
  EXPECT_EQ(p->PinCount(b), 0);
  ExpectValid(*p);
  p->Release(b);
  p->Release(c);
  p->Unpin(c);
  p->Release(c);
  EXPECT_EQ(p->num_free(), 4);
  ExpectValid(*p);
}

// What sharing saves: every holder of every block is counted once (num_references), so that
// the references beyond the used blocks are blocks that would otherwise be copies; a move
// carries a shared block's holders along.
TEST_F(BlockPoolTest, CountsHoldersAndSharedBlocks) {
  auto p = Make(2, 2);
  const BlockId a = *p->Allocate();
  const BlockId b = *p->Allocate();
  EXPECT_EQ(p->num_references(), 2);
  EXPECT_EQ(p->num_shared(), 0);
  p->Acquire(a);  // a second sequence shares a
  p->Acquire(a);  // and a third
  EXPECT_EQ(p->num_references(), 4);
  EXPECT_EQ(p->num_shared(), 1);
  p->Pin(a);  // a pin is one of the holders, not another
  EXPECT_EQ(p->num_references(), 4);
  p->MarkCached(b);
  p->Acquire(b);
  EXPECT_EQ(p->num_shared(), 2);
  EXPECT_EQ(p->num_references() - p->num_used(), 3);  // three blocks not stored twice
  ExpectValid(*p);
  p->Move(a, 4);  // defragmentation: the holders go with it
  EXPECT_EQ(p->num_references(), 5);
  EXPECT_EQ(p->num_shared(), 2);
  EXPECT_EQ(p->RefCount(4), 3);
  ExpectValid(*p);
  p->Release(4);
  EXPECT_EQ(p->num_shared(), 2);  // still two holders
  p->Release(4);
  EXPECT_EQ(p->num_shared(), 1);  // the pin alone holds it now
  p->Release(b);
  p->Release(b);  // b: cached, evictable
  EXPECT_EQ(p->num_shared(), 0);
  EXPECT_EQ(p->num_references(), 1);
  ExpectValid(*p);
  p->Unpin(4);
  p->Release(4);
  EXPECT_EQ(p->num_references(), 0);
  ExpectValid(*p);
}

TEST_F(BlockPoolTest, MoveCarriesPinsToTheDestination) {
  auto p = Make(2, 2);
  std::vector<BlockId> b;
  for (int i = 0; i < 5; ++i) b.push_back(*p->Allocate());
  p->Pin(b[4]);
  p->Release(b[1]);
  p->Move(b[4], b[1]);
  EXPECT_EQ(p->PinCount(b[1]), 1);
  EXPECT_EQ(p->PinCount(b[4]), 0);
  EXPECT_EQ(p->num_only_pinned(), 1);
  ExpectValid(*p);
  // The source's chunk, emptied, goes back with no pin left behind on its ids.
  ASSERT_TRUE(p->ReleaseTopChunk().ok());
  ExpectValid(*p);
  p->Unpin(b[1]);
  EXPECT_EQ(p->num_only_pinned(), 0);
  for (BlockId id : {b[0], b[1], b[2], b[3]}) p->Release(id);
}

TEST(BlockPoolDeathTest, APinnedReferenceIsNotReleasedAndNotPinnedTwice) {
  auto p = *BlockPool::Create({2, 1, 1}, *MakeEvictionPolicy("lru", 2), nullptr, nullptr);
  const BlockId b = *p->Allocate();
  p->Pin(b);
  EXPECT_DEATH(p->Release(b), "no holder that is not a pin");
  EXPECT_DEATH(p->Pin(b), "no holder that is not a pin");
  p->Unpin(b);
  EXPECT_DEATH(p->Unpin(b), "no pin");
  p->Release(b);
}

TEST_F(BlockPoolTest, ReleasingTheTopChunkEvictsItsCachedBlocks) {
  auto p = Make(1, 2);
  std::vector<BlockId> b;
  for (int i = 0; i < 6; ++i) b.push_back(*p->Allocate());
  p->MarkCached(b[5]);
  for (BlockId id : b) p->Release(id);
  ASSERT_EQ(p->num_chunks(), 2);
  ASSERT_TRUE(p->ReleaseTopChunk().ok());
  EXPECT_EQ(p->num_chunks(), 1);
  EXPECT_EQ(evicted_, std::vector<BlockId>{b[5]});
  EXPECT_EQ(p->num_free() + p->num_cached(), 4);
  ExpectValid(*p);
  // Growing again reuses the ids of the released chunk.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(p->Allocate().has_value());
  EXPECT_EQ(p->num_chunks(), 2);
  ExpectValid(*p);
  for (BlockId id = 0; id < 5; ++id) p->Release(id);
}

TEST_F(BlockPoolTest, ChunkLruEvictsFromTheHighestChunkFirst) {
  auto p = Make(2, 2, "chunk_lru");
  std::vector<BlockId> b;
  for (int i = 0; i < 8; ++i) b.push_back(*p->Allocate());
  for (BlockId id : {1, 6, 2, 5}) p->MarkCached(id);
  for (BlockId id : {1, 6, 2, 5}) p->Release(id);
  EXPECT_EQ(*p->Allocate(), 6);  // oldest of chunk 1, though 1 is older overall
  EXPECT_EQ(*p->Allocate(), 5);
  EXPECT_EQ(*p->Allocate(), 1);
  ExpectValid(*p);
  for (BlockId id = 0; id < 8; ++id) {
    if (id != 2) p->Release(id);
  }
}

TEST_F(BlockPoolTest, GrowsTheArenaAndStopsGrowingWhenTheBackendFails) {
  FakeBackend backend;
  const KvLayout layout = *KvLayout::Create({1, 1, 4}, DType::kF32, 4);
  auto arena = *KvArena::Create(layout, 2, 4, &backend);
  auto p = *BlockPool::Create({2, 1, 4}, *MakeEvictionPolicy("lru", 2), arena.get(), nullptr);
  EXPECT_EQ(arena->num_chunks(), 1);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(p->Allocate().has_value());
  EXPECT_EQ(arena->num_chunks(), 2);
  backend.FailAllocationsAfter(backend.num_allocations());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(p->Allocate().has_value());
  EXPECT_FALSE(p->Allocate().has_value());
  EXPECT_FALSE(p->CanGrow());
  EXPECT_EQ(p->NumObtainable(), 0);
  // Counted once, and said: not tried again until a chunk is released.
  EXPECT_FALSE(p->Allocate().has_value());
  EXPECT_EQ(p->num_growth_failures(), 1);
  EXPECT_EQ(p->last_growth_error(),
            "allocating KV arena chunk 3 of 4 (512 bytes): fake backend: out of memory");
  for (BlockId id = 0; id < 8; ++id) p->Release(id);
  ASSERT_TRUE(p->ReleaseTopChunk().ok());
  EXPECT_EQ(arena->num_chunks(), 1);
  EXPECT_EQ(arena->LayerView(0).chunks[1], nullptr);
}

TEST_F(BlockPoolTest, RejectsInconsistentOptions) {
  EXPECT_FALSE(BlockPool::Create({2, 3, 2}, *MakeEvictionPolicy("lru", 2), nullptr, nullptr).ok());
  EXPECT_FALSE(BlockPool::Create({2, 0, 2}, *MakeEvictionPolicy("lru", 2), nullptr, nullptr).ok());
  EXPECT_FALSE(MakeEvictionPolicy("random", 2).ok());
}

TEST(BlockPoolDeathTest, DestructionWithABlockOutstandingAborts) {
  EXPECT_DEATH(
      {
        auto p = *BlockPool::Create({2, 1, 1}, *MakeEvictionPolicy("lru", 2), nullptr, nullptr);
        (void)p->Allocate();
      },
      "never released");
}

}  // namespace
}  // namespace kvd
