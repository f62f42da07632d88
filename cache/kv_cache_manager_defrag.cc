// KvCacheManager's step-boundary half of defragmentation: deciding when to shrink,
// handing snapshots to the Defragmenter's planner, and applying its moves.

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "cache/kv_cache_manager.h"

namespace kvd {

bool KvCacheManager::MayShrinkFrom(int32_t chunks) const {
  if (chunks <= pool_->initial_chunks()) return false;
  const int64_t below = int64_t{chunks - 1} * pool_->blocks_per_chunk();
  return pool_->num_used() <= options_.defrag_low_water * static_cast<double>(below);
}

bool KvCacheManager::ShouldShrink() const { return MayShrinkFrom(pool_->num_chunks()); }

int32_t KvCacheManager::ShrinkTarget() const {
  int32_t chunks = pool_->num_chunks();
  while (MayShrinkFrom(chunks)) --chunks;
  return chunks;
}

void KvCacheManager::DefragStep() {
  if (!ShouldShrink()) {
    pending_moves_.clear();
    defrag_->TakePlan();  // stale: the load came back
    return;
  }
  // A step that copies blocks or returns a chunk is a pause, recorded whole: the engine
  // waits for the copies, and for the release (on a GPU, freeing device memory waits for the
  // device).
  const auto start = std::chrono::steady_clock::now();
  const auto record_pause = [&](int32_t moves) {
    defrag_->RecordPause(absl::FromChrono(std::chrono::steady_clock::now() - start), moves);
  };
  const int32_t top = pool_->num_chunks() - 1;
  if (pending_moves_.empty()) {
    if (std::optional<std::vector<BlockMove>> plan = defrag_->TakePlan()) {
      pending_moves_.assign(plan->begin(), plan->end());
    }
  }
  const MovesApplied applied = pending_moves_.empty() ? MovesApplied{} : ApplyMoves();
  if (pool_->NumUsedInChunk(top) == 0) {
    pending_moves_.clear();
    defrag_->TakePlan();
    // Failing to free device memory leaves the chunk out of the pool's view either way.
    pool_->ReleaseTopChunk().IgnoreError();
    record_pause(applied.moved);
    return;
  }
  if (applied.copied) record_pause(applied.moved);
  if (pending_moves_.empty() && !defrag_->busy()) {
    DefragSnapshot snapshot;
    snapshot.chunk_shift = pool_->chunk_shift();
    snapshot.num_chunks = pool_->num_chunks();
    snapshot.keep_chunks = ShrinkTarget();
    snapshot.state.resize(pool_->num_blocks());
    for (BlockId b = 0; b < pool_->num_blocks(); ++b) {
      snapshot.state[b] = pool_->RefCount(b) > 0 ? BlockState::kUsed
                          : pool_->IsCached(b)   ? BlockState::kCached
                                                 : BlockState::kFree;
    }
    defrag_->Submit(std::move(snapshot));
  }
}

KvCacheManager::MovesApplied KvCacheManager::ApplyMoves() {
  const auto start = std::chrono::steady_clock::now();
  const BlockId top_begin = (pool_->num_chunks() - 1) << pool_->chunk_shift();
  const BlockId top_end = pool_->num_blocks();
  std::vector<BlockId> src;
  std::vector<BlockId> dst;
  absl::flat_hash_set<BlockId> taken;
  const int64_t by_bytes =
      std::max<int64_t>(1, options_.defrag_max_bytes_per_step / layout_.block_bytes());
  // Moves that fit the pause budget at the cost measured so far (unknown before the first),
  // bounded in double before the cast: an hour's budget over microsecond moves, or an
  // infinite one, is more than an int64 holds.
  const int64_t by_time =
      seconds_per_move_ > 0
          ? static_cast<int64_t>(
                std::clamp(absl::ToDoubleSeconds(options_.defrag_max_pause) / seconds_per_move_,
                           1.0, static_cast<double>(by_bytes)))
          : by_bytes;
  const int32_t max_moves = static_cast<int32_t>(
      std::min({int64_t{options_.defrag_max_moves_per_step}, by_bytes, by_time}));
  // Re-check every planned move against the pool now: the plan came from an older
  // snapshot. Sources freed since then need no move; destinations used since are skipped
  // (the next plan finds others).
  while (!pending_moves_.empty() && static_cast<int32_t>(src.size()) < max_moves) {
    const BlockMove m = pending_moves_.front();
    pending_moves_.pop_front();
    if (m.src < top_begin || m.src >= top_end || pool_->RefCount(m.src) == 0) continue;
    if (m.dst < 0 || m.dst >= top_begin || pool_->RefCount(m.dst) != 0) continue;
    if (!taken.insert(m.dst).second) continue;
    src.push_back(m.src);
    dst.push_back(m.dst);
  }
  if (src.empty()) return {};
  // Evicting a cached destination is itself a state change, so do it only once the copy
  // has gone through; the copy reads sources only, so the order is safe. The wait makes the
  // pause measured below the copy's own time on an asynchronous (device) backend, not just
  // its launch; the next step's kernels would wait for the copy anyway.
  if (arena_ != nullptr) {
    absl::Status s = arena_->CopyBlocks(src, dst);
    if (s.ok()) s = arena_->backend()->Synchronize();
    if (!s.ok()) {
      // The sources and the tables are untouched, but a copy that failed part way may have
      // overwritten cached destinations: their keys must not serve those bytes again.
      for (BlockId d : dst) {
        if (pool_->IsCached(d)) pool_->Evict(d);
      }
      pending_moves_.clear();
      return {.copied = true};
    }
  }
  absl::flat_hash_map<BlockId, BlockId> moved;
  moved.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (pool_->IsCached(dst[i])) pool_->Evict(dst[i]);
    pool_->Move(src[i], dst[i]);
    if (index_.HasKey(src[i])) index_.Rebind(src[i], dst[i]);
    moved.emplace(src[i], dst[i]);
  }
  for (auto& [id, s] : seqs_) {
    for (BlockId& b : s.blocks) {
      if (b >= top_begin) {
        auto it = moved.find(b);
        if (it != moved.end()) b = it->second;
      }
    }
  }
  sessions_.RemapBlocks(moved);
  defrag_moves_ += static_cast<int64_t>(src.size());
  const double per_move =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / src.size();
  seconds_per_move_ =
      seconds_per_move_ > 0 ? 0.8 * seconds_per_move_ + 0.2 * per_move : per_move;
  return {.copied = true, .moved = static_cast<int32_t>(src.size())};
}

void KvCacheManager::WaitForDefragPlan() {
  if (defrag_ != nullptr) defrag_->WaitForPlan();
}

}  // namespace kvd
