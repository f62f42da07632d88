// KvCacheManager::CheckInvariants: recomputes every reference count from its holders and
// cross-checks pool, prefix index, sequences and sessions. O(blocks + table entries); for
// tests and debugging.

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cache/kv_cache_manager.h"

namespace kvd {

absl::Status KvCacheManager::CheckInvariants() const {
  if (absl::Status s = pool_->CheckInvariants(); !s.ok()) return s;
  if (absl::Status s = index_.CheckInvariants(); !s.ok()) return s;
  const int32_t n = pool_->num_blocks();
  const int32_t bs = layout_.block_size();
  std::vector<int32_t> holders(n, 0);
  absl::Status status;
  auto hold = [&](BlockId b, const std::string& who) {
    if (b < 0 || b >= n) {
      if (status.ok()) status = absl::InternalError(absl::StrCat(who, " holds absent block ", b));
      return;
    }
    ++holders[b];
  };
  for (const auto& [id, s] : seqs_) {
    const std::string who = absl::StrCat("sequence ", id);
    if (static_cast<int64_t>(s.blocks.size()) * bs < s.num_computed ||
        s.num_computed > static_cast<int32_t>(s.tokens.size())) {
      return absl::InternalError(absl::StrCat(who, ": num_computed beyond blocks or tokens"));
    }
    for (BlockId b : s.blocks) hold(b, who);
    if (!status.ok()) return status;
    if (static_cast<int32_t>(s.keys.size()) * bs > s.num_computed) {
      return absl::InternalError(absl::StrCat(who, ": a key for an unfinished block"));
    }
    // Registration stops only at a block that was full when it was examined.
    if (s.keys_stopped && (static_cast<int32_t>(s.keys.size()) + 1) * bs > s.num_computed) {
      return absl::InternalError(
          absl::StrCat(who, ": key registration stopped at unfinished block ", s.keys.size()));
    }
    uint64_t parent = index_.root_key();
    for (size_t i = 0; i < s.keys.size(); ++i) {
      const absl::Span<const int32_t> tokens = absl::MakeConstSpan(s.tokens).subspan(i * bs, bs);
      if (index_.ChildKey(parent, tokens) != s.keys[i]) {
        return absl::InternalError(absl::StrCat(who, ": key ", i, " does not match its tokens"));
      }
      const BlockId b = s.blocks[i];
      if (index_.HasKey(b) && index_.KeyOf(b) != s.keys[i]) {
        return absl::InternalError(absl::StrCat(who, ": block ", b, " is keyed for other tokens"));
      }
      parent = s.keys[i];
    }
  }
  // Session serial -> sequences, live or preempted, that hold it (a stale serial, of a
  // session closed meanwhile, matches none).
  absl::flat_hash_map<uint64_t, int32_t> session_holders;
  for (const auto& [id, s] : seqs_) {
    if (!s.session_id.empty()) ++session_holders[s.session_serial];
  }
  for (const auto& [id, p] : preempted_) ++session_holders[p.serial];
  absl::flat_hash_set<BlockId> pinned;  // distinct: sessions may pin the same prefix
  sessions_.ForEach([&](const Session& s) {
    const auto h = session_holders.find(s.serial);
    const int32_t held_by = h == session_holders.end() ? 0 : h->second;
    if (held_by != (s.attached ? 1 : 0) && status.ok()) {
      status = absl::InternalError(absl::StrCat(s.attached ? "attached" : "detached", " session ",
                                                s.id, " is held by ", held_by, " sequences"));
    }
    if (s.attached && !s.chain.empty() && status.ok()) {
      status = absl::InternalError(absl::StrCat("attached session ", s.id, " still pins blocks"));
    }
    if (!s.attached &&
        layout_.BlocksForTokens(s.tokens.size()) != static_cast<int64_t>(s.chain.size()) &&
        status.ok()) {
      status = absl::InternalError(absl::StrCat("session ", s.id, ": chain/token mismatch"));
    }
    pinned.insert(s.chain.begin(), s.chain.end());
    for (BlockId b : s.chain) {
      if (b > s.chain_max && status.ok()) {
        status = absl::InternalError(
            absl::StrCat("session ", s.id, ": block ", b, " above its chain_max ", s.chain_max));
      }
      hold(b, absl::StrCat("session ", s.id));
    }
  });
  if (!status.ok()) return status;
  if (static_cast<int64_t>(pinned.size()) != sessions_.num_pinned_blocks()) {
    return absl::InternalError(absl::StrCat("session pinned-block count ",
                                            sessions_.num_pinned_blocks(), " but ", pinned.size(),
                                            " distinct pinned blocks"));
  }
  for (BlockId b = 0; b < n; ++b) {
    if (holders[b] != pool_->RefCount(b)) {
      return absl::InternalError(absl::StrCat("block ", b, ": refcount ", pool_->RefCount(b),
                                              " but ", holders[b], " holders"));
    }
    if (pool_->PinCount(b) != sessions_.PinsOf(b)) {
      return absl::InternalError(absl::StrCat("block ", b, ": ", pool_->PinCount(b),
                                              " pins in the pool but ", sessions_.PinsOf(b),
                                              " sessions pin it"));
    }
    if (pool_->IsCached(b) != index_.HasKey(b)) {
      return absl::InternalError(absl::StrCat("block ", b, ": pool and index disagree on key"));
    }
  }
  if (index_.size() != 0) {
    // Keys only on present blocks.
    int64_t keyed_present = 0;
    for (BlockId b = 0; b < n; ++b) keyed_present += index_.HasKey(b) ? 1 : 0;
    if (keyed_present != index_.size()) {
      return absl::InternalError("prefix key on a block of a released chunk");
    }
  }
  return absl::OkStatus();
}

}  // namespace kvd
