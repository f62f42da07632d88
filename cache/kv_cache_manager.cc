#include "cache/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "cache/cache_check.h"
#include "cache/eviction_policy.h"

namespace kvd {

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(
    const KvCacheOptions& options, const KvShape& shape, Backend* backend, Clock* clock) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (clock == nullptr) return absl::InvalidArgumentError("KvCacheManager needs a clock");
  absl::StatusOr<KvLayout> layout = KvLayout::Create(shape, options.kv_dtype, options.block_size);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<KvPoolGeometry> geometry = KvPoolGeometry::Compute(options, *layout);
  if (!geometry.ok()) return geometry.status();
  std::unique_ptr<KvCacheManager> m(new KvCacheManager(options, *layout, *geometry, clock));
  if (backend != nullptr) {
    absl::StatusOr<std::unique_ptr<KvArena>> arena =
        KvArena::Create(*layout, geometry->chunk_shift, geometry->max_chunks, backend);
    if (!arena.ok()) return arena.status();
    m->arena_ = *std::move(arena);
    m->arena_->set_device_headroom_bytes(options.device_headroom_bytes);
  }
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy =
      MakeEvictionPolicy(options.eviction_policy, geometry->chunk_shift);
  if (!policy.ok()) return policy.status();
  KvCacheManager* raw = m.get();
  absl::StatusOr<std::unique_ptr<BlockPool>> pool = BlockPool::Create(
      {geometry->chunk_shift, geometry->initial_chunks, geometry->max_chunks}, *std::move(policy),
      m->arena_.get(), [raw](BlockId b) { raw->index_.Remove(b); });
  if (!pool.ok()) return pool.status();
  m->pool_ = *std::move(pool);
  if (options.enable_defrag) {
    DefragOptions d;
    d.max_moves_per_step = options.defrag_max_moves_per_step;
    d.low_water = options.defrag_low_water;
    d.background_planning = options.defrag_background_planning;
    m->defrag_ = std::make_unique<Defragmenter>(d);
  }
  return m;
}

KvCacheManager::KvCacheManager(const KvCacheOptions& options, const KvLayout& layout,
                               const KvPoolGeometry& geometry, Clock* clock)
    : options_(options),
      layout_(layout),
      geometry_(geometry),
      clock_(clock),
      // A fresh secret per cache: keys are never persisted, and clients cannot aim
      // crafted token blocks at keys they cannot compute.
      index_(layout.block_size(),
             layout.Fingerprint() ^ (options.prefix_extra_key * 0x9e3779b97f4a7c15ULL),
             options.prefix_key_secret.has_value() ? *options.prefix_key_secret
                                                   : PrefixIndex::RandomSecret()),
      // The pool keeps a count of every block's session pins (Create makes it before any
      // session can pin), so the room idle sessions hold is known without a walk.
      sessions_(clock, options.session_idle_timeout, [this](BlockId b, int32_t delta) {
        if (delta > 0) {
          pool_->Pin(b);
        } else {
          pool_->Unpin(b);
        }
      }) {}

KvCacheManager::~KvCacheManager() {
  if (pool_ == nullptr) return;  // Create failed half way
  for (auto& [id, s] : seqs_) ReleaseTailFirst(s.blocks);
  seqs_.clear();
  std::vector<std::string> ids;
  sessions_.ForEach([&ids](const Session& s) { ids.push_back(s.id); });
  for (const std::string& id : ids) {
    if (std::optional<SessionTable::Released> r = sessions_.Close(id)) ReleaseTailFirst(r->chain);
  }
}

KvCacheManager::SeqState& KvCacheManager::Seq(SeqId id) {
  auto it = seqs_.find(id);
  KVD_CACHE_CHECK(it != seqs_.end(), "unknown sequence id");
  return it->second;
}

const KvCacheManager::SeqState& KvCacheManager::Seq(SeqId id) const {
  auto it = seqs_.find(id);
  KVD_CACHE_CHECK(it != seqs_.end(), "unknown sequence id");
  return it->second;
}

void KvCacheManager::ReleaseTailFirst(absl::Span<const BlockId> blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) pool_->Release(*it);
}

KvCacheManager::Match KvCacheManager::MatchPrompt(absl::Span<const int32_t> prompt,
                                                  const Session* session) const {
  const int32_t bs = layout_.block_size();
  const int32_t max_reuse = static_cast<int32_t>(prompt.size()) - 1;
  Match m;
  if (session != nullptr && !session->attached) {
    const int32_t limit = std::min<int32_t>(max_reuse, session->tokens.size());
    int32_t lcp = 0;
    while (lcp < limit && prompt[lcp] == session->tokens[lcp]) ++lcp;
    m.session_blocks = lcp / bs;
    m.session_tokens = m.session_blocks * bs;
    // A partly matching block is taken only when the session is its sole holder and it
    // has no key: the new sequence will overwrite the positions after the match.
    if (lcp % bs != 0 && m.session_blocks < static_cast<int32_t>(session->chain.size())) {
      const BlockId b = session->chain[m.session_blocks];
      if (pool_->RefCount(b) == 1 && !pool_->IsCached(b)) {
        ++m.session_blocks;
        m.session_tokens = lcp;
      }
    }
  }
  m.computed = m.session_tokens;
  if (!options_.enable_prefix_caching || m.computed % bs != 0) return m;
  uint64_t parent = index_.root_key();
  int32_t i = 0;
  // The session's blocks matched by their tokens; the index goes on from their keys only
  // while it resolves each to this prefix (the rule RegisterFullBlocks keys by): a collision
  // met when the session's turn registered would otherwise lead into another prefix's
  // deeper blocks, whose keys follow from the same tokens.
  for (; i < m.session_blocks; ++i) {
    const absl::Span<const int32_t> tokens = prompt.subspan(i * bs, bs);
    const uint64_t key = index_.ChildKey(parent, tokens);
    if (!index_.Find(key, parent, tokens).has_value()) return m;
    parent = key;
  }
  for (; (i + 1) * bs <= max_reuse; ++i) {
    const absl::Span<const int32_t> tokens = prompt.subspan(i * bs, bs);
    const uint64_t key = index_.ChildKey(parent, tokens);
    std::optional<BlockId> b = index_.Find(key, parent, tokens);
    if (!b.has_value()) break;
    m.index_blocks.push_back(*b);
    parent = key;
  }
  m.computed += static_cast<int32_t>(m.index_blocks.size()) * bs;
  return m;
}

absl::StatusOr<int32_t> KvCacheManager::AddSequence(SeqId id, absl::Span<const int32_t> prompt,
                                                    std::string_view session_id,
                                                    Admission admission) {
  if (prompt.empty()) return absl::InvalidArgumentError("AddSequence: empty prompt");
  if (seqs_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("AddSequence: sequence ", id, " is live"));
  }
  SeqState s;
  if (auto p = preempted_.find(id); p != preempted_.end()) {
    KVD_CACHE_CHECK(p->second.id == session_id,
                    "AddSequence: a preempted sequence came back with another session");
    s.preempted_session = std::move(p->second);
    preempted_.erase(p);
    const Session* held = sessions_.Find(session_id);
    if (held != nullptr && held->serial == s.preempted_session->serial) {
      s.session_id = held->id;  // still attached to this id, with no chain to match
      s.session_serial = held->serial;
    }
    session_id = {};  // taken back, or closed meanwhile: attach nothing
  }
  const Session* session = session_id.empty() ? nullptr : sessions_.Find(session_id);
  const Match m = MatchPrompt(prompt, session);
  s.tokens.assign(prompt.begin(), prompt.end());
  if (!session_id.empty()) {
    absl::StatusOr<Session*> attached = sessions_.Attach(session_id);
    if (!attached.ok()) return attached.status();
    Session& se = **attached;
    s.session_id = se.id;
    s.session_serial = se.serial;
    s.session_created = session == nullptr;
    std::vector<BlockId> chain = std::move(se.chain);
    se.chain.clear();
    se.tokens.clear();
    s.blocks.assign(chain.begin(), chain.begin() + m.session_blocks);
    ReleaseTailFirst(absl::MakeConstSpan(chain).subspan(m.session_blocks));
  }
  for (BlockId b : m.index_blocks) {
    pool_->Acquire(b);
    s.blocks.push_back(b);
  }
  s.num_computed = m.computed;
  RegisterFullBlocks(s);
  s.uncounted_hits = HitCounts{static_cast<int64_t>(prompt.size()),
                               static_cast<int64_t>(m.index_blocks.size()) * layout_.block_size(),
                               m.session_tokens};
  s.counts_hits = admission == Admission::kFirst;
  seqs_.emplace(id, std::move(s));
  return m.computed;
}

bool KvCacheManager::SessionBusy(SeqId id, std::string_view session_id) const {
  if (session_id.empty() || preempted_.contains(id)) return false;
  const Session* session = sessions_.Find(session_id);
  return session != nullptr && session->attached;
}

int32_t KvCacheManager::ProbePrefix(absl::Span<const int32_t> prompt,
                                    std::string_view session_id) const {
  return ProbePrefixBlocks(prompt, session_id).computed_tokens;
}

KvCacheManager::PrefixProbe KvCacheManager::ProbePrefixBlocks(absl::Span<const int32_t> prompt,
                                                              std::string_view session_id,
                                                              std::optional<SeqId> id) const {
  PrefixProbe p;
  if (prompt.empty()) return p;
  const bool comes_back = id.has_value() && preempted_.contains(*id);
  const Session* session = session_id.empty() || comes_back ? nullptr : sessions_.Find(session_id);
  const Match m = MatchPrompt(prompt, session);
  p.computed_tokens = m.computed;
  p.matched_blocks = m.session_blocks + static_cast<int32_t>(m.index_blocks.size());
  const auto count = [&](BlockId b) {
    p.evictable_blocks += pool_->RefCount(b) == 0 ? 1 : 0;
    const int32_t pins = pool_->PinCount(b);
    p.releasable_pinned_blocks += pins > 0 && pool_->RefCount(b) == pins ? 1 : 0;
  };
  for (int32_t i = 0; i < m.session_blocks; ++i) count(session->chain[i]);
  for (BlockId b : m.index_blocks) count(b);
  return p;
}

void KvCacheManager::AppendTokens(SeqId id, absl::Span<const int32_t> tokens) {
  SeqState& s = Seq(id);
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
}

int32_t KvCacheManager::BlocksToReserve(SeqId id, int32_t n) const {
  const SeqState& s = Seq(id);
  const int64_t needed = layout_.BlocksForTokens(int64_t{s.num_computed} + n);
  return static_cast<int32_t>(std::max<int64_t>(0, needed - static_cast<int64_t>(s.blocks.size())));
}

bool KvCacheManager::MakeAllocatable(int64_t need) {
  // Releasing a chain makes obtainable only the blocks that no one but sessions holds; when
  // even all of those and every chunk the arena may add would not do, nothing is touched.
  if (need <= pool_->num_free()) return true;  // the common case
  if (need > NumObtainableBlocks()) return false;
  // Growth first, as Allocate() would (free, grow, evict), but here where its failure (the
  // device is out of memory) is seen before a cached block or a session is given up for a
  // room that is not there. CanGrow() is false after a failure, so NumObtainable() below
  // counts only blocks that exist.
  while (need > pool_->num_free() && pool_->CanGrow() && pool_->Grow().ok()) {
  }
  if (need > NumObtainableBlocks()) return false;
  // A session whose every block a sequence also holds would free nothing: passed by. Blocks
  // that only pins hold (several sessions may pin one) become obtainable once every session
  // pinning them is let go, and each of those sessions passes this test until then.
  auto frees = [this](const std::vector<BlockId>& chain) {
    return absl::c_any_of(chain,
                          [this](BlockId b) { return pool_->RefCount(b) == pool_->PinCount(b); });
  };
  while (need > pool_->NumObtainable()) {
    std::optional<SessionTable::Released> r =
        sessions_.ReleaseOldest(SessionReleaseReason::kPressure, frees);
    KVD_CACHE_CHECK(r.has_value(), "MakeAllocatable: releasable pins ran out early");
    ReleaseSessions({*std::move(r)});
  }
  return true;
}

BlockId KvCacheManager::AllocateObtainable() {
  std::optional<BlockId> b = pool_->Allocate();
  KVD_CACHE_CHECK(b.has_value(), "a block MakeAllocatable promised is not there");
  return *b;
}

bool KvCacheManager::Reserve(SeqId id, int32_t n) {
  KVD_CACHE_CHECK(n >= 0, "Reserve: n must be >= 0");
  const int32_t need = BlocksToReserve(id, n);
  if (need > 0 && !MakeAllocatable(need)) return false;
  SeqState& s = Seq(id);
  for (int32_t i = 0; i < need; ++i) s.blocks.push_back(AllocateObtainable());
  if (s.uncounted_hits.has_value()) {  // its first slots: the admission stands
    if (s.counts_hits) {
      prefix_query_tokens_ += s.uncounted_hits->query_tokens;
      prefix_hit_tokens_ += s.uncounted_hits->prefix_hit_tokens;
      session_hit_tokens_ += s.uncounted_hits->session_hit_tokens;
    }
    s.uncounted_hits.reset();
  }
  return true;
}

int64_t KvCacheManager::SlotOf(SeqId id, int32_t position) const {
  const SeqState& s = Seq(id);
  const int32_t bs = layout_.block_size();
  KVD_CACHE_CHECK(position >= 0 && position / bs < static_cast<int32_t>(s.blocks.size()),
                  "SlotOf: position has no reserved slot");
  return int64_t{s.blocks[position / bs]} * bs + position % bs;
}

void KvCacheManager::RegisterFullBlocks(SeqState& s) {
  if (!options_.enable_prefix_caching) return;
  const int32_t bs = layout_.block_size();
  const absl::Span<const int32_t> tokens = s.tokens;
  // A block is found by its parent key and its own tokens only, so it may be keyed under
  // block i - 1's key only while the index resolves that key to this sequence's prefix:
  // after a collision, a prompt matching the other holder would go on into this
  // sequence's deeper blocks, whose K/V were computed after different tokens.
  while (!s.keys_stopped && (static_cast<int32_t>(s.keys.size()) + 1) * bs <= s.num_computed) {
    const int32_t i = static_cast<int32_t>(s.keys.size());
    const uint64_t parent = i == 0 ? index_.root_key() : s.keys[i - 1];
    const absl::Span<const int32_t> block_tokens = tokens.subspan(i * bs, bs);
    const uint64_t key = index_.ChildKey(parent, block_tokens);
    const BlockId b = s.blocks[i];
    switch (index_.Claim(b, key, parent, block_tokens)) {
      case PrefixIndex::KeyClaim::kInserted:
        pool_->MarkCached(b);
        break;
      case PrefixIndex::KeyClaim::kHeld:
      case PrefixIndex::KeyClaim::kDuplicate:
        break;
      case PrefixIndex::KeyClaim::kCollision:
        s.keys_stopped = true;
        return;
    }
    s.keys.push_back(key);
  }
}

void KvCacheManager::MarkComputed(SeqId id, int32_t n) {
  SeqState& s = Seq(id);
  const int64_t after = int64_t{s.num_computed} + n;
  KVD_CACHE_CHECK(n >= 0 && after <= static_cast<int64_t>(s.tokens.size()),
                  "MarkComputed: past the known tokens");
  KVD_CACHE_CHECK(after <= static_cast<int64_t>(s.blocks.size()) * layout_.block_size(),
                  "MarkComputed: past the reserved slots");
  s.num_computed = static_cast<int32_t>(after);
  RegisterFullBlocks(s);
}

absl::Status KvCacheManager::Fork(SeqId parent, SeqId child) {
  KVD_CACHE_CHECK(!seqs_.contains(child), "Fork: child id is live");
  KVD_CACHE_CHECK(!preempted_.contains(child), "Fork: child id is a preempted sequence's");
  const SeqState& p = Seq(parent);
  const int32_t bs = layout_.block_size();
  const int32_t full = p.num_computed / bs;
  const bool partial = p.num_computed % bs != 0;
  SeqState c;
  if (partial) {
    if (!MakeAllocatable(1)) return absl::ResourceExhaustedError("Fork: no free KV block");
    const BlockId copy = AllocateObtainable();
    if (arena_ != nullptr) {
      const BlockId src = p.blocks[full];
      if (absl::Status s = arena_->CopyBlocks({&src, 1}, {&copy, 1}); !s.ok()) {
        pool_->Release(copy);
        return s;
      }
    }
    ++fork_copies_;
    c.blocks.assign(p.blocks.begin(), p.blocks.begin() + full);
    c.blocks.push_back(copy);
  } else {
    c.blocks.assign(p.blocks.begin(), p.blocks.begin() + full);
  }
  for (int32_t i = 0; i < full; ++i) pool_->Acquire(c.blocks[i]);
  c.tokens = p.tokens;
  c.keys = p.keys;
  c.keys_stopped = p.keys_stopped;
  c.num_computed = p.num_computed;
  seqs_.emplace(child, std::move(c));  // invalidates p
  return absl::OkStatus();
}

void KvCacheManager::RetryGrowthWhenDue() {
  if (!pool_->growth_stopped()) return;
  const absl::Time now = clock_->Now();
  if (pool_->num_growth_failures() != growth_failures_seen_) {
    growth_failures_seen_ = pool_->num_growth_failures();
    growth_failure_seen_at_ = now;
    return;
  }
  if (now - growth_failure_seen_at_ < options_.growth_retry_interval) return;
  // A pool that defragmentation is shrinking needs no chunk, and the release will lift the
  // stop anyway.
  if (defrag_ != nullptr && ShouldShrink()) return;
  // Here rather than at the next allocation that needs a chunk: lifting the stop alone would
  // have NumObtainableBlocks() count room up to max_chunks that may not be there, and
  // admission would let in requests on it until some allocation found out. Once a chunk is
  // added, growth goes on as before the failure: room up to max_chunks is counted again.
  pool_->ResumeGrowth();
  if (!pool_->Grow().ok()) {  // stopped again, and counted: the next try is an interval on
    growth_failures_seen_ = pool_->num_growth_failures();
    growth_failure_seen_at_ = now;
  }
}

void KvCacheManager::Tick() {
  ReleaseSessions(sessions_.ExpireIdle());
  ReleaseSessions(sessions_.EnforcePinCap(MaxPinnedBlocks()));
  RetryGrowthWhenDue();
  if (defrag_ != nullptr) {
    const absl::Time now = clock_->Now();
    if (now - last_defrag_step_ >= options_.defrag_interval) {
      last_defrag_step_ = now;
      DefragStep();
    }
  }
}

int32_t KvCacheManager::NumComputed(SeqId id) const { return Seq(id).num_computed; }
int32_t KvCacheManager::NumTokens(SeqId id) const {
  return static_cast<int32_t>(Seq(id).tokens.size());
}
absl::Span<const int32_t> KvCacheManager::Tokens(SeqId id) const { return Seq(id).tokens; }
absl::Span<const int32_t> KvCacheManager::BlockIds(SeqId id) const { return Seq(id).blocks; }

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats st;
  st.block_size = layout_.block_size();
  st.block_bytes = layout_.block_bytes();
  st.blocks_per_chunk = pool_->blocks_per_chunk();
  st.num_chunks = pool_->num_chunks();
  st.max_chunks = pool_->max_chunks();
  st.total_blocks = pool_->num_blocks();
  st.max_blocks = pool_->max_blocks();
  st.free_blocks = pool_->num_free();
  st.used_blocks = pool_->num_used();
  st.cached_blocks = pool_->num_cached();
  st.pinned_blocks = sessions_.num_pinned_blocks();
  st.block_references = pool_->num_references();
  st.shared_blocks = pool_->num_shared();
  st.obtainable_blocks = NumObtainableBlocks();
  st.total_bytes = st.total_blocks * st.block_bytes;
  st.used_bytes = st.used_blocks * st.block_bytes;
  st.cached_bytes = st.cached_blocks * st.block_bytes;
  st.max_bytes = st.max_blocks * st.block_bytes;
  st.num_sequences = static_cast<int32_t>(seqs_.size());
  st.num_sessions = sessions_.num_sessions();
  st.num_prefix_keys = index_.size();
  st.prefix_query_tokens = prefix_query_tokens_;
  st.prefix_hit_tokens = prefix_hit_tokens_;
  st.session_hit_tokens = session_hit_tokens_;
  st.evictions = pool_->num_evictions();
  st.session_releases_idle = session_releases_[static_cast<int>(SessionReleaseReason::kIdle)];
  st.session_releases_pin_cap = session_releases_[static_cast<int>(SessionReleaseReason::kPinCap)];
  st.session_releases_closed = session_releases_[static_cast<int>(SessionReleaseReason::kClosed)];
  st.session_releases_pressure =
      session_releases_[static_cast<int>(SessionReleaseReason::kPressure)];
  st.fork_copies = fork_copies_;
  st.chunks_grown = pool_->num_chunks_grown();
  st.chunks_released = pool_->num_chunks_released();
  st.chunk_growth_failures = pool_->num_growth_failures();
  st.last_growth_error = pool_->last_growth_error();
  st.chunk_growth_stopped = pool_->growth_stopped();
  st.defrag_moves = defrag_moves_;
  if (defrag_ != nullptr) st.defrag_pauses = defrag_->pause_stats();
  return st;
}

DefragPauseQuantiles KvCacheManager::RecentDefragPauseQuantiles() const {
  return defrag_ != nullptr ? defrag_->RecentPauseQuantiles() : DefragPauseQuantiles{};
}

}  // namespace kvd
