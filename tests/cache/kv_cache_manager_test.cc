#include "cache/kv_cache_manager.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "cache/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/cache_manager_fixture.h"
#include "tests/cache/fake_backend.h"
#include "tests/cache/kv_test_util.h"

namespace kvd {
namespace {

using testing_util::CountBadKv;
using testing_util::Iota;
using testing_util::Step;
using testing_util::TinyOptions;
using testing_util::TinyShape;

std::vector<BlockId> Blocks(const KvCacheManager& m, SeqId id) {
  return {m.BlockIds(id).begin(), m.BlockIds(id).end()};
}

using KvCacheManagerTest = testing_util::CacheManagerTest;

TEST_F(KvCacheManagerTest, RoundsPoolSizesToWholeChunksOfPowerOfTwoBlocks) {
  KvCacheOptions o = TinyOptions();
  o.chunk_bytes = 1500;         // 5.8 blocks of 256 bytes -> 4 blocks, 1024 bytes
  o.initial_pool_bytes = 1100;  // rounds up to 2 chunks
  o.max_pool_bytes = 4500;      // rounds down to 4 chunks
  auto m = Make(o);
  EXPECT_EQ(m->geometry().blocks_per_chunk(), 4);
  EXPECT_EQ(m->geometry().chunk_bytes, 1024);
  EXPECT_EQ(m->geometry().initial_chunks, 2);
  EXPECT_EQ(m->geometry().max_chunks, 4);
  EXPECT_EQ(m->stats().total_blocks, 8);
  // Two chunks, the chunk table and the copy ids buffer.
  EXPECT_EQ(backend_.live_bytes(), 2 * 1024 + 4 * int64_t{sizeof(void*)} +
                                       2 * KvArena::kInitialCopyPairs * int64_t{sizeof(int32_t)});
}

TEST_F(KvCacheManagerTest, RejectsBadOptionsNamingTheKey) {
  KvCacheOptions o = TinyOptions();
  o.chunk_bytes = 100;  // smaller than one block
  auto m = KvCacheManager::Create(o, TinyShape(), &backend_, &clock_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), ::testing::HasSubstr("chunk_bytes"));
  o = TinyOptions();
  o.eviction_policy = "mru";
  m = KvCacheManager::Create(o, TinyShape(), &backend_, &clock_);
  EXPECT_THAT(std::string(m.status().message()), ::testing::HasSubstr("eviction_policy"));
  o = TinyOptions();
  o.device_headroom_bytes = -1;
  m = KvCacheManager::Create(o, TinyShape(), &backend_, &clock_);
  EXPECT_THAT(std::string(m.status().message()),
              ::testing::HasSubstr("device_headroom_bytes: must be >= 0, got -1"));
  o = TinyOptions();
  o.growth_retry_interval = absl::ZeroDuration();
  m = KvCacheManager::Create(o, TinyShape(), &backend_, &clock_);
  EXPECT_THAT(std::string(m.status().message()),
              ::testing::HasSubstr("growth_retry_interval: must be > 0, got 0"));
  o = TinyOptions();
  o.kv_dtype = DType::kInt4;
  o.chunk_bytes = 4096;
  o.max_pool_bytes = o.initial_pool_bytes = 4096;
  m = KvCacheManager::Create(o, TinyShape(), &backend_, &clock_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
}

TEST_F(KvCacheManagerTest, ReservesSlotsBlockByBlockAndRegistersFullBlocks) {
  auto m = Make(TinyOptions());
  const std::vector<int32_t> prompt = Iota(10);
  ASSERT_EQ(*m->AddSequence(1, prompt), 0);
  EXPECT_EQ(m->BlocksToReserve(1, 10), 3);
  ASSERT_TRUE(m->Reserve(1, 10));
  ASSERT_EQ(m->BlockIds(1).size(), 3u);
  const BlockId b1 = m->BlockIds(1)[1];
  EXPECT_EQ(m->SlotOf(1, 5), int64_t{b1} * 4 + 1);
  m->MarkComputed(1, 10);
  EXPECT_EQ(m->stats().num_prefix_keys, 2);  // the partial third block has no key
  EXPECT_EQ(m->NumComputed(1), 10);
  ExpectValid(*m);
  m->Free(1);
  EXPECT_EQ(m->stats().cached_blocks, 2);
  EXPECT_EQ(m->stats().used_blocks, 0);
  ExpectValid(*m);
}

TEST_F(KvCacheManagerTest, PrefixHitsReuseFullBlocksButLeaveTheLastTokenToCompute) {
  auto m = Make(TinyOptions());
  const std::vector<int32_t> prompt = Iota(8);
  ASSERT_EQ(*m->AddSequence(1, prompt), 0);
  ASSERT_TRUE(Step(*m, 1, 8));
  // Same 8 tokens: both blocks are cached, but the last token must be recomputed, and
  // only whole blocks are shared, so the hit is the first block.
  EXPECT_EQ(m->ProbePrefix(prompt), 4);
  ASSERT_EQ(*m->AddSequence(2, prompt), 4);
  EXPECT_EQ(m->BlockIds(2)[0], m->BlockIds(1)[0]);
  // A longer prompt with the same start hits both blocks.
  std::vector<int32_t> longer = prompt;
  longer.push_back(7);
  ASSERT_EQ(*m->AddSequence(3, longer), 8);
  EXPECT_EQ(Blocks(*m, 3), Blocks(*m, 1));
  // A prompt that differs in the first block hits nothing, even with the rest equal.
  std::vector<int32_t> other = longer;
  other[0] = 5;
  ASSERT_EQ(*m->AddSequence(4, other), 0);
  // Hits count once an admission stands, i.e. has its slots.
  EXPECT_EQ(m->stats().prefix_query_tokens, 8);
  for (const auto& [id, n] : {std::pair<SeqId, int32_t>{2, 4}, {3, 1}, {4, 9}}) {
    ASSERT_TRUE(m->Reserve(id, n)) << id;
  }
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.prefix_hit_tokens, 12);
  EXPECT_EQ(st.prefix_query_tokens, 8 + 8 + 9 + 9);
  ASSERT_TRUE(Step(*m, 3, 1));
  EXPECT_EQ(CountBadKv(*m, 3), 0);
  ExpectValid(*m);
  for (SeqId id : {1, 2, 3, 4}) m->Free(id);
  ExpectValid(*m);
}

TEST_F(KvCacheManagerTest, DisabledPrefixCachingNeverHits) {
  KvCacheOptions o = TinyOptions();
  o.enable_prefix_caching = false;
  auto m = Make(o);
  ASSERT_EQ(*m->AddSequence(1, Iota(9)), 0);
  ASSERT_TRUE(Step(*m, 1, 9));
  m->Free(1);
  ASSERT_EQ(*m->AddSequence(2, Iota(9)), 0);
  EXPECT_EQ(m->stats().cached_blocks, 0);
  ExpectValid(*m);
  m->Free(2);
}

TEST_F(KvCacheManagerTest, ReserveFailsWithoutSideEffectsWhenThePoolIsExhausted) {
  auto m = Make(TinyOptions(/*initial_chunks=*/1, /*max_chunks=*/2));  // 8 blocks
  ASSERT_EQ(*m->AddSequence(1, Iota(40)), 0);
  ASSERT_TRUE(m->Reserve(1, 28));  // 7 blocks
  EXPECT_EQ(m->NumObtainableBlocks(), 1);
  const KvCacheStats before = m->stats();
  EXPECT_FALSE(m->Reserve(1, 36));  // needs 2 more
  EXPECT_EQ(m->BlockIds(1).size(), 7u);
  EXPECT_EQ(m->stats().free_blocks, before.free_blocks);
  EXPECT_TRUE(m->Reserve(1, 32));
  ExpectValid(*m);
  m->Free(1);
}

TEST_F(KvCacheManagerTest, GrowsBeforeEvictingAndEvictsLeastRecentlyUsedFirst) {
  auto m = Make(TinyOptions(1, 2));  // 4 blocks, growing to 8
  // Two finished sequences leave 3 cached blocks each; A finished before B.
  ASSERT_EQ(*m->AddSequence(1, Iota(13, 100)), 0);
  ASSERT_TRUE(Step(*m, 1, 12));
  m->Free(1);
  ASSERT_EQ(*m->AddSequence(2, Iota(13, 200)), 0);
  ASSERT_TRUE(Step(*m, 2, 12));
  EXPECT_EQ(m->stats().num_chunks, 2);  // grew instead of evicting A's blocks
  m->Free(2);
  EXPECT_EQ(m->stats().evictions, 0);
  EXPECT_EQ(m->stats().cached_blocks, 6);
  // Taking 3 blocks: the 2 free ones, then the least recently used cached block: A's
  // tail block (a sequence releases its tail first), so A's first two blocks still hit.
  ASSERT_EQ(*m->AddSequence(3, Iota(12, 300)), 0);
  ASSERT_TRUE(m->Reserve(3, 12));
  EXPECT_EQ(m->stats().evictions, 1);
  EXPECT_EQ(m->ProbePrefix(Iota(13, 100)), 8);
  EXPECT_EQ(m->ProbePrefix(Iota(13, 200)), 12);
  ExpectValid(*m);
  m->Free(3);
}

TEST_F(KvCacheManagerTest, GrowthFailureOfTheBackendIsCapacityNotError) {
  auto m = Make(TinyOptions(1, 4));
  backend_.FailAllocationsAfter(backend_.num_allocations());
  ASSERT_EQ(*m->AddSequence(1, Iota(30)), 0);
  EXPECT_FALSE(m->Reserve(1, 30));  // 8 blocks; the arena cannot grow past 4
  EXPECT_EQ(m->BlockIds(1).size(), 0u);
  EXPECT_EQ(m->NumObtainableBlocks(), 4);
  EXPECT_TRUE(m->Reserve(1, 16));
  ExpectValid(*m);
  m->Free(1);
}

// On a backend that reports its device's memory, the arena adds no chunk that would leave
// less than the headroom free: the growth fails as when the device is full (counted, its
// reason kept), nothing is allocated, and the blocks already there are still handed out.
TEST_F(KvCacheManagerTest, GrowthStopsWhereAChunkWouldTakeTheDeviceHeadroom) {
  KvCacheOptions o = TinyOptions(1, 4);  // chunks of 4 blocks (1024 bytes), up to 4
  o.device_headroom_bytes = 4096;
  auto m = Make(o);
  // Room for one more chunk above the headroom, exactly.
  backend_.SimulateDevice(backend_.live_bytes() + 1024 + 4096);
  ASSERT_EQ(*m->AddSequence(1, Iota(30)), 0);
  ASSERT_TRUE(m->Reserve(1, 30));  // 8 blocks: the second chunk
  EXPECT_EQ(m->stats().chunk_growth_failures, 0);
  EXPECT_FALSE(m->stats().chunk_growth_stopped);
  const int64_t allocations = backend_.num_allocations();
  ASSERT_EQ(*m->AddSequence(2, Iota(16, 500)), 0);
  EXPECT_FALSE(m->Reserve(2, 16));  // a third chunk would leave 3072 bytes free
  EXPECT_EQ(backend_.num_allocations(), allocations);
  const KvCacheStats stats = m->stats();
  EXPECT_EQ(stats.chunk_growth_failures, 1);
  EXPECT_TRUE(stats.chunk_growth_stopped);
  EXPECT_EQ(stats.total_blocks, 8);
  EXPECT_THAT(stats.last_growth_error,
              ::testing::HasSubstr("allocating KV arena chunk 3 of 4 (1024 bytes) would leave "
                                   "3072 bytes of device memory free, under the 4096 kept"));
  EXPECT_EQ(m->NumObtainableBlocks(), 0);
  ExpectValid(*m);
  m->Free(1);
  EXPECT_TRUE(m->Reserve(2, 16));
  ExpectValid(*m);
  m->Free(2);
}

// After a failed growth the arena tries one chunk again each growth_retry_interval, counted
// from the first Tick() that sees the failure, until one is added; meanwhile no room it
// does not have is counted as obtainable.
TEST_F(KvCacheManagerTest, GrowthIsTriedAgainEachRetryIntervalUntilAChunkIsAdded) {
  KvCacheOptions o = TinyOptions(1, 4);
  o.growth_retry_interval = absl::Seconds(10);
  auto m = MakeStoppedAtTheHeadroom(o);
  const int64_t allocations = backend_.num_allocations();
  auto expect_stopped = [&](int64_t failures) {
    const KvCacheStats stats = m->stats();
    EXPECT_EQ(stats.chunk_growth_failures, failures);
    EXPECT_TRUE(stats.chunk_growth_stopped);
    EXPECT_EQ(stats.total_blocks, 8);
    EXPECT_EQ(m->NumObtainableBlocks(), 0);
    EXPECT_EQ(backend_.num_allocations(), allocations);
    ExpectValid(*m);
  };

  m->Tick();  // sees the failure: the interval starts
  clock_.Advance(absl::Seconds(9));
  m->Tick();
  expect_stopped(1);
  clock_.Advance(absl::Seconds(1));
  m->Tick();  // tries, and the device still has no room
  expect_stopped(2);
  EXPECT_FALSE(m->Reserve(2, 16));
  expect_stopped(2);  // Reserve does not try again either

  backend_.SimulateDevice(backend_.live_bytes() + 2048 + 4096);  // room for two chunks now
  clock_.Advance(absl::Seconds(9));
  m->Tick();
  expect_stopped(2);
  clock_.Advance(absl::Seconds(1));
  m->Tick();  // adds one chunk, and growth goes on from there
  KvCacheStats stats = m->stats();
  EXPECT_EQ(stats.chunk_growth_failures, 2);
  EXPECT_FALSE(stats.chunk_growth_stopped);
  EXPECT_EQ(stats.total_blocks, 12);
  EXPECT_EQ(m->NumObtainableBlocks(), 8);  // this chunk and the next
  EXPECT_EQ(backend_.num_allocations(), allocations + 1);
  EXPECT_TRUE(m->Reserve(2, 16));  // without sequence 1 giving anything up
  ExpectValid(*m);
  ASSERT_EQ(*m->AddSequence(3, Iota(16, 900)), 0);
  EXPECT_TRUE(m->Reserve(3, 16));  // the fourth chunk, grown on demand
  EXPECT_EQ(m->stats().total_blocks, 16);
  ExpectValid(*m);
  m->Free(1);
  m->Free(2);
  m->Free(3);
}

// No try while defragmentation would shrink the pool: it needs no chunk, and the release
// lifts the stop.
TEST_F(KvCacheManagerTest, NoGrowthIsTriedWhileDefragmentationWouldShrinkThePool) {
  KvCacheOptions o = TinyOptions(1, 4);
  o.growth_retry_interval = absl::Seconds(10);
  o.enable_defrag = true;
  o.defrag_interval = absl::Hours(1000);  // one step, at the first Tick, then none
  auto m = MakeStoppedAtTheHeadroom(o);
  m->Tick();  // sees the failure; 8 blocks in use, nothing to shrink
  m->Free(1);
  m->Free(2);  // nothing in use: the pool would shrink
  backend_.SimulateDevice(backend_.live_bytes() + 4096 + 4096);
  const int64_t allocations = backend_.num_allocations();
  clock_.Advance(absl::Seconds(30));
  m->Tick();
  EXPECT_EQ(backend_.num_allocations(), allocations);
  EXPECT_EQ(m->stats().chunk_growth_failures, 1);
  EXPECT_EQ(m->stats().total_blocks, 8);
  ExpectValid(*m);
}

// Without a retry interval (the library's default) a failed growth stops the arena until a
// chunk is released, however long it runs.
TEST_F(KvCacheManagerTest, WithoutARetryIntervalGrowthWaitsForARelease) {
  KvCacheOptions o = TinyOptions(1, 4);
  ASSERT_EQ(o.growth_retry_interval, absl::InfiniteDuration());
  auto m = MakeStoppedAtTheHeadroom(o);
  backend_.SimulateDevice(backend_.live_bytes() + 4096 + 4096);
  for (int i = 0; i < 3; ++i) {
    m->Tick();
    clock_.Advance(absl::Hours(1000));
  }
  EXPECT_EQ(m->stats().chunk_growth_failures, 1);
  EXPECT_EQ(m->stats().total_blocks, 8);
  EXPECT_EQ(m->NumObtainableBlocks(), 0);
  m->Free(1);
  m->Free(2);
}

// The device is full: the arena cannot add the chunk NumObtainableBlocks() counted. A
// Reserve that would have fitted with it fails without giving up a session's pins or a
// cached block for room that was never there.
TEST_F(KvCacheManagerTest, AFailedGrowthGivesUpNoSessionAndNoCachedBlock) {
  auto m = Make(TinyOptions(1, 2));  // 4 blocks, may grow to 8
  ASSERT_TRUE(m->AddSequence(1, Iota(8, 100), "a").ok());
  ASSERT_TRUE(Step(*m, 1, 8));
  m->Free(1);  // session "a" pins 2 keyed blocks
  ASSERT_TRUE(m->AddSequence(2, Iota(8, 200)).ok());
  ASSERT_TRUE(Step(*m, 2, 8));
  m->Free(2);  // 2 cached blocks: chunk 0 is full
  const KvCacheStats before = m->stats();
  ASSERT_EQ(before.pinned_blocks, 2);
  ASSERT_EQ(before.num_prefix_keys, 4);
  backend_.FailAllocationsAfter(backend_.num_allocations());
  ASSERT_TRUE(m->AddSequence(3, Iota(29, 300)).ok());
  // 7 blocks: 2 cached + 4 to grow + 2 pinned would do; without the growth only 4 are there.
  EXPECT_FALSE(m->Reserve(3, 28));
  const KvCacheStats after = m->stats();
  EXPECT_EQ(after.num_sessions, 1);
  EXPECT_EQ(after.pinned_blocks, 2);
  EXPECT_EQ(after.session_releases_pressure, 0);
  EXPECT_EQ(after.num_prefix_keys, 4);
  EXPECT_EQ(after.evictions, 0);
  EXPECT_EQ(before.chunk_growth_failures, 0);
  EXPECT_EQ(after.chunk_growth_failures, 1);
  EXPECT_THAT(after.last_growth_error, ::testing::HasSubstr("allocating KV arena chunk 2 of 2"));
  EXPECT_EQ(m->ProbePrefix(Iota(9, 100), "a"), 8);
  EXPECT_EQ(m->ProbePrefix(Iota(9, 200)), 8);
  EXPECT_TRUE(m->BlockIds(3).empty());
  ExpectValid(*m);
  // What is there is still handed out: 4 blocks, the cached ones first, then the session's.
  EXPECT_TRUE(m->Reserve(3, 16));
  EXPECT_EQ(m->stats().session_releases_pressure, 1);
  ExpectValid(*m);
  m->Free(3);
}

// A preempted sequence's return (Admission::kRecompute) finds its own blocks again, the
// tokens it generated among them; that is no lookup of a prompt a client sent, so it counts
// nothing, where a first admission of the same tokens counts its lookup and hits.
TEST_F(KvCacheManagerTest, ARecomputeAdmissionCountsNoLookupOrHit) {
  auto m = Make(TinyOptions(2, 2));
  ASSERT_TRUE(m->AddSequence(1, Iota(8, 100)).ok());
  ASSERT_TRUE(Step(*m, 1, 8));
  m->AppendTokens(1, Iota(5, 108));  // generated
  ASSERT_TRUE(Step(*m, 1, 4));
  const KvCacheStats before = m->stats();
  ASSERT_EQ(before.prefix_query_tokens, 8);
  m->FreeForRecompute(1);
  const std::vector<int32_t> recompute = Iota(13, 100);  // prompt + generated
  ASSERT_EQ(*m->AddSequence(1, recompute, "", KvCacheManager::Admission::kRecompute), 12);
  ASSERT_TRUE(Step(*m, 1, 1));
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.prefix_query_tokens, 8);
  EXPECT_EQ(st.prefix_hit_tokens, before.prefix_hit_tokens);
  ExpectValid(*m);
  ASSERT_EQ(*m->AddSequence(2, recompute), 12);
  ASSERT_TRUE(Step(*m, 2, 1));
  st = m->stats();
  EXPECT_EQ(st.prefix_query_tokens, 8 + 13);
  EXPECT_EQ(st.prefix_hit_tokens, before.prefix_hit_tokens + 12);
  ExpectValid(*m);
  m->Free(1);
  m->Free(2);
}

// The engine admits by AddSequence + Reserve and undoes it (Abandon) when Reserve finds no
// room, retrying on later steps: only the admission that stands counts its hits.
TEST_F(KvCacheManagerTest, AnAdmissionUndoneForWantOfRoomCountsNoHits) {
  auto m = MakeCachedPrefixAndOneFreeBlock();
  KvCacheStats st = m->stats();
  ASSERT_EQ(st.prefix_query_tokens, 28);
  ASSERT_EQ(st.prefix_hit_tokens, 0);
  const std::vector<int32_t> prompt = Iota(20, 100);  // its first 8 tokens are cached
  for (int attempt = 0; attempt < 3; ++attempt) {
    ASSERT_EQ(*m->AddSequence(3, prompt), 8);
    ASSERT_FALSE(m->Reserve(3, 12));  // 3 blocks; 1 is free
    m->Abandon(3);
  }
  st = m->stats();
  EXPECT_EQ(st.prefix_query_tokens, 28);
  EXPECT_EQ(st.prefix_hit_tokens, 0);
  m->Free(2);
  ASSERT_EQ(*m->AddSequence(3, prompt), 8);
  ASSERT_TRUE(m->Reserve(3, 12));
  st = m->stats();
  EXPECT_EQ(st.prefix_query_tokens, 48);
  EXPECT_EQ(st.prefix_hit_tokens, 8);
  ExpectValid(*m);
  m->Free(3);
}

// Admission control's view of a prompt: the blocks AddSequence would take instead of new
// ones, and which of them are evictable, counted as obtainable until a sequence holds them.
TEST_F(KvCacheManagerTest, ProbePrefixBlocksTellsWhichMatchedBlocksAreEvictable) {
  auto m = Make(TinyOptions(2, 2));  // 8 blocks of 4 tokens, no growth
  ASSERT_TRUE(m->AddSequence(1, Iota(12, 100)).ok());
  ASSERT_TRUE(Step(*m, 1, 12));
  m->Free(1);  // 3 cached blocks
  const std::vector<int32_t> prompt = Iota(14, 100);
  KvCacheManager::PrefixProbe p = m->ProbePrefixBlocks(prompt);
  EXPECT_EQ(p.computed_tokens, 12);
  EXPECT_EQ(p.matched_blocks, 3);
  EXPECT_EQ(p.evictable_blocks, 3);
  // Holding them takes exactly the evictable ones out of the obtainable pool.
  const int64_t obtainable = m->NumObtainableBlocks();
  ASSERT_EQ(*m->AddSequence(2, prompt), 12);
  EXPECT_EQ(m->NumObtainableBlocks(), obtainable - p.evictable_blocks);
  // Now held by a live sequence: matched, not evictable.
  p = m->ProbePrefixBlocks(prompt);
  EXPECT_EQ(p.matched_blocks, 3);
  EXPECT_EQ(p.evictable_blocks, 0);
  m->Free(2);
  // A session's chain is pinned: its blocks, the partial last one included, are matched and
  // never evictable; through the prefix index only its full block is found.
  ASSERT_TRUE(m->AddSequence(3, Iota(6, 500), "chat").ok());
  ASSERT_TRUE(Step(*m, 3, 6));
  m->Free(3);
  std::vector<int32_t> turn2 = Iota(6, 500);
  turn2.push_back(7);
  p = m->ProbePrefixBlocks(turn2, "chat");
  EXPECT_EQ(p.computed_tokens, 6);
  EXPECT_EQ(p.matched_blocks, 2);
  EXPECT_EQ(p.evictable_blocks, 0);
  EXPECT_EQ(m->ProbePrefix(turn2, "chat"), 6);
  p = m->ProbePrefixBlocks(turn2);
  EXPECT_EQ(p.computed_tokens, 4);
  EXPECT_EQ(p.matched_blocks, 1);
  EXPECT_EQ(p.evictable_blocks, 0);
  EXPECT_EQ(m->ProbePrefixBlocks({}).matched_blocks, 0);
  ExpectValid(*m);
}

// The copy's block ids have room in the arena from the start, so a fork needs no
// allocation from a device that has none left.
TEST_F(KvCacheManagerTest, ForkNeedsNoNewDeviceMemory) {
  auto m = Make(TinyOptions());
  ASSERT_EQ(*m->AddSequence(1, Iota(6)), 0);
  ASSERT_TRUE(Step(*m, 1, 6));
  backend_.FailAllocationsAfter(backend_.num_allocations());
  ASSERT_TRUE(m->Fork(1, 2).ok());
  EXPECT_EQ(CountBadKv(*m, 2), 0);
  ExpectValid(*m);
  m->Free(1);
  m->Free(2);
}

TEST(KvPoolGeometryTest, RoundsUpAnInitialSizeAsLargeAsInt64AllowsWithoutOverflow) {
  KvCacheOptions o = TinyOptions();
  o.block_size = 1024;
  o.chunk_bytes = int64_t{1} << 43;  // 1024 blocks of 8 GiB
  o.initial_pool_bytes = o.max_pool_bytes = std::numeric_limits<int64_t>::max();
  ASSERT_TRUE(o.Validate().ok());
  absl::StatusOr<KvLayout> layout = KvLayout::Create(KvShape{1, 1, 1 << 20}, DType::kF32, 1024);
  ASSERT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<KvPoolGeometry> g = KvPoolGeometry::Compute(o, *layout);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->max_chunks, (int64_t{1} << 20) - 1);
  EXPECT_EQ(g->initial_chunks, g->max_chunks);
}

TEST(KvPoolGeometryTest, TooManyChunksOrBlocksNamesTheCountsAndTheLimits) {
  KvCacheOptions o = TinyOptions();
  absl::StatusOr<KvLayout> layout = KvLayout::Create(TinyShape(), o.kv_dtype, o.block_size);
  ASSERT_TRUE(layout.ok()) << layout.status();
  o.chunk_bytes = layout->block_bytes();  // one block per chunk
  o.initial_pool_bytes = o.chunk_bytes;
  o.max_pool_bytes = o.chunk_bytes * ((int64_t{1} << 20) + 1);
  const absl::StatusOr<KvPoolGeometry> g = KvPoolGeometry::Compute(o, *layout);
  ASSERT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.status().message(),
            absl::StrFormat("max_pool_bytes: %d makes 1048577 chunks of %d bytes, 1048577 KV "
                            "blocks of %d bytes; allowed: at most 1048576 chunks and "
                            "1073741824 blocks",
                            o.max_pool_bytes, o.chunk_bytes, o.chunk_bytes));
}

TEST_F(KvCacheManagerTest, ForkSharesFullBlocksAndCopiesThePartialOne) {
  auto m = Make(TinyOptions());
  ASSERT_EQ(*m->AddSequence(1, Iota(6)), 0);
  ASSERT_TRUE(Step(*m, 1, 6));
  ASSERT_TRUE(m->Fork(1, 2).ok());
  EXPECT_EQ(m->BlockIds(2)[0], m->BlockIds(1)[0]);
  EXPECT_NE(m->BlockIds(2)[1], m->BlockIds(1)[1]);
  EXPECT_EQ(backend_.num_copied_blocks(), 1);
  EXPECT_EQ(m->stats().fork_copies, 1);
  EXPECT_EQ(CountBadKv(*m, 2), 0);  // the copy holds the parent's bytes
  // Two tables of two blocks in three blocks: the full one is shared.
  EXPECT_EQ(m->stats().used_blocks, 3);
  EXPECT_EQ(m->stats().block_references, 4);
  EXPECT_EQ(m->stats().shared_blocks, 1);
  // The two now diverge without disturbing each other.
  m->AppendTokens(1, {7});
  m->AppendTokens(2, {8});
  ASSERT_TRUE(Step(*m, 1, 1));
  ASSERT_TRUE(Step(*m, 2, 1));
  EXPECT_EQ(CountBadKv(*m, 1), 0);
  EXPECT_EQ(CountBadKv(*m, 2), 0);
  ExpectValid(*m);
  m->Free(1);
  m->Free(2);
  ExpectValid(*m);
}

// Prefix sharing as the stats report it: a second prompt that hits the first's two full
// blocks holds them too, so three tables' worth of blocks (3 + 3) live in four.
TEST_F(KvCacheManagerTest, StatsCountTheBlocksPrefixSharingSaves) {
  auto m = Make(TinyOptions());
  ASSERT_EQ(*m->AddSequence(1, Iota(9)), 0);
  ASSERT_TRUE(Step(*m, 1, 9));
  ASSERT_EQ(*m->AddSequence(2, Iota(9)), 8);
  ASSERT_TRUE(Step(*m, 2, 1));
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.used_blocks, 4);
  EXPECT_EQ(st.block_references, 6);
  EXPECT_EQ(st.shared_blocks, 2);
  ExpectValid(*m);
  m->Free(1);  // its blocks stay with the second sequence, or cached
  st = m->stats();
  EXPECT_EQ(st.block_references, st.used_blocks);
  EXPECT_EQ(st.shared_blocks, 0);
  m->Free(2);
  EXPECT_EQ(m->stats().block_references, 0);
  ExpectValid(*m);
}

TEST_F(KvCacheManagerTest, ForkOfABlockAlignedSequenceCopiesNothing) {
  auto m = Make(TinyOptions());
  ASSERT_EQ(*m->AddSequence(1, Iota(8)), 0);
  ASSERT_TRUE(Step(*m, 1, 8));
  ASSERT_TRUE(m->Fork(1, 2).ok());
  EXPECT_EQ(Blocks(*m, 2), Blocks(*m, 1));
  EXPECT_EQ(backend_.num_copy_calls(), 0);
  m->Free(2);
  m->Free(1);
}

TEST_F(KvCacheManagerTest, ForkWithoutAFreeBlockChangesNothing) {
  auto m = Make(TinyOptions(1, 1));  // 4 blocks
  ASSERT_EQ(*m->AddSequence(1, Iota(16)), 0);
  ASSERT_TRUE(Step(*m, 1, 15));
  EXPECT_EQ(m->Fork(1, 2).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(m->HasSequence(2));
  ExpectValid(*m);
  m->Free(1);
}

TEST_F(KvCacheManagerTest, NullBackendGivesAnIdOnlyCache) {
  auto m = KvCacheManager::Create(TinyOptions(), TinyShape(), nullptr, &clock_);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(*(*m)->AddSequence(1, Iota(6)), 0);
  ASSERT_TRUE((*m)->Reserve(1, 6));
  (*m)->MarkComputed(1, 6);
  ASSERT_TRUE((*m)->Fork(1, 2).ok());
  EXPECT_EQ((*m)->arena(), nullptr);
  (*m)->Free(1);
  (*m)->Free(2);
}

TEST_F(KvCacheManagerTest, AddSequenceErrorsChangeNothing) {
  auto m = Make(TinyOptions());
  EXPECT_EQ(m->AddSequence(1, {}).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->AddSequence(1, Iota(3)).ok());
  EXPECT_EQ(m->AddSequence(1, Iota(3)).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(m->AddSequence(2, Iota(3), "s").ok());
  EXPECT_EQ(m->AddSequence(3, Iota(3), "s").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(m->HasSequence(3));
  ExpectValid(*m);
}

TEST_F(KvCacheManagerTest, LayerViewDescribesTheArena) {
  auto m = Make(TinyOptions());
  const KvCacheView v = m->LayerView(1);
  EXPECT_EQ(v.num_chunks, 1);
  EXPECT_EQ(v.chunk_shift, 2);
  EXPECT_EQ(v.block_bytes, 64);
  EXPECT_EQ(v.k_offset_bytes, 2 * 256);
  EXPECT_EQ(v.v_offset_bytes, 3 * 256);
  EXPECT_EQ(v.num_kv_heads, 1);
  EXPECT_EQ(v.block_size, 4);
  EXPECT_EQ(v.head_dim, 4);
  EXPECT_NE(v.chunks[0], nullptr);
}

TEST_F(KvCacheManagerTest, DestructionReturnsAllMemory) {
  {
    auto m = Make(TinyOptions());
    ASSERT_TRUE(m->AddSequence(1, Iota(30), "s").ok());
    ASSERT_TRUE(Step(*m, 1, 20));
    ASSERT_TRUE(m->AddSequence(2, Iota(5, 500)).ok());
    ASSERT_TRUE(Step(*m, 2, 4));
  }
  EXPECT_EQ(backend_.live_buffers(), 0);
}

}  // namespace
}  // namespace kvd
