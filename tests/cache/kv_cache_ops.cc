#include "tests/cache/kv_cache_ops.h"

#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "tests/cache/fake_backend.h"
#include "tests/cache/kv_test_util.h"

namespace kvd {
namespace testing_util {

KvOpsOutcome RunKvCacheOps(const KvOpsConfig& cfg, int max_ops, const KvOpsChooser& uniform,
                           const std::function<bool()>& more) {
  KvOpsOutcome out;
  FakeBackend backend;
  FakeClock clock;
  int op = 0;
#define KVD_OPS_CHECK(condition, what)                                      \
  do {                                                                      \
    if (!(condition)) {                                                     \
      out.error = absl::StrCat("op ", op, ": ", what, " (" #condition ")"); \
      return out;                                                           \
    }                                                                       \
  } while (false)
  {
    KvCacheOptions o = TinyOptions(/*initial_chunks=*/1, /*max_chunks=*/4);  // 4..16 blocks
    o.eviction_policy = cfg.policy;
    o.enable_prefix_caching = cfg.prefix_caching;
    o.defrag_low_water = 0.75;
    o.defrag_max_moves_per_step = 2;
    o.session_idle_timeout = absl::Seconds(60);
    o.max_pinned_fraction = 0.25;
    o.defrag_background_planning = cfg.threaded_planning;
    auto created = KvCacheManager::Create(o, TinyShape(), &backend, &clock);
    KVD_OPS_CHECK(created.ok(), created.status().ToString());
    std::unique_ptr<KvCacheManager> m = *std::move(created);

    // Three "system prompts" make prefix sharing common; a small vocabulary makes equal
    // blocks under different parents common too.
    const std::vector<std::vector<int32_t>> systems = {
        {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 9, 9, 9, 9, 9}, {7, 7, 7, 7, 7, 7, 7, 7}};
    std::map<SeqId, std::string> live;  // id -> session ("" for none)
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
    auto any_of = [&](auto& map) {
      return std::next(map.begin(), uniform(0, static_cast<int>(map.size()) - 1));
    };
    SeqId next_id = 0;

    for (; op < max_ops && more(); ++op) {
      const int kind = uniform(0, 99);
      if (kind < 20 && live.size() < 8) {  // add
        std::string session;
        if (uniform(0, 2) == 0) session = "s" + std::to_string(uniform(0, 3));
        std::vector<int32_t> prompt;
        auto it = history.find(session);
        if (!session.empty() && it != history.end() && uniform(0, 3) != 0) {
          prompt = it->second;  // the next turn: history, maybe edited, plus new tokens
          if (!prompt.empty() && uniform(0, 4) == 0) {
            prompt[uniform(0, static_cast<int>(prompt.size()) - 1)] = 3;
          }
        } else {
          prompt = systems[uniform(0, 2)];
        }
        const int extra = uniform(1, 10);
        for (int i = 0; i < extra; ++i) prompt.push_back(uniform(1, 5));
        if (prompt.size() > 40) prompt.resize(40);
        const SeqId id = next_id++;
        const int32_t probe = m->ProbePrefix(prompt, session);
        const bool session_busy = busy(session);
        KVD_OPS_CHECK(m->SessionBusy(id, session) == session_busy,
                      "SessionBusy disagrees with the sessions' holders");
        absl::StatusOr<int32_t> cached = m->AddSequence(id, prompt, session);
        if (session_busy) {
          KVD_OPS_CHECK(cached.status().code() == absl::StatusCode::kFailedPrecondition,
                        cached.status().ToString());
        } else {
          KVD_OPS_CHECK(cached.ok(), cached.status().ToString());
          KVD_OPS_CHECK(*cached == probe, "AddSequence found another prefix than ProbePrefix");
          KVD_OPS_CHECK(*cached < static_cast<int32_t>(prompt.size()), "the whole prompt cached");
          KVD_OPS_CHECK(cfg.prefix_caching || !session.empty() || *cached == 0,
                        "a prefix hit with prefix caching off");
          if (uniform(0, 4) == 0) {
            // The engine's undo of an admission whose first Reserve found no room: all it took
            // goes back, and the same prompt finds at least the same prefix again (its
            // session's matched part pinned anew, the rest still cached).
            m->Abandon(id);
            const absl::Status valid = m->CheckInvariants();
            KVD_OPS_CHECK(valid.ok(), "after Abandon: " + valid.ToString());
            const int32_t again = m->ProbePrefix(prompt, session);
            KVD_OPS_CHECK(again >= *cached,
                          absl::StrCat("Abandon lost the prefix: ", again, " < ", *cached));
            ++out.num_ops[kOpAbandon];
          } else {
            live[id] = session;
            added_with[id] = session;
          }
        }
        ++out.num_ops[kOpAdd];
      } else if (kind < 50 && !live.empty()) {  // step: prefill chunk or decode
        const SeqId id = any_of(live)->first;
        if (m->NumComputed(id) == m->NumTokens(id)) {
          if (m->NumTokens(id) >= 48) continue;
          m->AppendTokens(id, {uniform(1, 5)});
          ++out.num_ops[kOpAppend];
        }
        const int32_t n = uniform(1, m->NumTokens(id) - m->NumComputed(id));
        const int32_t from = m->NumComputed(id);
        const KvCacheStats before = m->stats();
        if (m->Reserve(id, n)) {
          WriteKv(*m, id, from, from + n);
          m->MarkComputed(id, n);
        } else {
          KVD_OPS_CHECK(m->BlocksToReserve(id, n) > m->NumObtainableBlocks(),
                        "Reserve failed with room to spare");
          // Nothing was given up for room that did not come.
          const KvCacheStats after = m->stats();
          KVD_OPS_CHECK(after.evictions == before.evictions, "a failed Reserve evicted");
          KVD_OPS_CHECK(after.num_prefix_keys == before.num_prefix_keys,
                        "a failed Reserve dropped prefix keys");
          KVD_OPS_CHECK(after.num_sessions == before.num_sessions,
                        "a failed Reserve released a session");
          KVD_OPS_CHECK(after.pinned_blocks == before.pinned_blocks,
                        "a failed Reserve unpinned blocks");
        }
        ++out.num_ops[kOpStep];
      } else if (kind < 58 && !live.empty() && live.size() < 8) {  // fork
        const SeqId parent = any_of(live)->first;
        const SeqId child = next_id++;
        const absl::Status s = m->Fork(parent, child);
        if (s.ok()) {
          live[child] = "";
        } else {
          // Internal: the fake device's copy failed.
          KVD_OPS_CHECK(s.code() == absl::StatusCode::kResourceExhausted ||
                            (cfg.device_faults && s.code() == absl::StatusCode::kInternal),
                        s.ToString());
          KVD_OPS_CHECK(!m->HasSequence(child), "a failed Fork left its child");
        }
        ++out.num_ops[kOpFork];
      } else if (kind < 70 && !live.empty()) {  // free (the sequence finished)
        auto it = any_of(live);
        if (!it->second.empty()) {
          const absl::Span<const int32_t> t = m->Tokens(it->first);
          history[it->second].assign(t.begin(), t.begin() + m->NumComputed(it->first));
        }
        m->Free(it->first);
        live.erase(it);
        ++out.num_ops[kOpFree];
      } else if (kind < 75 && !preempted.empty() && uniform(0, 2) != 0) {
        // A preempted sequence comes back (recompute from scratch), or ends while it waits.
        auto it = any_of(preempted);
        const SeqId id = it->first;
        if (live.size() < 8 && uniform(0, 3) != 0) {
          // Its session, if still there, is attached to it and matches nothing.
          KVD_OPS_CHECK(!m->SessionBusy(id, it->second.session),
                        "a preempted sequence's own session is busy for it");
          const int32_t probe = m->ProbePrefix(it->second.tokens);
          absl::StatusOr<int32_t> cached =
              m->AddSequence(id, it->second.tokens, it->second.session);
          KVD_OPS_CHECK(cached.ok(), cached.status().ToString());
          KVD_OPS_CHECK(*cached == probe, "a readmission found another prefix than ProbePrefix");
          live[id] = it->second.closed ? "" : it->second.session;
          ++out.num_ops[kOpReadmit];
        } else {
          m->EndPreempted(id);
          ++out.num_ops[kOpEndPreempted];
        }
        preempted.erase(it);
      } else if (kind < 75 && !live.empty()) {  // preempt: its session waits for it
        auto it = any_of(live);
        const absl::Span<const int32_t> t = m->Tokens(it->first);
        const std::string& added = added_with[it->first];
        preempted[it->first] = {{t.begin(), t.end()}, added, it->second != added};
        m->FreeForRecompute(it->first);
        live.erase(it);
        ++out.num_ops[kOpPreempt];
      } else if (kind < 93) {  // step boundary, time passes
        clock.Advance(absl::Seconds(uniform(0, 12)));
        if (cfg.threaded_planning) m->WaitForDefragPlan();  // the same plans every run
        m->Tick();
        ++out.num_ops[kOpTick];
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
        ++out.num_ops[kOpFault];
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
        ++out.num_ops[kOpClose];
      }
      const absl::Status s = m->CheckInvariants();
      KVD_OPS_CHECK(s.ok(), s.ToString());
      for (const auto& [id, session] : live) {
        KVD_OPS_CHECK(CountBadKv(*m, id) == 0, absl::StrCat("sequence ", id, " reads wrong KV"));
      }
    }
    out.stats = m->stats();

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
    out.end = m->stats();
    const absl::Status s = m->CheckInvariants();
    KVD_OPS_CHECK(s.ok(), absl::StrCat("at the end: ", s.ToString()));
  }
#undef KVD_OPS_CHECK
  out.live_buffers = backend.live_buffers();
  return out;
}

}  // namespace testing_util
}  // namespace kvd
