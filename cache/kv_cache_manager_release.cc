// KvCacheManager's ending half: sequences that end (Free, FreeForRecompute, Abandon) and the
// session chains they leave pinned or give up.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/cache_check.h"
#include "cache/kv_cache_manager.h"

namespace kvd {

void KvCacheManager::Free(SeqId id) {
  auto it = seqs_.find(id);
  KVD_CACHE_CHECK(it != seqs_.end(), "Free: unknown sequence id");
  SeqState& s = it->second;
  if (s.session_id.empty()) {
    ReleaseTailFirst(s.blocks);
  } else {
    const size_t keep = static_cast<size_t>(layout_.BlocksForTokens(s.num_computed));
    ReleaseTailFirst(absl::MakeConstSpan(s.blocks).subspan(keep));
    std::vector<BlockId> chain(s.blocks.begin(), s.blocks.begin() + keep);
    std::vector<int32_t> tokens(s.tokens.begin(), s.tokens.begin() + s.num_computed);
    if (sessions_.Detach(s.session_id, s.session_serial, chain, std::move(tokens))) {
      ReleaseSessions(sessions_.EnforcePinCap(MaxPinnedBlocks()));
    } else {
      ReleaseTailFirst(chain);
    }
  }
  seqs_.erase(it);
}

void KvCacheManager::Abandon(SeqId id) {
  auto it = seqs_.find(id);
  KVD_CACHE_CHECK(it != seqs_.end(), "Abandon: unknown sequence id");
  const SeqState& s = it->second;
  KVD_CACHE_CHECK(s.uncounted_hits.has_value(), "Abandon: the sequence has had slots");
  size_t lent = 0;  // leading blocks that go back to the session's chain
  if (s.preempted_session.has_value()) {
    preempted_.emplace(id, *s.preempted_session);  // as FreeForRecompute left it
  } else if (s.session_created) {
    // Not a release: the session never pinned anything (attached, it gives back no chain).
    sessions_.Release(s.session_id, s.session_serial, SessionReleaseReason::kClosed);
  } else if (!s.session_id.empty()) {
    const int32_t tokens = static_cast<int32_t>(s.uncounted_hits->session_hit_tokens);
    lent = static_cast<size_t>(layout_.BlocksForTokens(tokens));
    std::vector<BlockId> chain(s.blocks.begin(), s.blocks.begin() + lent);
    if (!sessions_.Detach(s.session_id, s.session_serial, std::move(chain),
                          {s.tokens.begin(), s.tokens.begin() + tokens})) {
      lent = 0;  // released or re-created meanwhile: the blocks are the sequence's alone
    }
  }
  ReleaseTailFirst(absl::MakeConstSpan(s.blocks).subspan(lent));
  seqs_.erase(it);
}

void KvCacheManager::FreeForRecompute(SeqId id) {
  auto it = seqs_.find(id);
  KVD_CACHE_CHECK(it != seqs_.end(), "FreeForRecompute: unknown sequence id");
  SeqState& s = it->second;
  // The session stays attached to the id, holding nothing (the chain it lent is released
  // below with the rest); a sequence that came back without its session (closed meanwhile)
  // keeps the record that says so.
  if (!s.session_id.empty()) {
    preempted_.emplace(id, PreemptedSession{std::move(s.session_id), s.session_serial});
  } else if (s.preempted_session.has_value()) {
    preempted_.emplace(id, *std::move(s.preempted_session));
  }
  ReleaseTailFirst(s.blocks);
  seqs_.erase(it);
}

void KvCacheManager::EndPreempted(SeqId id) {
  auto it = preempted_.find(id);
  if (it == preempted_.end()) return;
  // False, changing nothing, when the session was closed or released meanwhile.
  sessions_.Detach(it->second.id, it->second.serial, {}, {});
  preempted_.erase(it);
}

void KvCacheManager::ReleaseSessions(const std::vector<SessionTable::Released>& released) {
  for (const SessionTable::Released& r : released) {
    ReleaseTailFirst(r.chain);
    ++session_releases_[static_cast<int>(r.reason)];
  }
}

absl::Status KvCacheManager::CloseSession(std::string_view session_id) {
  std::optional<SessionTable::Released> r = sessions_.Close(session_id);
  if (!r.has_value()) {
    return absl::NotFoundError(absl::StrCat("no session \"", std::string(session_id), "\""));
  }
  ReleaseSessions({*std::move(r)});
  return absl::OkStatus();
}

int64_t KvCacheManager::MaxPinnedBlocks() const {
  return static_cast<int64_t>(options_.max_pinned_fraction * pool_->max_blocks());
}

}  // namespace kvd
