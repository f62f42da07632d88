// Randomized property test of KvCacheManager: thousands of operations (add with prefix
// and session reuse, append, step, fork, free, preempt (FreeForRecompute) and come back or
// end while preempted, tick with expiry and defragmentation, close) from fixed seeds, checking
// after every operation that reference counts equal holders, no block is both free and referenced,
// every prefix key matches its tokens, free + used + cached == total, and every live sequence's
// computed positions hold exactly the bytes the "model" wrote for their prefix. Some seeds also
// make the device fail now and then (no memory to grow the arena; block copies that stop
// part way) and plan defragmentation on the planner's thread; a failed Reserve must then
// still change nothing, and a prefix hit must still find the bytes of its prefix.

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "gtest/gtest.h"
#include "tests/cache/fake_backend.h"
#include "tests/cache/kv_test_util.h"

namespace kvd {
namespace {

using testing_util::CountBadKv;
using testing_util::TinyOptions;
using testing_util::TinyShape;
using testing_util::WriteKv;

struct Config {
  uint32_t seed;
  std::string policy;
  bool prefix_caching;
  bool device_faults = false;
  bool threaded_planning = false;
};

class KvCachePropertyTest : public ::testing::TestWithParam<Config> {};

TEST_P(KvCachePropertyTest, InvariantsHoldAfterEveryOperation) {
  const Config& cfg = GetParam();
  FakeBackend backend;
  FakeClock clock;
  {
    KvCacheOptions o = TinyOptions(/*initial_chunks=*/1, /*max_chunks=*/4);  // 4..16 blocks
    o.eviction_policy = cfg.policy;
    o.enable_prefix_caching = cfg.prefix_caching;
    o.defrag_low_water = 0.75;
    o.defrag_max_moves_per_step = 2;
    o.session_idle_timeout = absl::Seconds(60);
    o.max_pinned_fraction = 0.25;
    o.defrag_background_planning = cfg.threaded_planning;
    auto m = *KvCacheManager::Create(o, TinyShape(), &backend, &clock);

    std::mt19937 rng(cfg.seed);
    auto uniform = [&rng](int lo, int hi) {
      return std::uniform_int_distribution<int>(lo, hi)(rng);
    };
    // Three "system prompts" make prefix sharing common; a small vocabulary makes equal
    // blocks under different parents common too.
    const std::vector<std::vector<int32_t>> systems = {
        {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 9, 9, 9, 9, 9}, {7, 7, 7, 7, 7, 7, 7, 7}};
    std::map<SeqId, std::string> live;                    // id -> session ("" for none)
    // id -> the session it was added with, which a preempted sequence comes back with even
    // when the session was closed since (live then says "").
    std::map<SeqId, std::string> added_with;
    std::map<std::string, std::vector<int32_t>> history;  // session -> last turn's tokens
    struct Preempted {
      std::vector<int32_t> tokens;
      std::string session;  // "" for none
      bool closed = false;  // the session was closed since: it comes back without one
    };
    std::map<SeqId, Preempted> preempted;
    // A session is busy while a sequence holds it, running or preempted.
    auto busy = [&](const std::string& session) {
      if (session.empty()) return false;
      for (const auto& [id, s] : live) {
        if (s == session) return true;
      }
      for (const auto& [id, p] : preempted) {
        if (p.session == session && !p.closed) return true;
      }
      return false;
    };
    SeqId next_id = 0;
    constexpr int kKinds = 11;
    int64_t num_ops[kKinds] = {};

    const int kOps = 2500;
    for (int op = 0; op < kOps; ++op) {
      const int kind = uniform(0, 99);
      if (kind < 20 && live.size() < 8) {  // add
        std::string session;
        if (uniform(0, 2) == 0) session = "s" + std::to_string(uniform(0, 3));
        std::vector<int32_t> prompt;
        auto it = history.find(session);
        if (!session.empty() && it != history.end() && uniform(0, 3) != 0) {
          prompt = it->second;  // the next turn: history, maybe edited, plus new tokens
          if (!prompt.empty() && uniform(0, 4) == 0) prompt[uniform(0, prompt.size() - 1)] = 3;
        } else {
          prompt = systems[uniform(0, 2)];
        }
        const int extra = uniform(1, 10);
        for (int i = 0; i < extra; ++i) prompt.push_back(uniform(1, 5));
        if (prompt.size() > 40) prompt.resize(40);
        const SeqId id = next_id++;
        const int32_t probe = m->ProbePrefix(prompt, session);
        const bool session_busy = busy(session);
        absl::StatusOr<int32_t> cached = m->AddSequence(id, prompt, session);
        if (session_busy) {
          ASSERT_EQ(cached.status().code(), absl::StatusCode::kFailedPrecondition);
        } else {
          ASSERT_TRUE(cached.ok()) << cached.status();
          ASSERT_EQ(*cached, probe);
          ASSERT_LT(*cached, static_cast<int32_t>(prompt.size()));
          if (!cfg.prefix_caching && session.empty()) {
            ASSERT_EQ(*cached, 0);
          }
          live[id] = session;
          added_with[id] = session;
        }
        ++num_ops[0];
      } else if (kind < 50 && !live.empty()) {  // step: prefill chunk or decode
        auto it = std::next(live.begin(), uniform(0, live.size() - 1));
        const SeqId id = it->first;
        if (m->NumComputed(id) == m->NumTokens(id)) {
          if (m->NumTokens(id) >= 48) continue;
          m->AppendTokens(id, {uniform(1, 5)});
          ++num_ops[1];
        }
        const int32_t n = uniform(1, m->NumTokens(id) - m->NumComputed(id));
        const int32_t from = m->NumComputed(id);
        const KvCacheStats before = m->stats();
        if (m->Reserve(id, n)) {
          WriteKv(*m, id, from, from + n);
          m->MarkComputed(id, n);
        } else {
          ASSERT_GT(m->BlocksToReserve(id, n), m->NumObtainableBlocks());
          // Nothing was given up for room that did not come.
          const KvCacheStats after = m->stats();
          ASSERT_EQ(after.evictions, before.evictions) << "op " << op;
          ASSERT_EQ(after.num_prefix_keys, before.num_prefix_keys) << "op " << op;
          ASSERT_EQ(after.num_sessions, before.num_sessions) << "op " << op;
          ASSERT_EQ(after.pinned_blocks, before.pinned_blocks) << "op " << op;
        }
        ++num_ops[2];
      } else if (kind < 58 && !live.empty() && live.size() < 8) {  // fork
        auto it = std::next(live.begin(), uniform(0, live.size() - 1));
        const SeqId child = next_id++;
        absl::Status s = m->Fork(it->first, child);
        if (s.ok()) {
          live[child] = "";
        } else {
          // Internal: the fake device's copy failed.
          ASSERT_TRUE(s.code() == absl::StatusCode::kResourceExhausted ||
                      (cfg.device_faults && s.code() == absl::StatusCode::kInternal))
              << s;
          ASSERT_FALSE(m->HasSequence(child));
        }
        ++num_ops[3];
      } else if (kind < 70 && !live.empty()) {  // free (the sequence finished)
        auto it = std::next(live.begin(), uniform(0, live.size() - 1));
        if (!it->second.empty()) {
          const absl::Span<const int32_t> t = m->Tokens(it->first);
          history[it->second].assign(t.begin(), t.begin() + m->NumComputed(it->first));
        }
        m->Free(it->first);
        live.erase(it);
        ++num_ops[4];
      } else if (kind < 75 && !preempted.empty() && uniform(0, 2) != 0) {
        // A preempted sequence comes back (recompute from scratch), or ends while it waits.
        auto it = std::next(preempted.begin(), uniform(0, preempted.size() - 1));
        const SeqId id = it->first;
        if (live.size() < 8 && uniform(0, 3) != 0) {
          // Its session, if still there, is attached to it and matches nothing.
          const int32_t probe = m->ProbePrefix(it->second.tokens);
          absl::StatusOr<int32_t> cached =
              m->AddSequence(id, it->second.tokens, it->second.session);
          ASSERT_TRUE(cached.ok()) << "op " << op << ": " << cached.status();
          ASSERT_EQ(*cached, probe) << "op " << op;
          live[id] = it->second.closed ? "" : it->second.session;
          ++num_ops[9];
        } else {
          m->EndPreempted(id);
          ++num_ops[10];
        }
        preempted.erase(it);
      } else if (kind < 75 && !live.empty()) {  // preempt: its session waits for it
        auto it = std::next(live.begin(), uniform(0, live.size() - 1));
        const absl::Span<const int32_t> t = m->Tokens(it->first);
        const std::string& added = added_with[it->first];
        preempted[it->first] = {{t.begin(), t.end()}, added, it->second != added};
        m->FreeForRecompute(it->first);
        live.erase(it);
        ++num_ops[7];
      } else if (kind < 93) {  // step boundary, time passes
        clock.Advance(absl::Seconds(uniform(0, 12)));
        if (cfg.threaded_planning) m->WaitForDefragPlan();  // the same plans every run
        m->Tick();
        ++num_ops[5];
      } else if (kind < 96 && cfg.device_faults) {  // the device's memory or copies fail
        switch (uniform(0, 3)) {
          case 0:
            backend.FailAllocationsAfter(backend.num_allocations());
            break;
          case 1:
            backend.FailCopiesAfterPairs(uniform(0, 1));
            break;
          default:
            backend.FailAllocationsAfter(-1);
            backend.FailCopiesAfterPairs(-1);
            break;
        }
        ++num_ops[8];
      } else {  // close a session
        const std::string session = "s" + std::to_string(uniform(0, 3));
        if (m->CloseSession(session).ok()) {
          // Its sequence (if any), running or preempted, now ends like one without a session.
          for (auto& [id, s] : live) {
            if (s == session) s.clear();
          }
          for (auto& [id, p] : preempted) {
            if (p.session == session) p.closed = true;
          }
          history.erase(session);
        }
        ++num_ops[6];
      }
      absl::Status s = m->CheckInvariants();
      ASSERT_TRUE(s.ok()) << "op " << op << ": " << s;
      for (const auto& [id, session] : live) {
        ASSERT_EQ(CountBadKv(*m, id), 0) << "op " << op << " sequence " << id;
      }
    }
    // Every kind of operation ran, and the pool moved.
    for (int k = 0; k < kKinds; ++k) {
      if (k == 8 && !cfg.device_faults) continue;
      EXPECT_GT(num_ops[k], 0) << "operation kind " << k;
    }
    const KvCacheStats st = m->stats();
    EXPECT_GT(st.chunks_grown, 0);
    EXPECT_GT(st.evictions + st.chunks_released, 0);
    if (cfg.prefix_caching) {
      EXPECT_GT(st.prefix_hit_tokens, 0);
    }
    EXPECT_GT(st.session_hit_tokens, 0);
    EXPECT_GT(st.fork_copies, 0);
    // The end of the load: everything comes back.
    backend.FailAllocationsAfter(-1);
    backend.FailCopiesAfterPairs(-1);
    for (const auto& [id, session] : live) m->Free(id);
    for (const auto& [id, p] : preempted) m->EndPreempted(id);
    clock.Advance(absl::Minutes(1));
    for (int i = 0; i < 40; ++i) {
      m->WaitForDefragPlan();
      m->Tick();
    }
    const KvCacheStats end = m->stats();
    EXPECT_EQ(end.used_blocks, 0);
    EXPECT_EQ(end.pinned_blocks, 0);
    EXPECT_EQ(end.num_sessions, 0);
    EXPECT_EQ(end.num_chunks, 1);  // shrank back to the initial size
    EXPECT_EQ(end.free_blocks + end.cached_blocks, end.total_blocks);
    ASSERT_TRUE(m->CheckInvariants().ok());
  }
  EXPECT_EQ(backend.live_buffers(), 0);  // no leak
}

INSTANTIATE_TEST_SUITE_P(Seeds, KvCachePropertyTest,
                         ::testing::Values(Config{1, "lru", true}, Config{2, "lru", true},
                                           Config{3, "chunk_lru", true},
                                           Config{4, "chunk_lru", true}, Config{5, "lru", false},
                                           Config{6, "lru", true, /*device_faults=*/true},
                                           Config{7, "chunk_lru", true, true, true},
                                           Config{9, "lru", false, true, true}),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return "seed" + std::to_string(info.param.seed) + "_" +
                                  info.param.policy +
                                  (info.param.prefix_caching ? "" : "_nocache") +
                                  (info.param.device_faults ? "_faults" : "") +
                                  (info.param.threaded_planning ? "_threaded" : "");
                         });

}  // namespace
}  // namespace kvd
