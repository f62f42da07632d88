// Multi-turn sessions through KvCacheManager and SessionTable.

#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "cache/session_table.h"
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

class SessionTest : public testing_util::CacheManagerTest {
 protected:
  // One turn: prompt, computed fully, plus `generated` decoded tokens; then freed.
  void Turn(KvCacheManager& m, SeqId id, const std::vector<int32_t>& prompt, int32_t generated,
            std::string_view session, int32_t expect_cached) {
    absl::StatusOr<int32_t> cached = m.AddSequence(id, prompt, session);
    ASSERT_TRUE(cached.ok()) << cached.status();
    EXPECT_EQ(*cached, expect_cached);
    ASSERT_TRUE(Step(m, id, static_cast<int32_t>(prompt.size()) - *cached));
    for (int32_t i = 0; i < generated; ++i) {
      m.AppendTokens(id, {900 + i});
      ASSERT_TRUE(Step(m, id, 1));
    }
    EXPECT_EQ(CountBadKv(m, id), 0);
    ExpectValid(m);
    m.Free(id);
    ExpectValid(m);
  }
  // Turn 1 of "chat" (9 tokens, sequence 1) computed, then preempted.
  void PreemptChatTurn(KvCacheManager& m) {
    ASSERT_TRUE(m.AddSequence(1, Iota(9), "chat").ok());
    ASSERT_TRUE(Step(m, 1, 9));
    m.FreeForRecompute(1);
  }
  // A pool of 8 blocks at most, 4 of them for pins, pinned by session "a" (2 blocks) and,
  // 1 s later, "b" (2 blocks).
  std::unique_ptr<KvCacheManager> SessionsAAndBAtThePinCap() {
    KvCacheOptions o = TinyOptions(1, 2);
    o.max_pinned_fraction = 0.5;
    auto m = Make(o);
    Turn(*m, 1, Iota(8, 100), 0, "a", 0);
    clock_.Advance(absl::Seconds(1));
    Turn(*m, 2, Iota(8, 200), 0, "b", 0);
    return m;
  }
  std::vector<int32_t> History(const std::vector<int32_t>& prompt, int32_t generated) {
    std::vector<int32_t> h = prompt;
    for (int32_t i = 0; i < generated; ++i) h.push_back(900 + i);
    return h;
  }
};

TEST_F(SessionTest, NextTurnOnlyPrefillsItsNewTokensIncludingThePartialBlock) {
  auto m = Make(TinyOptions());
  const std::vector<int32_t> turn1 = Iota(6);
  Turn(*m, 1, turn1, 3, "chat", 0);  // 9 tokens: 2 full blocks + 1 in a partial block
  EXPECT_EQ(m->stats().pinned_blocks, 3);
  std::vector<int32_t> turn2 = History(turn1, 3);
  turn2.push_back(50);
  turn2.push_back(51);
  EXPECT_EQ(m->ProbePrefix(turn2, "chat"), 9);
  // Without the session only the 2 full blocks would hit.
  EXPECT_EQ(m->ProbePrefix(turn2), 8);
  Turn(*m, 2, turn2, 1, "chat", 9);
  EXPECT_EQ(m->stats().session_hit_tokens, 9);
  EXPECT_EQ(m->stats().pinned_blocks, 3);  // 12 tokens
}

// A client's retry sends the same turn again, or a shorter one: the session's chain covers
// the whole prompt, yet its last token is computed again so that the step has logits.
// An idle session's pinned chain is a holder like any table: a request that hits its prefix
// through the index holds the same blocks, and the stats count those as shared, until the
// session lets go.
TEST_F(SessionTest, ARequestHittingAnIdleSessionsPrefixSharesItsBlocks) {
  auto m = Make();
  Turn(*m, 1, Iota(9), 0, "chat", 0);  // pins 3 blocks (2 full, keyed; 1 partial)
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.pinned_blocks, 3);
  EXPECT_EQ(st.block_references, 3);
  EXPECT_EQ(st.shared_blocks, 0);
  ASSERT_EQ(*m->AddSequence(2, Iota(9)), 8);  // no session: the index finds the 2 full blocks
  ASSERT_TRUE(Step(*m, 2, 1));
  st = m->stats();
  EXPECT_EQ(st.used_blocks, 4);
  EXPECT_EQ(st.block_references, 6);
  EXPECT_EQ(st.shared_blocks, 2);
  ASSERT_TRUE(m->CloseSession("chat").ok());
  st = m->stats();
  EXPECT_EQ(st.block_references, st.used_blocks);
  EXPECT_EQ(st.shared_blocks, 0);
  m->Free(2);
  ExpectValid(*m);
}

TEST_F(SessionTest, AResentTurnStillComputesItsLastToken) {
  KvCacheOptions o = TinyOptions();
  o.enable_prefix_caching = false;  // the session's own blocks are all it can reuse
  auto m = Make(o);
  Turn(*m, 1, Iota(8), 0, "chat", 0);
  Turn(*m, 2, Iota(8), 0, "chat", 7);
  Turn(*m, 3, Iota(6), 0, "chat", 5);
}

TEST_F(SessionTest, ADivergingTurnReusesTheCommonPrefixWithoutWritingSharedBlocks) {
  auto m = Make(TinyOptions());
  Turn(*m, 1, Iota(11), 0, "chat", 0);  // blocks [0,4) [4,8) full and keyed, [8,11) partial
  std::vector<int32_t> edited = Iota(11);
  edited[9] = 7;  // an edit inside the session's own partial block: reuse up to it
  Turn(*m, 2, edited, 0, "chat", 9);
  edited[6] = 7;  // an edit inside a keyed full block: that block is never overwritten
  Turn(*m, 3, edited, 0, "chat", 4);
  EXPECT_EQ(m->ProbePrefix(Iota(11)), 8);  // the original blocks are intact and cached
}

// Idle pins count as used, yet a request may have them: the obtainable blocks say so, as the
// usage ratio (used / capacity) cannot. A running sequence's blocks are not obtainable.
TEST_F(SessionTest, IdlePinsAreUsedButObtainable) {
  auto m = Make(TinyOptions());  // 16 blocks at most
  Turn(*m, 1, Iota(9), 0, "chat", 0);
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.used_blocks, 3);
  EXPECT_EQ(st.pinned_blocks, 3);
  EXPECT_EQ(st.obtainable_blocks, st.max_blocks);
  ASSERT_EQ(*m->AddSequence(2, Iota(20, 500)), 0);
  ASSERT_TRUE(Step(*m, 2, 20));  // 5 blocks held by a running sequence
  st = m->stats();
  EXPECT_EQ(st.obtainable_blocks, st.max_blocks - 5);
  EXPECT_EQ(st.obtainable_blocks, m->NumObtainableBlocks());
  m->Free(2);
  ExpectValid(*m);
}

TEST_F(SessionTest, IdleSessionsReleaseTheirPinsLazilyAfterTheTimeout) {
  auto m = Make(TinyOptions());
  Turn(*m, 1, Iota(9), 0, "chat", 0);
  ASSERT_EQ(m->stats().pinned_blocks, 3);
  clock_.Advance(absl::Seconds(29));
  m->Tick();
  EXPECT_EQ(m->stats().pinned_blocks, 3);
  clock_.Advance(absl::Seconds(1));
  m->Tick();
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.pinned_blocks, 0);
  EXPECT_EQ(st.session_releases_idle, 1);
  EXPECT_EQ(st.cached_blocks, 2);  // full blocks stay cached; the partial one is freed
  EXPECT_EQ(st.used_blocks, 0);
  EXPECT_EQ(m->ProbePrefix(Iota(9), "chat"), 8);  // still hits through the prefix index
  EXPECT_EQ(m->CloseSession("chat").code(), absl::StatusCode::kNotFound);
  ExpectValid(*m);
}

// A turn waiting to run touches its session (TouchSession): its idle time starts again, and
// it becomes the newest idle session, the last the pin cap (or pressure) lets go. Touching an
// attached, unknown or empty session changes nothing.
TEST_F(SessionTest, AWaitingTurnKeepsItsSessionFromExpiringAndLastInLine) {
  auto m = SessionsAAndBAtThePinCap();
  clock_.Advance(absl::Seconds(20));
  m->TouchSession("a");  // "a" is now newer than "b"
  m->TouchSession("unknown");
  m->TouchSession("");
  clock_.Advance(absl::Seconds(1));
  Turn(*m, 3, Iota(8, 300), 0, "c", 0);  // over the cap: "b", not "a", goes
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.session_releases_pin_cap, 1);
  EXPECT_EQ(st.num_sessions, 2);
  EXPECT_EQ(m->CloseSession("b").code(), absl::StatusCode::kNotFound);
  // 30 s after its last turn "a" would have expired, but it was touched 10 s ago; "c" ended
  // its turn 9 s ago.
  clock_.Advance(absl::Seconds(9));
  m->Tick();
  st = m->stats();
  EXPECT_EQ(st.session_releases_idle, 0);
  EXPECT_EQ(st.num_sessions, 2);
  clock_.Advance(absl::Seconds(20));  // "a" touched 30 s ago: expires; "c" 29 s ago: stays
  m->Tick();
  st = m->stats();
  EXPECT_EQ(st.session_releases_idle, 1);
  EXPECT_EQ(m->CloseSession("a").code(), absl::StatusCode::kNotFound);
  // An attached session is not idle, touched or not: it does not expire while its turn runs.
  ASSERT_TRUE(m->AddSequence(4, Iota(9, 300), "c").ok());
  m->TouchSession("c");
  clock_.Advance(absl::Seconds(60));
  m->Tick();
  EXPECT_EQ(m->stats().num_sessions, 1);
  EXPECT_EQ(m->stats().session_releases_idle, 1);
  m->Free(4);
  ExpectValid(*m);
}

// An idle timeout of zero unpins a session at the first step boundary after its turn ends,
// with no time passing: nothing stays pinned between turns.
TEST_F(SessionTest, AZeroIdleTimeoutUnpinsAtTheNextTick) {
  KvCacheOptions o = TinyOptions();
  o.session_idle_timeout = absl::ZeroDuration();
  auto m = Make(o);
  Turn(*m, 1, Iota(9), 0, "chat", 0);
  ASSERT_EQ(m->stats().pinned_blocks, 3);
  m->Tick();
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.pinned_blocks, 0);
  EXPECT_EQ(st.num_sessions, 0);
  EXPECT_EQ(st.session_releases_idle, 1);
  ExpectValid(*m);
}

TEST_F(SessionTest, CloseReleasesAtOnce) {
  auto m = Make(TinyOptions());
  Turn(*m, 1, Iota(9), 0, "chat", 0);
  ASSERT_TRUE(m->CloseSession("chat").ok());
  EXPECT_EQ(m->stats().pinned_blocks, 0);
  EXPECT_EQ(m->stats().session_releases_closed, 1);
  EXPECT_EQ(m->CloseSession("chat").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m->CloseSession("never").code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionTest, ClosingARunningSessionLetsItsSequenceFreeNormally) {
  auto m = Make(TinyOptions());
  ASSERT_TRUE(m->AddSequence(1, Iota(9), "chat").ok());
  ASSERT_TRUE(Step(*m, 1, 9));
  ASSERT_TRUE(m->CloseSession("chat").ok());
  // A new turn with the same id starts a fresh session while the old sequence runs.
  ASSERT_TRUE(m->AddSequence(2, Iota(3, 500), "chat").ok());
  m->Free(1);
  EXPECT_EQ(m->stats().pinned_blocks, 0);
  ExpectValid(*m);
  m->Free(2);
  EXPECT_EQ(m->stats().pinned_blocks, 0);  // 0 computed tokens: an empty chain
  ExpectValid(*m);
}

TEST_F(SessionTest, IdlePinsGiveWayToASequenceThatNeedsTheRoom) {
  KvCacheOptions o = TinyOptions(1, 2);  // 8 blocks of 4 tokens
  o.max_pinned_fraction = 0.5;           // 4 pinned blocks
  auto m = Make(o);
  Turn(*m, 1, Iota(8, 100), 0, "a", 0);  // 2 blocks
  clock_.Advance(absl::Seconds(1));
  Turn(*m, 2, Iota(8, 200), 0, "b", 0);  // 2 blocks: 4 of 8 pinned
  // 6 blocks: more than the 4 free, fewer than the pool. The oldest session gives way.
  ASSERT_TRUE(m->AddSequence(3, Iota(24, 300)).ok());
  ASSERT_TRUE(Step(*m, 3, 24));
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.session_releases_pressure, 1);
  EXPECT_EQ(st.pinned_blocks, 2);
  EXPECT_EQ(m->CloseSession("a").code(), absl::StatusCode::kNotFound);
  ExpectValid(*m);
  // 3 blocks, and releasing "b" would give only 2: nothing changes, "b" stays.
  ASSERT_TRUE(m->AddSequence(4, Iota(12, 400)).ok());
  EXPECT_FALSE(m->Reserve(4, 12));
  EXPECT_TRUE(m->BlockIds(4).empty());
  st = m->stats();
  EXPECT_EQ(st.session_releases_pressure, 1);
  EXPECT_EQ(st.pinned_blocks, 2);
  ExpectValid(*m);
  EXPECT_TRUE(m->Reserve(4, 8));  // 2 blocks: now "b" gives way
  st = m->stats();
  EXPECT_EQ(st.session_releases_pressure, 2);
  EXPECT_EQ(st.pinned_blocks, 0);
  ExpectValid(*m);
}

TEST_F(SessionTest, PinnedBlocksCountOnceWhenSessionsShareAPrefix) {
  auto m = Make(TinyOptions());
  Turn(*m, 1, Iota(8), 0, "a", 0);   // 2 full blocks, keyed
  Turn(*m, 2, Iota(12), 0, "b", 8);  // finds both through the prefix index, adds a third
  // "a" pins blocks {x, y}, "b" pins {x, y, z}: 3 distinct blocks, not 5.
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.pinned_blocks, 3);
  EXPECT_LE(st.pinned_blocks, st.used_blocks);
  ExpectValid(*m);
  ASSERT_TRUE(m->CloseSession("a").ok());
  EXPECT_EQ(m->stats().pinned_blocks, 3);  // "b" still pins all three
  ASSERT_TRUE(m->CloseSession("b").ok());
  EXPECT_EQ(m->stats().pinned_blocks, 0);
  ExpectValid(*m);
}

// A preempted turn gives back every block, but not its session: the session waits for the
// turn, holding nothing, as it would while the turn ran.
TEST_F(SessionTest, APreemptedTurnKeepsItsSessionHoldingNothing) {
  auto m = Make(TinyOptions());
  ASSERT_NO_FATAL_FAILURE(PreemptChatTurn(*m));
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_sessions, 1);
  EXPECT_EQ(st.pinned_blocks, 0);
  EXPECT_EQ(st.used_blocks, 0);
  EXPECT_EQ(st.session_releases_pressure, 0);
  ExpectValid(*m);
  // Another turn of the session waits for this one (SessionBusy says so beforehand; not for
  // the preempted turn itself, nor for another session), and idle expiry passes the session by.
  EXPECT_TRUE(m->SessionBusy(2, "chat"));
  EXPECT_FALSE(m->SessionBusy(1, "chat"));
  EXPECT_FALSE(m->SessionBusy(2, "other"));
  EXPECT_FALSE(m->SessionBusy(2, ""));
  EXPECT_EQ(m->AddSequence(2, Iota(12), "chat").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(m->HasSequence(2));
  clock_.Advance(TinyOptions().session_idle_timeout + absl::Seconds(1));
  m->Tick();
  EXPECT_EQ(m->stats().num_sessions, 1);
  EXPECT_EQ(m->stats().session_releases_idle, 0);
  // The turn comes back to its session (its full blocks are still cached) and, when it
  // ends, leaves its history pinned there.
  ASSERT_EQ(*m->AddSequence(1, Iota(9), "chat"), 8);
  ASSERT_TRUE(Step(*m, 1, 1));
  m->Free(1);
  st = m->stats();
  EXPECT_EQ(st.pinned_blocks, 3);
  EXPECT_EQ(m->ProbePrefix(Iota(10), "chat"), 9);
  ExpectValid(*m);
}

// Closing the session of a preempted turn works as closing that of a running one: the
// session is forgotten at once, and the turn ends without pinning anything, even when a
// later turn has made the session anew meanwhile.
TEST_F(SessionTest, ClosingThePreemptedTurnsSessionLetsItRunWithoutOne) {
  auto m = Make(TinyOptions());
  ASSERT_NO_FATAL_FAILURE(PreemptChatTurn(*m));
  ASSERT_TRUE(m->CloseSession("chat").ok());
  EXPECT_EQ(m->stats().num_sessions, 0);
  EXPECT_EQ(m->stats().session_releases_closed, 1);
  ASSERT_TRUE(m->AddSequence(2, Iota(5, 500), "chat").ok());  // the new "chat"
  ASSERT_TRUE(Step(*m, 2, 5));
  ASSERT_TRUE(m->AddSequence(1, Iota(9), "chat").ok());  // not the new one's: not busy
  ASSERT_TRUE(Step(*m, 1, 1));
  ExpectValid(*m);
  // Preempted again, it still runs without a session when it comes back.
  m->FreeForRecompute(1);
  ASSERT_TRUE(m->AddSequence(1, Iota(9), "chat").ok());
  ASSERT_TRUE(Step(*m, 1, 1));
  m->Free(1);
  EXPECT_EQ(m->stats().pinned_blocks, 0);
  m->Free(2);
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_sessions, 1);
  EXPECT_EQ(st.pinned_blocks, 2);  // the new "chat" keeps its 5 tokens, not the old turn's
  EXPECT_EQ(m->ProbePrefix(Iota(6, 500), "chat"), 5);
  ExpectValid(*m);
  // Admission's probe for the old turn coming back once more counts no chain of the new
  // "chat" (AddSequence gives the old turn none): only the prefix index's blocks.
  m->EndPreempted(1);  // (nothing left: it was freed)
  absl::StatusOr<int32_t> cached = m->AddSequence(3, Iota(9, 500), "chat");
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_TRUE(Step(*m, 3, 9 - *cached));
  m->FreeForRecompute(3);
  ASSERT_TRUE(m->CloseSession("chat").ok());
  cached = m->AddSequence(4, Iota(9, 500), "chat");
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_TRUE(Step(*m, 4, 9 - *cached));
  m->Free(4);  // the new "chat" pins 9 tokens; the index holds their 2 full blocks
  const std::vector<int32_t> back = Iota(10, 500);
  EXPECT_EQ(m->ProbePrefixBlocks(back, "chat").matched_blocks, 3);
  const KvCacheManager::PrefixProbe probe = m->ProbePrefixBlocks(back, "chat", SeqId{3});
  EXPECT_EQ(probe.matched_blocks, 2);
  EXPECT_EQ(*m->AddSequence(3, back, "chat"), probe.computed_tokens);
  EXPECT_EQ(probe.computed_tokens, 8);
  m->Abandon(3);
  ExpectValid(*m);
}

// A preempted turn that will not come back (cancelled while it waited) lets its session go
// on, empty: the next turn may run, and the idle timeout counts from then.
TEST_F(SessionTest, EndPreemptedDetachesTheSessionWithNothingPinned) {
  auto m = Make(TinyOptions());
  m->EndPreempted(7);  // nothing preempted: nothing happens
  ASSERT_NO_FATAL_FAILURE(PreemptChatTurn(*m));
  clock_.Advance(absl::Seconds(5));
  m->EndPreempted(1);
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_sessions, 1);
  EXPECT_EQ(st.pinned_blocks, 0);
  ExpectValid(*m);
  clock_.Advance(TinyOptions().session_idle_timeout - absl::Seconds(1));
  m->Tick();
  EXPECT_EQ(m->stats().num_sessions, 1);
  clock_.Advance(absl::Seconds(1));
  m->Tick();
  st = m->stats();
  EXPECT_EQ(st.num_sessions, 0);
  EXPECT_EQ(st.session_releases_idle, 1);
  // The next turn attaches the session at once (and finds no history in it).
  ASSERT_EQ(*m->AddSequence(2, Iota(9, 300), "next"), 0);
  ASSERT_TRUE(Step(*m, 2, 9));
  m->FreeForRecompute(2);
  m->EndPreempted(2);
  EXPECT_EQ(*m->AddSequence(3, Iota(12, 300), "next"), 8);  // the prefix index's, not the session's
  EXPECT_EQ(m->stats().session_hit_tokens, 0);
  ASSERT_TRUE(Step(*m, 3, 4));
  m->Free(3);
  ExpectValid(*m);
}

// An admission of a preempted turn undone for want of room leaves it preempted: its session
// still waits for it.
TEST_F(SessionTest, AbandoningAPreemptedTurnsComebackKeepsItsSessionWaiting) {
  auto m = Make(TinyOptions());
  ASSERT_NO_FATAL_FAILURE(PreemptChatTurn(*m));
  ASSERT_TRUE(m->AddSequence(1, Iota(9), "chat").ok());
  m->Abandon(1);
  EXPECT_FALSE(m->HasSequence(1));
  EXPECT_EQ(m->stats().num_sessions, 1);
  EXPECT_EQ(m->AddSequence(2, Iota(12), "chat").status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExpectValid(*m);
  ASSERT_TRUE(m->AddSequence(1, Iota(9), "chat").ok());
  ASSERT_TRUE(Step(*m, 1, 1));
  m->Free(1);
  EXPECT_EQ(m->stats().pinned_blocks, 3);
  ExpectValid(*m);
}

// An admission undone for want of room (AddSequence, a failed Reserve, Abandon) leaves no
// trace of a session it started: nothing pinned for a turn that never ran, no release and
// no hit counted, and CloseSession finds nothing.
TEST_F(SessionTest, AbandonForgetsTheSessionItsAdmissionStarted) {
  auto m = MakeCachedPrefixAndOneFreeBlock();
  const KvCacheStats before = m->stats();
  ASSERT_EQ(*m->AddSequence(3, Iota(20, 100), "new"), 8);  // P's 2 cached blocks
  ASSERT_FALSE(m->Reserve(3, 12));                         // 3 more blocks; 1 is free
  m->Abandon(3);
  EXPECT_FALSE(m->HasSequence(3));
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_sessions, 0);
  EXPECT_EQ(st.pinned_blocks, 0);
  EXPECT_EQ(st.used_blocks, before.used_blocks);
  EXPECT_EQ(st.cached_blocks, before.cached_blocks);
  EXPECT_EQ(st.prefix_hit_tokens, before.prefix_hit_tokens);
  EXPECT_EQ(st.session_releases_closed + st.session_releases_pressure + st.session_releases_idle +
                st.session_releases_pin_cap,
            0);
  EXPECT_EQ(m->CloseSession("new").code(), absl::StatusCode::kNotFound);
  ExpectValid(*m);
  // The retry, once there is room, is the session's first turn.
  m->Free(2);
  ASSERT_EQ(*m->AddSequence(3, Iota(20, 100), "new"), 8);
  ASSERT_TRUE(Step(*m, 3, 12));
  EXPECT_EQ(m->stats().prefix_hit_tokens, before.prefix_hit_tokens + 8);
  EXPECT_EQ(m->stats().num_sessions, 1);
  ExpectValid(*m);
  m->Free(3);
}

// An existing session whose next turn is abandoned gets its own chain back, pinned as
// before; blocks the turn found through the prefix index stay ordinary cached blocks.
TEST_F(SessionTest, AbandonGivesAnExistingSessionItsChainBack) {
  KvCacheOptions o = TinyOptions(2, 2);  // 8 blocks, no growth
  o.max_pinned_fraction = 1;             // the retried turn's 5 blocks stay pinned
  auto m = Make(o);
  Turn(*m, 1, Iota(8), 0, "chat", 0);  // "chat" pins 2 blocks
  Turn(*m, 2, Iota(16), 0, "", 8);     // 2 more keyed blocks, cached
  ASSERT_TRUE(m->AddSequence(3, Iota(16, 500)).ok());
  ASSERT_TRUE(Step(*m, 3, 16));  // the 4 free blocks
  const KvCacheStats before = m->stats();
  ASSERT_EQ(before.pinned_blocks, 2);
  ASSERT_EQ(before.cached_blocks, 2);
  const std::vector<int32_t> turn2 = Iota(20);
  ASSERT_EQ(*m->AddSequence(4, turn2, "chat"), 16);  // 8 from the chain, 8 from the index
  ASSERT_FALSE(m->Reserve(4, 4));                    // 1 more block; none is left
  m->Abandon(4);
  KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_sessions, 1);
  EXPECT_EQ(st.pinned_blocks, 2);
  EXPECT_EQ(st.cached_blocks, 2);
  EXPECT_EQ(st.used_blocks, before.used_blocks);
  EXPECT_EQ(st.session_hit_tokens, 0);
  EXPECT_EQ(st.prefix_hit_tokens, before.prefix_hit_tokens);
  EXPECT_EQ(m->ProbePrefix(turn2, "chat"), 16);
  ExpectValid(*m);
  // The retry finds the chain as the first attempt did.
  m->Free(3);
  Turn(*m, 4, turn2, 0, "chat", 16);
  st = m->stats();
  EXPECT_EQ(st.session_hit_tokens, 8);
  EXPECT_EQ(st.pinned_blocks, 5);
  EXPECT_EQ(st.session_releases_closed + st.session_releases_pressure + st.session_releases_idle +
                st.session_releases_pin_cap,
            0);
}

TEST_F(SessionTest, PinCapDemotesTheOldestSessionsFirst) {
  auto m = SessionsAAndBAtThePinCap();
  EXPECT_EQ(m->stats().pinned_blocks, 4);
  clock_.Advance(absl::Seconds(1));
  Turn(*m, 3, Iota(8, 300), 0, "c", 0);  // over: "a" goes
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.pinned_blocks, 4);
  EXPECT_EQ(st.session_releases_pin_cap, 1);
  EXPECT_EQ(m->CloseSession("a").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(m->CloseSession("b").ok());
}

// The pin cap and memory pressure pass by a session that pins nothing (left empty by a
// preempted turn that ended): releasing it would free no block, yet count as a release.
TEST_F(SessionTest, PinCapAndPressurePassBySessionsThatPinNothing) {
  KvCacheOptions o = TinyOptions(1, 2);  // 8 blocks max
  o.max_pinned_fraction = 0.5;           // 4 pinned blocks
  auto m = Make(o);
  ASSERT_TRUE(m->AddSequence(10, Iota(8, 500), "empty").ok());
  ASSERT_TRUE(Step(*m, 10, 8));
  m->FreeForRecompute(10);
  m->EndPreempted(10);  // "empty": the oldest session, pinning nothing
  clock_.Advance(absl::Seconds(1));
  Turn(*m, 1, Iota(8, 100), 0, "a", 0);  // 2 blocks
  clock_.Advance(absl::Seconds(1));
  Turn(*m, 2, Iota(8, 200), 0, "b", 0);  // 2 blocks: at the cap
  clock_.Advance(absl::Seconds(1));
  Turn(*m, 3, Iota(8, 300), 0, "c", 0);  // over: "a" goes, not "empty"
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.pinned_blocks, 4);
  EXPECT_EQ(st.session_releases_pin_cap, 1);
  EXPECT_EQ(st.num_sessions, 3);
  EXPECT_EQ(m->CloseSession("a").code(), absl::StatusCode::kNotFound);
  // 6 blocks: the 4 not pinned and 2 of a session's. "b" gives way, not "empty".
  ASSERT_TRUE(m->AddSequence(4, Iota(24, 600)).ok());
  ASSERT_TRUE(Step(*m, 4, 24));
  EXPECT_EQ(m->stats().session_releases_pressure, 1);
  EXPECT_EQ(m->CloseSession("b").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(m->CloseSession("empty").ok());
  m->Free(4);
  ExpectValid(*m);
}

// Memory pressure also passes by a session whose every pinned block a running sequence holds
// too (it reached them through the prefix index): letting it go would free nothing, and would
// leave its blocks unprotected once that sequence ends.
TEST_F(SessionTest, PressurePassesByASessionWhoseBlocksARunningSequenceHolds) {
  KvCacheOptions o = TinyOptions(2, 2);  // 8 blocks, no growth
  o.max_pinned_fraction = 1;
  auto m = Make(o);
  Turn(*m, 1, Iota(8, 100), 0, "a", 0);  // "a" pins 2 blocks
  ASSERT_EQ(*m->AddSequence(2, Iota(9, 100)), 8);
  ASSERT_TRUE(Step(*m, 2, 1));  // sequence 2 holds "a"'s 2 blocks and 1 of its own
  clock_.Advance(absl::Seconds(1));
  Turn(*m, 3, Iota(8, 200), 0, "b", 0);  // "b", newer, pins 2 blocks no one else holds
  ASSERT_EQ(m->stats().free_blocks, 3);
  // 4 blocks: 1 more than is free. "b" gives way, not the older "a".
  ASSERT_TRUE(m->AddSequence(4, Iota(16, 300)).ok());
  ASSERT_TRUE(Step(*m, 4, 16));
  ExpectValid(*m);
  EXPECT_EQ(m->stats().session_releases_pressure, 1);
  EXPECT_EQ(m->CloseSession("b").code(), absl::StatusCode::kNotFound);
  m->Free(2);
  m->Free(4);
  // When nothing but pins hold "a"'s blocks, pressure takes it as any other.
  ASSERT_TRUE(m->AddSequence(5, Iota(32, 400)).ok());
  ASSERT_TRUE(Step(*m, 5, 32));
  EXPECT_EQ(m->stats().session_releases_pressure, 2);
  EXPECT_EQ(m->CloseSession("a").code(), absl::StatusCode::kNotFound);
  m->Free(5);
  ExpectValid(*m);
}

TEST_F(SessionTest, SessionsSurviveDefragmentationMoves) {
  KvCacheOptions o = TinyOptions(1, 2);
  o.defrag_max_moves_per_step = 1;
  auto m = Make(o);
  // Fill chunk 0 with a long sequence so the session's chain lands in chunk 1.
  ASSERT_TRUE(m->AddSequence(1, Iota(16, 700)).ok());
  ASSERT_TRUE(Step(*m, 1, 16));
  Turn(*m, 2, Iota(6), 0, "chat", 0);
  ASSERT_EQ(m->stats().num_chunks, 2);
  m->Free(1);
  for (int i = 0; i < 5 && m->stats().num_chunks > 1; ++i) m->Tick();
  EXPECT_EQ(m->stats().num_chunks, 1);
  EXPECT_GE(m->stats().defrag_moves, 2);
  ExpectValid(*m);
  std::vector<int32_t> turn2 = Iota(6);
  turn2.push_back(1);
  Turn(*m, 3, turn2, 0, "chat", 6);  // CountBadKv checks the moved bytes
}

TEST(SessionTableTest, AttachDetachExpireByTheInjectedClock) {
  FakeClock clock;
  SessionTable t(&clock, absl::Seconds(10));
  absl::StatusOr<Session*> s = t.Attach("x");
  ASSERT_TRUE(s.ok());
  const uint64_t serial = (*s)->serial;
  EXPECT_EQ(t.Attach("x").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(t.ExpireIdle().empty());  // attached sessions never expire
  EXPECT_FALSE(t.Detach("x", serial + 1, {1, 2}, {}));
  ASSERT_TRUE(t.Detach("x", serial, {1, 2}, {10, 11, 12, 13, 14}));
  EXPECT_EQ(t.num_pinned_blocks(), 2);
  clock.Advance(absl::Seconds(9));
  EXPECT_TRUE(t.ExpireIdle().empty());
  clock.Advance(absl::Seconds(1));
  std::vector<SessionTable::Released> r = t.ExpireIdle();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].chain, (std::vector<BlockId>{1, 2}));
  EXPECT_EQ(r[0].reason, SessionReleaseReason::kIdle);
  EXPECT_EQ(t.num_pinned_blocks(), 0);
  EXPECT_EQ(t.Find("x"), nullptr);
}

TEST(SessionTableTest, ABlockPinnedByTwoSessionsCountsOnceUntilBothLetGo) {
  FakeClock clock;
  SessionTable t(&clock, absl::Seconds(30));
  const uint64_t a = (*t.Attach("a"))->serial;
  ASSERT_TRUE(t.Detach("a", a, {1, 2, 3}, {0, 0, 0, 0, 0}));
  const uint64_t b = (*t.Attach("b"))->serial;
  ASSERT_TRUE(t.Detach("b", b, {1, 2, 4}, {0, 0, 0, 0, 0}));
  EXPECT_EQ(t.num_pinned_blocks(), 4);
  t.RemapBlocks({{2, 7}, {4, 2}});  // defragmentation moved two of them
  EXPECT_EQ(t.num_pinned_blocks(), 4);
  EXPECT_EQ(t.PinsOf(7), 2);  // 2's pins, both sessions'
  EXPECT_EQ(t.PinsOf(2), 1);  // 4's, moved to where 2 was
  EXPECT_EQ(t.PinsOf(4), 0);
  EXPECT_EQ(t.Find("a")->chain, (std::vector<BlockId>{1, 7, 3}));
  EXPECT_EQ(t.Find("a")->chain_max, 7);
  ASSERT_TRUE(t.Attach("a").ok());  // "a"'s turn takes its chain back: 1 and 7 stay pinned
  EXPECT_EQ(t.num_pinned_blocks(), 3);
  // ReleaseOldest takes the oldest detached session whose chain the caller's test accepts.
  auto any = [](const std::vector<BlockId>&) { return true; };
  EXPECT_FALSE(t.ReleaseOldest(SessionReleaseReason::kPressure, [](const std::vector<BlockId>&) {
                  return false;
                }).has_value());
  std::optional<SessionTable::Released> r = t.ReleaseOldest(SessionReleaseReason::kPressure, any);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->id, "b");
  EXPECT_EQ(r->chain, (std::vector<BlockId>{1, 7, 2}));
  EXPECT_EQ(t.num_pinned_blocks(), 0);
  EXPECT_FALSE(t.ReleaseOldest(SessionReleaseReason::kPressure, any).has_value());
  // Release by serial: only the session still numbered so.
  EXPECT_FALSE(t.Release("a", a + 100, SessionReleaseReason::kPressure).has_value());
  EXPECT_TRUE(t.Release("a", a, SessionReleaseReason::kPressure).has_value());
  EXPECT_EQ(t.Find("a"), nullptr);
}

// Defragmentation moves blocks out of the arena's top chunk a few at a time; the chains below
// every moved block are left as they are (not read), those holding one are rewritten.
TEST(SessionTableTest, RemapRewritesOnlyTheChainsThatHoldAMovedBlock) {
  FakeClock clock;
  SessionTable t(&clock, absl::Seconds(30));
  for (int i = 0; i < 100; ++i) {
    const std::string id = absl::StrCat("s", i);
    const uint64_t serial = (*t.Attach(id))->serial;
    ASSERT_TRUE(t.Detach(id, serial, {i, 100 + i}, {0, 0, 0, 0, 0, 0}));
  }
  ASSERT_TRUE(t.Detach("top", (*t.Attach("top"))->serial, {5, 250, 251}, {0, 0, 0, 0, 0, 0}));
  t.RemapBlocks({{250, 1000}, {251, 1001}, {199, 1002}});
  EXPECT_EQ(t.Find("top")->chain, (std::vector<BlockId>{5, 1000, 1001}));
  EXPECT_EQ(t.Find("s99")->chain, (std::vector<BlockId>{99, 1002}));
  EXPECT_EQ(t.Find("s98")->chain, (std::vector<BlockId>{98, 198}));
  EXPECT_EQ(t.Find("s98")->chain_max, 198);
  EXPECT_EQ(t.Find("top")->chain_max, 1001);
  EXPECT_EQ(t.PinsOf(5), 2);  // "s5" and "top"
  EXPECT_EQ(t.PinsOf(1000), 1);
  EXPECT_EQ(t.PinsOf(250), 0);
  EXPECT_EQ(t.num_pinned_blocks(), 202);  // 0-199, 250 and 251 before; as many after
}

// The owner hears of every pin a detached session takes or gives up (to keep the pool's
// counts in step), and of none when defragmentation renames blocks (the pool moves pins).
TEST(SessionTableTest, TellsTheOwnerOfEveryPinTakenAndGivenUp) {
  FakeClock clock;
  std::map<BlockId, int32_t> pins;
  SessionTable t(&clock, absl::Seconds(30), [&](BlockId b, int32_t delta) {
    if ((pins[b] += delta) == 0) pins.erase(b);
  });
  const uint64_t a = (*t.Attach("a"))->serial;
  ASSERT_TRUE(t.Detach("a", a, {1, 2}, {0, 0, 0, 0, 0}));
  const uint64_t b = (*t.Attach("b"))->serial;
  ASSERT_TRUE(t.Detach("b", b, {1, 3}, {0, 0, 0, 0, 0}));
  EXPECT_EQ(pins, (std::map<BlockId, int32_t>{{1, 2}, {2, 1}, {3, 1}}));
  t.RemapBlocks({{3, 9}});
  EXPECT_EQ(pins, (std::map<BlockId, int32_t>{{1, 2}, {2, 1}, {3, 1}}));
  pins = {{1, 2}, {2, 1}, {9, 1}};  // as the owner's pool moves block 3's pins to 9
  ASSERT_TRUE(t.Attach("a").ok());  // its turn takes the chain back
  EXPECT_EQ(pins, (std::map<BlockId, int32_t>{{1, 1}, {9, 1}}));
  ASSERT_TRUE(t.Close("b").has_value());
  EXPECT_TRUE(pins.empty());
}

TEST(SessionTableTest, PinCapTakesTheLeastRecentlyUsedFirst) {
  FakeClock clock;
  SessionTable t(&clock, absl::Seconds(30));
  const std::vector<std::pair<const char*, std::vector<BlockId>>> chains = {
      {"a", {1, 2}}, {"b", {3, 4}}, {"c", {5, 6}}};
  for (const auto& [id, chain] : chains) {
    const uint64_t serial = (*t.Attach(id))->serial;
    ASSERT_TRUE(t.Detach(id, serial, chain, {0, 0, 0, 0, 0}));
    clock.Advance(absl::Seconds(1));
  }
  // "a" comes back and goes again: now "b" is the oldest.
  const uint64_t serial = (*t.Attach("a"))->serial;
  ASSERT_TRUE(t.Detach("a", serial, {1, 2}, {0, 0, 0, 0, 0}));
  EXPECT_EQ(t.num_pinned_blocks(), 6);
  std::vector<SessionTable::Released> r = t.EnforcePinCap(3);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].id, "b");
  EXPECT_EQ(r[1].id, "c");
  EXPECT_EQ(t.num_pinned_blocks(), 2);
}

}  // namespace
}  // namespace kvd
