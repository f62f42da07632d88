#ifndef KVD_TESTS_CACHE_KV_CACHE_OPS_H_
#define KVD_TESTS_CACHE_KV_CACHE_OPS_H_

// A walk over KvCacheManager's operations whose every choice comes from a caller: fixed
// seeds in kv_cache_property_test.cc, the fuzzer's bytes in tests/fuzz/kv_cache_ops_fuzz.cc.
// Operations: add with prefix and session reuse (at times undone at once: Abandon, after
// which the same prompt must find at least the same prefix), append, step (Reserve + write +
// mark), fork, free, preempt (FreeForRecompute) and come back or end while preempted, tick
// with expiry and defragmentation, close a session, and, when asked, device faults (no memory
// to grow the arena; block copies that stop part way). After every operation: reference counts
// equal holders, no block is both free and referenced, every prefix key matches its tokens,
// free + used + cached == total (CheckInvariants), and every live sequence's computed
// positions hold exactly the bytes the "model" wrote for their prefix. A failed Reserve
// must change nothing; a prefix hit must find the bytes of its prefix. At the end every
// sequence is freed and time passes, and everything must come back.

#include <cstdint>
#include <functional>
#include <string>

#include "cache/kv_cache_stats.h"

namespace kvd {
namespace testing_util {

struct KvOpsConfig {
  std::string policy = "lru";
  bool prefix_caching = true;
  bool device_faults = false;
  bool threaded_planning = false;  // defragmentation planned on the planner's thread
};

// The operation kinds, for the counts in KvOpsOutcome.
enum KvOpKind {
  kOpAdd,
  kOpAppend,
  kOpStep,
  kOpFork,
  kOpFree,
  kOpTick,
  kOpClose,
  kOpPreempt,
  kOpFault,
  kOpReadmit,
  kOpEndPreempted,
  kOpAbandon,
  kNumKvOpKinds
};

struct KvOpsOutcome {
  std::string error;  // the first check that failed, with its operation's number; "" if none
  int64_t num_ops[kNumKvOpKinds] = {};
  KvCacheStats stats;         // after the last operation
  KvCacheStats end;           // after everything was freed, time passed and defragmentation ran
  int64_t live_buffers = -1;  // the backend's device buffers once the cache is gone
};

// Picks an integer in [lo, hi]. REQUIRES: lo <= hi.
using KvOpsChooser = std::function<int(int lo, int hi)>;

// Runs up to `max_ops` operations on a tiny pool (4 to 16 blocks of 4 tokens), each choice
// taken from `uniform`, and stops early when `more` says so. Returns at the first failed
// check.
KvOpsOutcome RunKvCacheOps(const KvOpsConfig& cfg, int max_ops, const KvOpsChooser& uniform,
                           const std::function<bool()>& more);

}  // namespace testing_util
}  // namespace kvd

#endif  // KVD_TESTS_CACHE_KV_CACHE_OPS_H_
