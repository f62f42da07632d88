#include "cache/defragmenter.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "gtest/gtest.h"
#include "tests/cache/fake_backend.h"
#include "tests/cache/kv_test_util.h"

namespace kvd {
namespace {

using testing_util::CountBadKv;
using testing_util::Iota;
using testing_util::Step;
using testing_util::TinyOptions;
using testing_util::TinyShape;

constexpr BlockState F = BlockState::kFree;
constexpr BlockState C = BlockState::kCached;
constexpr BlockState U = BlockState::kUsed;

TEST(DefragmenterPlanTest, MovesTopChunkBlocksIntoFreeSlotsThenCachedSlotsLowestFirst) {
  DefragSnapshot s{2, 3, {U, C, F, U, /**/ F, C, U, U, /**/ U, F, C, U}};
  const std::vector<BlockMove> plan = Defragmenter::Plan(s);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].src, 8);
  EXPECT_EQ(plan[0].dst, 2);
  EXPECT_EQ(plan[1].src, 11);
  EXPECT_EQ(plan[1].dst, 4);
  s.state = {U, C, U, U, /**/ U, C, U, U, /**/ U, F, C, U};
  const std::vector<BlockMove> evicting = Defragmenter::Plan(s);
  ASSERT_EQ(evicting.size(), 2u);
  EXPECT_EQ(evicting[0].dst, 1);
  EXPECT_EQ(evicting[1].dst, 5);
}

// With the pool to shrink to one chunk, a block from the top goes to chunk 0, evicting a
// cached block there, and not to a free slot in chunk 1, which would drain next and move
// it a second time.
TEST(DefragmenterPlanTest, FillsTheChunksToKeepFirst) {
  DefragSnapshot s{2, 3, {U, C, U, C, /**/ F, F, U, C, /**/ U, F, U, F}};
  std::vector<BlockMove> plan = Defragmenter::Plan(s);  // keep every chunk below the top
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].dst, 4);
  EXPECT_EQ(plan[1].dst, 5);
  s.keep_chunks = 1;
  plan = Defragmenter::Plan(s);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].src, 8);
  EXPECT_EQ(plan[0].dst, 1);
  EXPECT_EQ(plan[1].src, 10);
  EXPECT_EQ(plan[1].dst, 3);
  // Keeping every chunk, or more than there are, is the plan without keep_chunks.
  for (const int32_t keep : {2, 3, 9}) {
    s.keep_chunks = keep;
    plan = Defragmenter::Plan(s);
    ASSERT_EQ(plan.size(), 2u) << keep;
    EXPECT_EQ(plan[0].dst, 4) << keep;
    EXPECT_EQ(plan[1].dst, 5) << keep;
  }
  // Never a slot of the top chunk, however many are to be kept.
  DefragSnapshot cached_below{2, 3, {U, C, U, C, /**/ U, C, U, C, /**/ U, F, U, F}, 9};
  plan = Defragmenter::Plan(cached_below);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].dst, 1);
  EXPECT_EQ(plan[1].dst, 3);
  s.keep_chunks = 1;
  // Where the kept chunks cannot take them all, the rest go above them as before.
  s.state = {U, C, U, U, /**/ F, F, U, C, /**/ U, F, U, F};
  plan = Defragmenter::Plan(s);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].dst, 1);
  EXPECT_EQ(plan[1].dst, 4);
}

TEST(DefragmenterPlanTest, PlansNothingWhenTheTopChunkCannotBeEmptied) {
  DefragSnapshot s{1, 2, {U, U, /**/ U, U}};
  EXPECT_TRUE(Defragmenter::Plan(s).empty());
  s.state = {U, F, /**/ U, U};
  EXPECT_TRUE(Defragmenter::Plan(s).empty());
  EXPECT_TRUE(Defragmenter::Plan(DefragSnapshot{1, 1, {U, F}}).empty());
}

TEST(DefragmenterTest, PlansOnItsOwnThread) {
  absl::Mutex mu;
  std::vector<std::thread::id> planners;
  Defragmenter d(DefragOptions{.before_plan = [&] {
    absl::MutexLock lock(&mu);
    planners.push_back(std::this_thread::get_id());
  }});
  d.Submit(DefragSnapshot{1, 2, {F, F, U, F}});
  EXPECT_TRUE(d.busy());
  d.Submit(DefragSnapshot{1, 2, {U, U, U, U}});  // ignored while busy
  d.WaitForPlan();
  std::optional<std::vector<BlockMove>> plan = d.TakePlan();
  ASSERT_TRUE(plan.has_value());
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].src, 2);
  EXPECT_EQ((*plan)[0].dst, 0);
  EXPECT_FALSE(d.busy());
  EXPECT_FALSE(d.TakePlan().has_value());
  absl::MutexLock lock(&mu);
  ASSERT_EQ(planners.size(), 1u);  // the second snapshot was not planned
  EXPECT_NE(planners[0], std::this_thread::get_id());
}

TEST(DefragmenterTest, PlansInlineWithoutBackgroundPlanning) {
  std::vector<std::thread::id> planners;
  Defragmenter d(DefragOptions{.background_planning = false, .before_plan = [&] {
                                 planners.push_back(std::this_thread::get_id());
                               }});
  d.Submit(DefragSnapshot{1, 2, {F, F, U, F}});
  EXPECT_EQ(planners, std::vector<std::thread::id>{std::this_thread::get_id()});
  std::optional<std::vector<BlockMove>> plan = d.TakePlan();  // ready when Submit returns
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->size(), 1u);
}

TEST(DefragmenterTest, PauseStatsSummarizeRecordedPauses) {
  Defragmenter d(DefragOptions{.background_planning = false, .before_plan = nullptr});
  EXPECT_EQ(d.RecentPauseQuantiles().p99, absl::ZeroDuration());  // none yet
  // Recorded out of order: the quantiles select, whatever the order.
  for (int i = 1; i <= 100; ++i) d.RecordPause(absl::Microseconds((i * 37) % 100 + 1), 2);
  const DefragPauseStats s = d.pause_stats();
  EXPECT_EQ(s.num_pauses, 100);
  EXPECT_EQ(s.num_moves, 200);
  EXPECT_EQ(s.max, absl::Microseconds(100));
  const DefragPauseQuantiles q = d.RecentPauseQuantiles();
  EXPECT_EQ(q.p50, absl::Microseconds(50));
  EXPECT_EQ(q.p99, absl::Microseconds(99));
  EXPECT_EQ(s.total, absl::Microseconds(5050));
  EXPECT_EQ(s.bucket_counts[0], 50);  // <= 50 us
  EXPECT_EQ(s.bucket_counts[1], 50);  // <= 100 us
  d.RecordPause(absl::Seconds(1), 1);
  EXPECT_EQ(d.pause_stats().bucket_counts.back(), 1);  // above every bound
}

TEST(DefragmenterTest, PauseQuantilesCoverOnlyTheLastWindow) {
  Defragmenter d(DefragOptions{.background_planning = false, .before_plan = nullptr});
  for (int i = 0; i < Defragmenter::kPauseWindow; ++i) d.RecordPause(absl::Milliseconds(1), 1);
  for (int i = 0; i < Defragmenter::kPauseWindow - 1; ++i) d.RecordPause(absl::Microseconds(1), 1);
  EXPECT_EQ(d.RecentPauseQuantiles().p50, absl::Microseconds(1));
  EXPECT_EQ(d.RecentPauseQuantiles().p99, absl::Microseconds(1));
  EXPECT_EQ(d.pause_stats().max, absl::Milliseconds(1));  // the counters keep every pause
  EXPECT_EQ(d.pause_stats().num_pauses, 2 * Defragmenter::kPauseWindow - 1);
}

class DefragManagerTest : public ::testing::TestWithParam<bool> {
 protected:
  FakeBackend backend_;
  FakeClock clock_;
};

// A pool grown to 4 chunks by a burst shrinks back to its initial chunk once the load
// ends, a bounded number of moves per step, and every survivor keeps its KV bytes.
TEST_P(DefragManagerTest, GrownPoolShrinksBackAndMovesPreserveKv) {
  KvCacheOptions o = TinyOptions(1, 4);
  o.defrag_max_moves_per_step = 2;
  o.defrag_low_water = 0.75;  // shrink while used <= 3/4 of the chunks below the top
  o.defrag_background_planning = GetParam();
  auto m = *KvCacheManager::Create(o, TinyShape(), &backend_, &clock_);
  for (SeqId id = 0; id < 8; ++id) {
    ASSERT_TRUE(m->AddSequence(id, Iota(7, 100 * static_cast<int32_t>(id))).ok());
    ASSERT_TRUE(Step(*m, id, 7));  // 2 blocks each: 16 blocks, 4 chunks
  }
  ASSERT_EQ(m->stats().num_chunks, 4);
  // The load ends except for one survivor, forked so that a block is shared: 3 blocks.
  for (SeqId id : {0, 1, 2, 3, 4, 5, 6}) m->Free(id);
  ASSERT_TRUE(m->Fork(7, 8).ok());
  const int64_t chunk_bytes = m->geometry().chunk_bytes;
  for (int tick = 0; tick < 50 && m->stats().num_chunks > 1; ++tick) {
    m->WaitForDefragPlan();
    m->Tick();
    ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
    for (SeqId id : {7, 8}) ASSERT_EQ(CountBadKv(*m, id), 0) << "tick " << tick;
  }
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_chunks, 1);
  EXPECT_EQ(st.chunks_released, 3);
  EXPECT_GT(st.defrag_moves, 0);
  EXPECT_EQ(st.defrag_pauses.num_moves, st.defrag_moves);
  EXPECT_LE(st.defrag_pauses.num_moves, 2 * st.defrag_pauses.num_pauses);
  EXPECT_EQ(backend_.live_bytes(), chunk_bytes + 4 * int64_t{sizeof(void*)} +
                                       2 * KvArena::kInitialCopyPairs * int64_t{sizeof(int32_t)});
  // The survivors still run.
  m->AppendTokens(8, {1});
  ASSERT_TRUE(Step(*m, 8, 1));
  EXPECT_EQ(CountBadKv(*m, 8), 0);
}

INSTANTIATE_TEST_SUITE_P(InlineAndThreaded, DefragManagerTest, ::testing::Bool());

// The burst-then-idle state of the shrink tests, with the given options. Sequence i holds
// blocks 2i and 2i+1 (chunks of 4 blocks): a prompt of 7 tokens (a full, keyed block and a
// partial one), or of `lengths[i]` (8: two full blocks); all but `survivors` end, leaving
// their full blocks cached and their partial ones free.
std::unique_ptr<KvCacheManager> GrownThenIdle(KvCacheOptions o, Backend* backend, Clock* clock,
                                              std::vector<SeqId> survivors = {7},
                                              std::vector<int32_t> lengths = {}) {
  o.defrag_background_planning = false;
  lengths.resize(8, 7);
  auto m = *KvCacheManager::Create(o, TinyShape(), backend, clock);
  for (SeqId id = 0; id < 8; ++id) {
    EXPECT_TRUE(m->AddSequence(id, Iota(lengths[id], 100 * static_cast<int32_t>(id))).ok());
    EXPECT_TRUE(Step(*m, id, lengths[id]));
  }
  EXPECT_EQ(m->stats().num_chunks, 4);
  for (SeqId id = 0; id < 8; ++id) {
    if (std::find(survivors.begin(), survivors.end(), id) == survivors.end()) m->Free(id);
  }
  return m;
}

// A pool of 4 chunks drains to 1 with each survivor's block moved once: the top chunk's
// blocks go to chunk 0 (a free slot, then a cached one), not to the free slots of chunk 1,
// which drains next.
TEST(DefragManagerLoadTest, ABlockMovesOnceWhileThePoolDrainsToItsLastChunk) {
  FakeBackend backend;
  FakeClock clock;
  KvCacheOptions o = TinyOptions(1, 4);
  o.defrag_low_water = 1.0;
  // Survivors: 1 (blocks 2, 3 in chunk 0) and 7 (14, 15 in chunk 3). Chunk 0 keeps a free
  // slot and a cached block; chunk 1 has two free slots and two cached blocks.
  auto m = GrownThenIdle(o, &backend, &clock, {1, 7});
  for (int tick = 0; tick < 20 && m->stats().num_chunks > 1; ++tick) {
    m->Tick();
    ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  }
  EXPECT_EQ(m->stats().num_chunks, 1);
  EXPECT_EQ(m->stats().defrag_moves, 2);
  for (SeqId id : {1, 7}) EXPECT_EQ(CountBadKv(*m, id), 0);
}

// The same where the pool stops above its initial chunk: at low water 0.75, 6 blocks in use
// shrink a pool of 4 chunks of 4 to 2 (6 <= 0.75 x 8, not <= 0.75 x 4). The top chunk's two
// blocks go to chunks 0 and 1, the two kept: the free slot there first, then a cached one;
// not to the free slots of chunk 2, which drains next, and evicting no more cached blocks
// than the room takes.
TEST(DefragManagerLoadTest, ABlockMovesOnceWhileThePoolDrainsToTheChunksItKeeps) {
  FakeBackend backend;
  FakeClock clock;
  KvCacheOptions o = TinyOptions(1, 4);
  o.defrag_low_water = 0.75;
  // Survivors 1, 3 and 7 hold blocks 2-3, 6-7 and 14-15. Then chunk 0 has two cached
  // blocks (0, 1), chunk 1 one cached and one free (4, 5), chunk 2 two of each.
  auto m = GrownThenIdle(o, &backend, &clock, {1, 3, 7}, {8, 8, 7, 8, 7, 7, 8, 8});
  for (int tick = 0; tick < 20; ++tick) {
    m->Tick();
    ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  }
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_chunks, 2);
  EXPECT_EQ(st.defrag_moves, 2);
  EXPECT_EQ(st.cached_blocks, 2);  // 1 and 4: block 15 took block 0's slot, 14 the free 5
  for (SeqId id : {1, 3, 7}) EXPECT_EQ(CountBadKv(*m, id), 0);
}

// Chunk 0 has room for the top chunk's one used block either way; whether it moves there
// is the low-water mark's call: 4 blocks in use is above 0.5 of the 4 below the top chunk,
// and not above 1.0 of them.
TEST(DefragManagerLoadTest, DoesNotShrinkWhileTheLoadIsHigh) {
  for (const double low_water : {0.5, 1.0}) {
    FakeBackend backend;
    FakeClock clock;
    KvCacheOptions o = TinyOptions(1, 2);  // chunks of 4 blocks
    o.defrag_low_water = low_water;
    auto m = *KvCacheManager::Create(o, TinyShape(), &backend, &clock);
    for (SeqId id = 0; id < 5; ++id) {  // one block each: the fifth grows chunk 1
      ASSERT_TRUE(m->AddSequence(id, Iota(4, 100 * static_cast<int32_t>(id))).ok());
      ASSERT_TRUE(Step(*m, id, 4));
    }
    ASSERT_EQ(m->stats().num_chunks, 2);
    m->Free(0);  // room in chunk 0 (a cached block)
    for (int i = 0; i < 5; ++i) m->Tick();
    EXPECT_EQ(m->stats().num_chunks, low_water < 1 ? 2 : 1) << "low_water " << low_water;
    EXPECT_EQ(m->stats().defrag_moves, low_water < 1 ? 0 : 1) << "low_water " << low_water;
    EXPECT_EQ(CountBadKv(*m, 4), 0);
    EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  }
}

// A block copy that fails part way (a device error) may already have overwritten some of
// its destinations. Cached destinations must lose their keys then: a later prompt with
// their prefix must not be served the overwritten bytes. Nothing else changes, and the
// pool shrinks once copies work again.
TEST(DefragManagerFailureTest, ACopyFailedPartWayEvictsTheCachedBlocksItMayHaveOverwritten) {
  FakeBackend backend;
  FakeClock clock;
  KvCacheOptions o = TinyOptions(1, 4);
  o.defrag_low_water = 0.75;
  auto m = *KvCacheManager::Create(o, TinyShape(), &backend, &clock);
  for (SeqId id = 0; id < 8; ++id) {  // two full, keyed blocks each: 4 chunks
    ASSERT_TRUE(m->AddSequence(id, Iota(8, 100 * static_cast<int32_t>(id))).ok());
    ASSERT_TRUE(Step(*m, id, 8));
  }
  for (SeqId id = 0; id < 7; ++id) m->Free(id);  // every free slot is a cached block
  backend.FailCopiesAfterPairs(1);
  for (int i = 0; i < 3; ++i) m->Tick();
  ASSERT_GT(backend.num_copy_calls(), 0);
  EXPECT_EQ(m->stats().num_chunks, 4);
  EXPECT_EQ(m->stats().defrag_moves, 0);
  EXPECT_EQ(CountBadKv(*m, 7), 0);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  int32_t hits = 0;
  for (SeqId id = 0; id < 7; ++id) {
    const SeqId probe = 100 + id;
    absl::StatusOr<int32_t> computed =
        m->AddSequence(probe, Iota(9, 100 * static_cast<int32_t>(id)));
    ASSERT_TRUE(computed.ok());
    hits += *computed;
    EXPECT_EQ(CountBadKv(*m, probe), 0) << "prefix of sequence " << id;
    m->Free(probe);
  }
  EXPECT_GT(hits, 0);  // not everything was evicted
  backend.FailCopiesAfterPairs(-1);
  for (int i = 0; i < 50 && m->stats().num_chunks > 1; ++i) m->Tick();
  EXPECT_EQ(m->stats().num_chunks, 1);
  EXPECT_EQ(CountBadKv(*m, 7), 0);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
}

TEST(DefragManagerPacingTest, StepsNoMoreOftenThanTheInterval) {
  FakeBackend backend;
  FakeClock clock;
  KvCacheOptions o = TinyOptions(1, 4);
  o.defrag_interval = absl::Seconds(1);
  o.defrag_low_water = 0.75;
  auto m = GrownThenIdle(o, &backend, &clock);
  m->Tick();  // the first step may run at once
  const int64_t after_first = m->stats().defrag_pauses.num_pauses + m->stats().chunks_released;
  for (int i = 0; i < 10; ++i) m->Tick();  // same instant: all skipped
  EXPECT_EQ(m->stats().defrag_pauses.num_pauses + m->stats().chunks_released, after_first);
  for (int i = 0; i < 40 && m->stats().num_chunks > 1; ++i) {
    clock.Advance(absl::Seconds(1));
    m->Tick();
  }
  EXPECT_EQ(m->stats().num_chunks, 1);
}

TEST(DefragManagerPacingTest, PauseBudgetLimitsMovesPerStep) {
  FakeBackend backend;
  FakeClock clock;
  KvCacheOptions o = TinyOptions(1, 4);
  o.defrag_max_moves_per_step = 64;
  o.defrag_max_pause = absl::Nanoseconds(1);  // below the cost of any move
  o.defrag_low_water = 1.0;  // shrink while the survivors fit below the top chunk
  // Survivors in chunks 2 and 3: blocks 8, 9 and 14, 15 must all move down.
  auto m = GrownThenIdle(o, &backend, &clock, {4, 7});
  for (int i = 0; i < 50 && m->stats().num_chunks > 1; ++i) m->Tick();
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_chunks, 1);
  // Each block moves once, into chunk 0. The first pause, before any cost is known, moves
  // the top chunk's two blocks at once (and returns the chunk); after it a pause moves one
  // block: two pauses for chunk 2's (the second returns it), then one returns chunk 1.
  EXPECT_EQ(st.defrag_moves, 4);
  EXPECT_EQ(st.defrag_pauses.num_pauses, 4);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(DefragManagerPacingTest, ReturningAnEmptyChunkIsAPauseToo) {
  // The engine waits for a chunk's release (on a GPU, freeing device memory waits for the
  // device): a step that only returns a chunk is recorded as a pause with no moves.
  FakeBackend backend;
  FakeClock clock;
  KvCacheOptions o = TinyOptions(1, 4);
  o.defrag_low_water = 1.0;
  auto m = GrownThenIdle(o, &backend, &clock, /*survivors=*/{});
  for (int i = 0; i < 50 && m->stats().num_chunks > 1; ++i) m->Tick();
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_chunks, 1);
  EXPECT_EQ(st.chunks_released, 3);
  EXPECT_EQ(st.defrag_moves, 0);
  EXPECT_EQ(st.defrag_pauses.num_pauses, 3);
  EXPECT_EQ(st.defrag_pauses.num_moves, 0);
}

TEST(DefragManagerPacingTest, APauseBudgetBeyondAnyMoveCountLimitsNothing) {
  // Budgets over the measured cost per move: a second, and ones whose move count is more
  // than an int64 holds (hours; infinite). None may wrap into one move per pause.
  std::vector<int64_t> pauses;
  for (const absl::Duration budget :
       {absl::Seconds(1), absl::Hours(int64_t{1} << 40), absl::InfiniteDuration()}) {
    SCOPED_TRACE(absl::FormatDuration(budget));
    FakeBackend backend;
    FakeClock clock;
    KvCacheOptions o = TinyOptions(1, 4);
    o.defrag_max_moves_per_step = 64;
    o.defrag_max_pause = budget;
    o.defrag_low_water = 1.0;
    auto m = GrownThenIdle(o, &backend, &clock, {4, 7});
    for (int i = 0; i < 50 && m->stats().num_chunks > 1; ++i) m->Tick();
    const KvCacheStats st = m->stats();
    EXPECT_EQ(st.num_chunks, 1);
    EXPECT_LT(st.defrag_pauses.num_pauses, st.defrag_moves);  // some pause moved several
    pauses.push_back(st.defrag_pauses.num_pauses);
    EXPECT_TRUE(m->CheckInvariants().ok());
  }
  EXPECT_EQ(pauses[1], pauses[0]);
  EXPECT_EQ(pauses[2], pauses[0]);
}

}  // namespace
}  // namespace kvd
