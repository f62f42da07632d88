#ifndef KVD_CACHE_KV_CACHE_MANAGER_H_
#define KVD_CACHE_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/block_pool.h"
#include "cache/clock.h"
#include "cache/defragmenter.h"
#include "cache/kv_arena.h"
#include "cache/kv_cache_options.h"
#include "cache/kv_cache_stats.h"
#include "cache/kv_layout.h"
#include "cache/prefix_index.h"
#include "cache/session_table.h"
#include "kernels/backend.h"

namespace kvd {

using SeqId = int64_t;

// KvCacheManager is the request-level API over the KV cache: it owns the arena, block
// pool, prefix index, session table and defragmenter, and speaks in sequences.
//
// A sequence has tokens (prompt + known generated tokens), num_computed of which have K/V
// in its blocks, and a block table: block i holds positions [i * B, (i + 1) * B) where
// B = block_size. A step: Reserve(id, n) gives positions [num_computed, num_computed + n)
// slots (SlotOf), the backend writes their K/V, MarkComputed(id, n) advances
// num_computed and registers newly full blocks in the prefix index. Full computed blocks
// are immutable and may be shared; only a sequence's own partial last block is written.
//
// Invariants (CheckInvariants): each block's refcount equals its holders (sequence
// tables + pinned session chains); no block is both free and referenced; every prefix
// key matches its block's tokens; free + used + cached == total; nothing leaks; each
// attached session is held by exactly one sequence, live or preempted.
//
// Thread safety: none; the engine thread calls everything. Block ids, BlockIds() spans
// and slots are valid until the next Tick() (defragmentation rewrites block tables) or
// the next call that changes that sequence. Does not own the backend or the clock.
class KvCacheManager {
 public:
  // InvalidArgument for bad options or shape; Unimplemented for KV dtypes the arena does
  // not store; the backend's error if the initial chunks cannot be allocated. A null
  // backend makes an id-only cache (no memory; LayerView and byte copies unavailable),
  // for scheduler tests and planning.
  static absl::StatusOr<std::unique_ptr<KvCacheManager>> Create(const KvCacheOptions& options,
                                                                const KvShape& shape,
                                                                Backend* backend, Clock* clock);
  ~KvCacheManager();  // frees every sequence and session
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // Starts sequence `id` with its prompt and returns how many leading prompt tokens are
  // already computed: the session's pinned chain (when `session_id` names a detached
  // session; the session attaches to this sequence, and is created if unknown), then full
  // blocks found in the prefix index. At least the last prompt token is always left to
  // compute, so the step has logits. Takes no new blocks (Reserve does). A sequence
  // preempted by FreeForRecompute takes back the session it held, which stayed attached to
  // it (holding nothing); if that session was closed or released meanwhile, the sequence
  // runs without one, as a running turn whose session is closed ends without pinning.
  // InvalidArgument for an empty prompt, AlreadyExists for a live id, FailedPrecondition
  // when the session is attached to another sequence; nothing changes then. REQUIRES: a
  // preempted sequence comes back with the session id it had.
  // `admission` says whether the lookup counts in stats()' prefix counters (once the
  // sequence gets its slots): a request's first admission does; its return after a
  // preemption (kRecompute) does not, since it looks up the tokens it generated besides its
  // prompt and finds its own blocks again.
  enum class Admission { kFirst, kRecompute };
  absl::StatusOr<int32_t> AddSequence(SeqId id, absl::Span<const int32_t> prompt,
                                      std::string_view session_id = "",
                                      Admission admission = Admission::kFirst);
  // Appends known tokens (sampled ones) whose K/V are still to be computed.
  void AppendTokens(SeqId id, absl::Span<const int32_t> tokens);
  // Ensures slots for positions [num_computed, num_computed + n): takes free blocks, grows
  // the arena, then evicts cached blocks; when those fall short, releases detached sessions'
  // pins, oldest first, until they do (a running sequence comes before an idle session's
  // cache). Returns false when the pool cannot supply them even so (the caller preempts
  // someone and retries); nothing changes then, except that the arena may have grown (by
  // chunks it could add before one failed to allocate). The sequence's first successful
  // Reserve counts its prefix and session hits in stats(). REQUIRES: n >= 0.
  bool Reserve(SeqId id, int32_t n);
  // New blocks Reserve(id, n) would take.
  int32_t BlocksToReserve(SeqId id, int32_t n) const;
  // block_id * block_size + offset. REQUIRES: position < blocks * block_size.
  int64_t SlotOf(SeqId id, int32_t position) const;
  // K/V of the next n positions were written. REQUIRES: num_computed + n <= num tokens and
  // <= reserved slots.
  void MarkComputed(SeqId id, int32_t n);
  // Makes `child` a copy of `parent` (tokens, num_computed): shares its full computed
  // blocks and copies its partial last block through the backend (copy-on-write), for
  // n > 1 sampling. The child has no session. A block for the copy is found as Reserve
  // finds one. ResourceExhausted when there is none (nothing changes but, as for Reserve,
  // the arena's size; preempt and retry), or the backend's copy error (the block taken for
  // the copy may have been an evicted cached one). REQUIRES: parent live, child neither live nor
  // preempted.
  absl::Status Fork(SeqId parent, SeqId child);
  // Undoes AddSequence for a sequence that never got slots (the engine retries an admission
  // whose first Reserve failed): releases the blocks it took; a session that AddSequence
  // created is forgotten again, and one that existed gets back, pinned, the chain blocks and
  // tokens the sequence took from it, i.e. the part of its history the prompt matched (the
  // rest AddSequence already let go), its idle time starting again. A sequence back from
  // preemption goes back to waiting, its session attached to it as FreeForRecompute left
  // it. Counts no hit and no session release. REQUIRES: id was made by AddSequence (not
  // Fork), is live, and no Reserve of it has succeeded.
  void Abandon(SeqId id);
  // Ends the sequence. Blocks are released tail first (so its tail is evicted before its
  // prefix); with an attached session, the blocks of its computed tokens become the
  // session's pinned chain instead (then the pin cap applies).
  void Free(SeqId id);
  // Ends a sequence that will be recomputed (preemption): releases all its blocks, so that
  // nothing of it stays pinned. Its session stays attached to `id`, holding nothing, until
  // AddSequence(id, ...) takes it back or EndPreempted(id): another turn of the session
  // waits meanwhile (FailedPrecondition), CloseSession finds it, idle expiry passes it by.
  void FreeForRecompute(SeqId id);
  // A preempted sequence that will not come back (cancelled or expired while it waited):
  // its session, if still the one it held, is detached with nothing pinned, and its idle
  // time starts. Nothing happens for an id FreeForRecompute did not leave a session.
  void EndPreempted(SeqId id);
  // Releases the session's pins at once (blocks stay as ordinary cached blocks) and forgets
  // it. NotFound for an unknown (or already expired) id.
  absl::Status CloseSession(std::string_view session_id);
  // The step boundary: expires idle sessions, enforces the pin cap, tries one chunk again
  // once growth_retry_interval has passed since a failed growth stopped the arena, applies up to
  // defrag_max_moves_per_step block moves (and defrag_max_bytes_per_step bytes; copy +
  // block-table rewrite) and releases an emptied top chunk. Shrinking starts once used
  // blocks <= defrag_low_water * blocks below the top chunk and stops at the initial size.
  // Invalidates block ids, BlockIds() spans and slots.
  void Tick();

  // --- Queries. REQUIRES for the per-sequence ones: the sequence is live. ---
  bool HasSequence(SeqId id) const { return seqs_.contains(id); }
  int32_t NumComputed(SeqId id) const;
  int32_t NumTokens(SeqId id) const;
  absl::Span<const int32_t> Tokens(SeqId id) const;
  absl::Span<const int32_t> BlockIds(SeqId id) const;
  // A turn of `session_id` is waiting to run: the session is not idle. Its idle time starts
  // again now, and it is the last idle session released for room or the pin cap. No-op for
  // no session, an unknown one, or one attached to a sequence (running or preempted).
  void TouchSession(std::string_view session_id) {
    if (!session_id.empty()) sessions_.Touch(session_id);
  }
  // Whether AddSequence(id, prompt, session_id) would fail now because the session is
  // attached to another sequence (running, or preempted and waiting to run again): false for
  // no session, an unknown or detached one, and for a preempted `id` coming back (it takes
  // back its own session, or runs without one). Pure.
  bool SessionBusy(SeqId id, std::string_view session_id) const;
  // Prompt tokens AddSequence(prompt, session_id) would find computed now. Pure.
  int32_t ProbePrefix(absl::Span<const int32_t> prompt, std::string_view session_id = "") const;
  // What AddSequence(prompt, session_id) would reuse now, in blocks, for admission control.
  struct PrefixProbe {
    int32_t computed_tokens = 0;  // as ProbePrefix
    // Blocks it would take instead of new ones: from the session's chain, then the index.
    int32_t matched_blocks = 0;
    // Of those, the cached ones no one holds (refcount 0): NumObtainableBlocks() counts
    // them, and they stop being obtainable once the sequence holds them. A session's chain
    // is pinned, so never evictable.
    int32_t evictable_blocks = 0;
    // Also of matched_blocks (none of them evictable), the ones only idle sessions pin (its
    // own session's chain, say): NumObtainableBlocks() counts them as releasable, and they
    // stop being so once the sequence holds them.
    int32_t releasable_pinned_blocks = 0;
  };
  // Pure. With `id`, what AddSequence(id, prompt, session_id) would reuse: for a preempted
  // sequence coming back, no session chain (its own session holds nothing; one made anew
  // since is not its).
  PrefixProbe ProbePrefixBlocks(absl::Span<const int32_t> prompt, std::string_view session_id = "",
                                std::optional<SeqId> id = std::nullopt) const;
  // Blocks Reserve can obtain now, for admission: free + evictable cached + room to grow +
  // the blocks only idle sessions pin (Reserve releases those sessions, oldest first, when
  // it needs their blocks: pins give way to new work).
  // O(1): the pool counts the blocks held by session pins alone.
  int64_t NumObtainableBlocks() const { return pool_->NumObtainable() + pool_->num_only_pinned(); }
  int32_t num_free_blocks() const { return pool_->num_free(); }
  int32_t block_size() const { return layout_.block_size(); }
  const KvLayout& layout() const { return layout_; }
  const KvCacheOptions& options() const { return options_; }
  const KvPoolGeometry& geometry() const { return geometry_; }
  // REQUIRES: a backend was given; 0 <= layer < num_layers.
  KvCacheView LayerView(int32_t layer) const { return arena_->LayerView(layer); }
  // The arena (null without a backend), for tests that inspect bytes.
  const KvArena* arena() const { return arena_.get(); }
  KvCacheStats stats() const;
  // Quantiles of the recent defragmentation pauses (zero without a defragmenter); selects
  // over up to Defragmenter::kPauseWindow pauses, so not part of stats(), which the engine
  // takes every step.
  DefragPauseQuantiles RecentDefragPauseQuantiles() const;

  // Blocks until a submitted defragmentation plan is ready (tests; no-op without defrag).
  void WaitForDefragPlan();
  absl::Status CheckInvariants() const;

 private:
  // A session a preempted sequence held: still its own if the session table has this id
  // with this serial (attached; no other sequence can attach it meanwhile).
  struct PreemptedSession {
    std::string id;
    uint64_t serial = 0;
  };
  // Prompt tokens an admission looked up, and those it found computed.
  struct HitCounts {
    int64_t query_tokens = 0;
    int64_t prefix_hit_tokens = 0;
    int64_t session_hit_tokens = 0;
  };
  struct SeqState {
    std::vector<int32_t> tokens;
    std::vector<BlockId> blocks;
    // Prefix keys of the first keys.size() full blocks, each vouched for by the index
    // (PrefixIndex::Claim), so each may parent the next block's key.
    std::vector<uint64_t> keys;
    // Block keys.size() was not vouched for (its key is held for another prefix): no
    // deeper block is keyed, and it is not examined again.
    bool keys_stopped = false;
    int32_t num_computed = 0;
    std::string session_id;  // empty: none
    uint64_t session_serial = 0;
    bool session_created = false;  // AddSequence created the session (Abandon forgets it)
    // The session FreeForRecompute left attached to this id, taken back by AddSequence
    // (whether or not it was still there): Abandon and FreeForRecompute leave it again.
    std::optional<PreemptedSession> preempted_session;
    // What AddSequence found, counted in stats() once Reserve gives the sequence slots, so
    // that an admission undone for want of room (Abandon after a failed Reserve; the engine
    // retries it every step) is not counted once per attempt. Set: no Reserve succeeded yet.
    std::optional<HitCounts> uncounted_hits;
    bool counts_hits = true;  // AddSequence's Admission::kFirst
  };
  // What AddSequence would reuse for a prompt.
  struct Match {
    int32_t session_blocks = 0;         // leading chain blocks taken from the session
    int32_t session_tokens = 0;         // computed tokens they hold
    std::vector<BlockId> index_blocks;  // then these from the prefix index
    int32_t computed = 0;
  };

  KvCacheManager(const KvCacheOptions& options, const KvLayout& layout,
                 const KvPoolGeometry& geometry, Clock* clock);

  Match MatchPrompt(absl::Span<const int32_t> prompt, const Session* session) const;
  SeqState& Seq(SeqId id);
  const SeqState& Seq(SeqId id) const;
  void ReleaseTailFirst(absl::Span<const BlockId> blocks);
  void ReleaseSessions(const std::vector<SessionTable::Released>& released);
  void RegisterFullBlocks(SeqState& s);
  // Makes `need` blocks allocatable now: grows the arena, then releases detached sessions'
  // pins, oldest first, as Reserve documents. False when even that falls short; only the
  // arena's size has changed then.
  bool MakeAllocatable(int64_t need);
  // Allocates a block MakeAllocatable made room for; it cannot fail.
  BlockId AllocateObtainable();
  int64_t MaxPinnedBlocks() const;
  // Whether a pool of `chunks` chunks with the blocks used now would give its top one back:
  // above the initial chunks, with use at or below the low-water mark of the rest.
  bool MayShrinkFrom(int32_t chunks) const;
  bool ShouldShrink() const;
  // The chunks the pool would shrink to, one top chunk at a time, with the use of now.
  int32_t ShrinkTarget() const;
  // After growth_retry_interval from the first Tick() that saw a failed growth stop the
  // arena, lifts the stop and tries one chunk (Tick()).
  void RetryGrowthWhenDue();
  void DefragStep();
  // What one ApplyMoves did: whether it copied (or tried to), and the moves it applied.
  struct MovesApplied {
    bool copied = false;
    int32_t moved = 0;
  };
  MovesApplied ApplyMoves();

  const KvCacheOptions options_;
  const KvLayout layout_;
  const KvPoolGeometry geometry_;
  Clock* const clock_;
  // Destruction order matters: the pool (which calls back into the index) goes before
  // the index, and the arena outlives both.
  std::unique_ptr<KvArena> arena_;
  PrefixIndex index_;
  std::unique_ptr<BlockPool> pool_;
  SessionTable sessions_;
  std::unique_ptr<Defragmenter> defrag_;
  absl::flat_hash_map<SeqId, SeqState> seqs_;
  absl::flat_hash_map<SeqId, PreemptedSession> preempted_;  // by FreeForRecompute
  std::deque<BlockMove> pending_moves_;

  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t session_hit_tokens_ = 0;
  int64_t session_releases_[kNumSessionReleaseReasons] = {};  // by SessionReleaseReason
  int64_t fork_copies_ = 0;
  int64_t defrag_moves_ = 0;
  absl::Time last_defrag_step_ = absl::InfinitePast();
  // The growth failures Tick() has seen, and when it saw the last one (RetryGrowthWhenDue).
  int64_t growth_failures_seen_ = 0;
  absl::Time growth_failure_seen_at_ = absl::InfinitePast();
  double seconds_per_move_ = 0;  // moving average of the measured cost of one move
};

}  // namespace kvd

#endif  // KVD_CACHE_KV_CACHE_MANAGER_H_
