#include "cache/session_table.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvd {
namespace {

// This abseil build's string_view is its own type; heterogeneous lookup needs it.
absl::string_view Key(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

SessionTable::SessionTable(const Clock* clock, absl::Duration idle_timeout, PinCallback on_pin)
    : clock_(clock), idle_timeout_(idle_timeout), on_pin_(std::move(on_pin)) {}

absl::StatusOr<Session*> SessionTable::Attach(std::string_view id) {
  auto [it, inserted] = sessions_.try_emplace(Key(id));
  Session& s = it->second;
  if (inserted) {
    s.id = std::string(id);
    s.serial = next_serial_++;
    s.attached = true;
    s.last_use = clock_->Now();
    return &s;
  }
  if (s.attached) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session \"", Key(id),
        "\" is in use by another request (running, or preempted and waiting to run again)"));
  }
  detached_.erase({s.last_use, s.id});
  Unpin(s.chain);
  s.attached = true;
  return &s;
}

bool SessionTable::Detach(std::string_view id, uint64_t serial, std::vector<BlockId> chain,
                          std::vector<int32_t> tokens) {
  auto it = sessions_.find(Key(id));
  if (it == sessions_.end() || it->second.serial != serial || !it->second.attached) return false;
  Session& s = it->second;
  s.attached = false;
  s.chain = std::move(chain);
  s.chain_max = s.chain.empty() ? -1 : *std::max_element(s.chain.begin(), s.chain.end());
  s.tokens = std::move(tokens);
  s.last_use = clock_->Now();
  Pin(s.chain);
  detached_.insert({s.last_use, s.id});
  return true;
}

void SessionTable::Pin(const std::vector<BlockId>& chain) {
  for (BlockId b : chain) {
    ++pins_[b];
    if (on_pin_) on_pin_(b, +1);
  }
}

void SessionTable::Unpin(const std::vector<BlockId>& chain) {
  for (BlockId b : chain) {
    auto it = pins_.find(b);
    if (--it->second == 0) pins_.erase(it);
    if (on_pin_) on_pin_(b, -1);
  }
}

SessionTable::Released SessionTable::Forget(std::string id, SessionReleaseReason reason) {
  auto it = sessions_.find(Key(id));
  Session& s = it->second;
  Released r{s.id, {}, reason};
  if (!s.attached) {
    detached_.erase({s.last_use, s.id});
    Unpin(s.chain);
    r.chain = std::move(s.chain);
  }
  sessions_.erase(it);
  return r;
}

void SessionTable::Touch(std::string_view id) {
  auto it = sessions_.find(Key(id));
  if (it == sessions_.end() || it->second.attached) return;
  Session& s = it->second;
  detached_.erase({s.last_use, s.id});
  s.last_use = clock_->Now();
  detached_.insert({s.last_use, s.id});
}

std::vector<SessionTable::Released> SessionTable::ExpireIdle() {
  std::vector<Released> out;
  const absl::Time cutoff = clock_->Now() - idle_timeout_;
  while (!detached_.empty() && detached_.begin()->first <= cutoff) {
    out.push_back(Forget(detached_.begin()->second, SessionReleaseReason::kIdle));
  }
  return out;
}

std::vector<SessionTable::Released> SessionTable::EnforcePinCap(int64_t max_pinned_blocks) {
  std::vector<Released> out;
  while (num_pinned_blocks() > max_pinned_blocks) {
    std::optional<Released> r =
        ReleaseOldest(SessionReleaseReason::kPinCap,
                      [](const std::vector<BlockId>& chain) { return !chain.empty(); });
    if (!r.has_value()) break;
    out.push_back(*std::move(r));
  }
  return out;
}

std::optional<SessionTable::Released> SessionTable::ReleaseOldest(
    SessionReleaseReason reason, absl::FunctionRef<bool(const std::vector<BlockId>&)> frees) {
  for (const auto& [last_use, id] : detached_) {
    if (frees(sessions_.find(Key(id))->second.chain)) return Forget(id, reason);
  }
  return std::nullopt;
}

std::optional<SessionTable::Released> SessionTable::Release(std::string_view id, uint64_t serial,
                                                            SessionReleaseReason reason) {
  auto it = sessions_.find(Key(id));
  if (it == sessions_.end() || it->second.serial != serial) return std::nullopt;
  return Forget(it->second.id, reason);
}

std::optional<SessionTable::Released> SessionTable::Close(std::string_view id) {
  auto it = sessions_.find(Key(id));
  if (it == sessions_.end()) return std::nullopt;
  return Forget(it->second.id, SessionReleaseReason::kClosed);
}

const Session* SessionTable::Find(std::string_view id) const {
  auto it = sessions_.find(Key(id));
  return it == sessions_.end() ? nullptr : &it->second;
}

void SessionTable::ForEach(const std::function<void(const Session&)>& fn) const {
  for (const auto& [id, s] : sessions_) fn(s);
}

void SessionTable::RemapBlocks(const absl::flat_hash_map<BlockId, BlockId>& moves) {
  if (moves.empty()) return;
  // Every moved block's pins are taken out before any is put back, so that a block both
  // moved and moved to keeps the right count.
  std::vector<std::pair<BlockId, int32_t>> moved_pins;
  BlockId lowest_moved = std::numeric_limits<BlockId>::max();
  for (const auto& [from, to] : moves) {
    lowest_moved = std::min(lowest_moved, from);
    if (auto it = pins_.find(from); it != pins_.end()) {
      moved_pins.emplace_back(to, it->second);
      pins_.erase(it);
    }
  }
  for (const auto& [to, count] : moved_pins) pins_[to] += count;
  for (auto& [id, s] : sessions_) {
    if (s.chain_max < lowest_moved) continue;
    s.chain_max = -1;
    for (BlockId& b : s.chain) {
      if (auto it = moves.find(b); it != moves.end()) b = it->second;
      s.chain_max = std::max(s.chain_max, b);
    }
  }
}

}  // namespace kvd
