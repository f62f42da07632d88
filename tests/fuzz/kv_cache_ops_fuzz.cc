// Fuzz target: KvCacheManager under any sequence of operations (tests/cache/kv_cache_ops.h,
// the walk kv_cache_property_test.cc takes from fixed seeds), every choice taken from the
// input: which operation, on which sequence, how many tokens, which session, which fault.
//
// Invariants: the manager's own (CheckInvariants: reference counts equal holders, no block
// both free and referenced, prefix keys match their tokens, free + used + cached == total)
// and every live sequence's KV after each operation, the walk's checks of AddSequence,
// Reserve and Fork; and at the end, everything freed and time passed: no block used or
// pinned, no session, free + cached == total, no device buffer leaked.

#include <cstdint>

#include "tests/cache/kv_cache_ops.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvd::fuzz::InputReader input(data, size);
  const unsigned char flags = input.Byte();
  kvd::testing_util::KvOpsConfig config;
  config.policy = flags & 1 ? "chunk_lru" : "lru";
  config.prefix_caching = !(flags & 2);
  config.device_faults = flags & 4;
  config.threaded_planning = flags & 8;
  const kvd::testing_util::KvOpsOutcome out = kvd::testing_util::RunKvCacheOps(
      config, /*max_ops=*/4096,
      [&input](int lo, int hi) { return lo + input.Byte() % (hi - lo + 1); },
      [&input] { return !input.empty(); });
  if (!out.error.empty()) kvd::fuzz::Require(false, out.error);
  kvd::fuzz::Require(out.end.used_blocks == 0 && out.end.pinned_blocks == 0,
                     "blocks still used or pinned after everything was freed");
  kvd::fuzz::Require(out.end.num_sessions == 0, "a session outlived its idle timeout");
  kvd::fuzz::Require(out.end.free_blocks + out.end.cached_blocks == out.end.total_blocks,
                     "free + cached != total at the end");
  kvd::fuzz::Require(out.live_buffers == 0, "device buffers leaked");
  return 0;
}
