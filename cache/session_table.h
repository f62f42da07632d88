#ifndef KVD_CACHE_SESSION_TABLE_H_
#define KVD_CACHE_SESSION_TABLE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/block_links.h"
#include "cache/clock.h"

namespace kvd {

// Why a session's pinned chain was let go: idle past the timeout, over the pin cap, closed by
// the client, or for room (the pool could not otherwise supply a running sequence).
enum class SessionReleaseReason { kIdle, kPinCap, kClosed, kPressure };
inline constexpr int kNumSessionReleaseReasons =
    static_cast<int>(SessionReleaseReason::kPressure) + 1;

// One multi-turn session: between turns it pins the block chain that holds the KV of its
// history so the next turn only prefills new tokens.
struct Session {
  std::string id;
  uint64_t serial = 0;          // distinguishes a re-created session from an earlier one
  bool attached = false;        // a sequence, live or preempted, holds it (nothing pinned)
  std::vector<BlockId> chain;   // pinned blocks, one reference each, in order
  std::vector<int32_t> tokens;  // the tokens whose KV the chain holds
  absl::Time last_use;          // when it was last detached, or a waiting turn of it touched it
  // No block of `chain` is above this (-1 when it was detached empty), so that RemapBlocks
  // passes by chains below every moved block without reading them.
  BlockId chain_max = -1;
};

// SessionTable: session id -> pinned chain + token history + last use. It decides which
// sessions to let go (idle past the timeout, over the pin cap oldest first, or closed)
// and hands their chains back; the caller (KvCacheManager) owns the references and drops
// them. A session is either attached (its chain is lent to one live sequence, or to none
// while that sequence waits after a preemption) or detached (pinned). A released session is
// forgotten: its blocks stay in the prefix index as ordinary cached blocks (lazy release), and the
// next turn starts it afresh.
//
// Not thread safe: the engine thread only. Does not own the clock.
class SessionTable {
 public:
  struct Released {
    std::string id;
    std::vector<BlockId> chain;
    SessionReleaseReason reason;
  };

  // Told each time a detached session starts (+1) or stops (-1) pinning a block, so the
  // owner can keep the pool's pin counts (BlockPool::Pin) in step; RemapBlocks tells
  // nothing (a moved block keeps its pins).
  using PinCallback = std::function<void(BlockId, int32_t delta)>;

  // REQUIRES: clock outlives the table.
  SessionTable(const Clock* clock, absl::Duration idle_timeout, PinCallback on_pin = nullptr);

  // Attaches to session `id`, creating it when unknown, and lends the caller its pinned
  // chain and tokens (moved out; the references go with them). FailedPrecondition when
  // another sequence has it attached.
  absl::StatusOr<Session*> Attach(std::string_view id);
  // Detaches: `chain` (whose references the caller hands over) becomes the pinned chain.
  // Returns false, taking nothing, when the session was released or re-created meanwhile.
  bool Detach(std::string_view id, uint64_t serial, std::vector<BlockId> chain,
              std::vector<int32_t> tokens);
  // A detached session's idle time starts again now, and it becomes the newest (the last that
  // expiry, the pin cap and pressure take): a turn of it is waiting to run. No-op for an
  // unknown or attached session.
  void Touch(std::string_view id);
  // Detached sessions idle for at least the timeout, oldest first.
  std::vector<Released> ExpireIdle();
  // Detached sessions, oldest first, until at most `max_pinned_blocks` blocks are pinned;
  // sessions that pin nothing (left empty by a preempted turn that ended) are passed by.
  std::vector<Released> EnforcePinCap(int64_t max_pinned_blocks);
  // The oldest detached session whose pinned chain `frees` accepts (the caller's test that
  // letting it go would free something), released for `reason`; nullopt when there is none.
  std::optional<Released> ReleaseOldest(SessionReleaseReason reason,
                                        absl::FunctionRef<bool(const std::vector<BlockId>&)> frees);
  // Session `id` if it is still the one numbered `serial`, released for `reason` (attached
  // or not: an attached one gives back no chain, its sequence holds the blocks); nullopt
  // when it was released or re-created meanwhile.
  std::optional<Released> Release(std::string_view id, uint64_t serial,
                                  SessionReleaseReason reason);
  // nullopt for an unknown id. An attached session is forgotten at once; its sequence
  // later frees its blocks as if it had no session.
  std::optional<Released> Close(std::string_view id);

  const Session* Find(std::string_view id) const;
  // Distinct blocks the detached sessions pin (two sessions that reached the same prefix
  // through the prefix index may pin the same blocks; each counts once).
  int64_t num_pinned_blocks() const { return static_cast<int64_t>(pins_.size()); }
  int32_t num_sessions() const { return static_cast<int32_t>(sessions_.size()); }
  absl::Duration idle_timeout() const { return idle_timeout_; }
  void ForEach(const std::function<void(const Session&)>& fn) const;
  // How many detached sessions pin block b (0 for none).
  int32_t PinsOf(BlockId b) const {
    auto it = pins_.find(b);
    return it == pins_.end() ? 0 : it->second;
  }
  // Rewrites pinned chains and pin counts after defragmentation moved blocks (old id -> new
  // id). Cost: O(moves + sessions + the chains that hold a block at or above the lowest
  // moved one), not every pinned block: a step's few moves from the arena's top chunk leave
  // most chains unread, however many sessions are pinned.
  void RemapBlocks(const absl::flat_hash_map<BlockId, BlockId>& moves);

 private:
  Released Forget(std::string id, SessionReleaseReason reason);
  void Pin(const std::vector<BlockId>& chain);
  void Unpin(const std::vector<BlockId>& chain);

  const Clock* const clock_;
  const absl::Duration idle_timeout_;
  const PinCallback on_pin_;
  uint64_t next_serial_ = 1;
  // Pinned block -> detached sessions whose chain holds it.
  absl::flat_hash_map<BlockId, int32_t> pins_;
  absl::flat_hash_map<std::string, Session> sessions_;
  // Detached sessions by last use: expiry and the pin cap take the oldest first.
  std::set<std::pair<absl::Time, std::string>> detached_;
};

}  // namespace kvd

#endif  // KVD_CACHE_SESSION_TABLE_H_
