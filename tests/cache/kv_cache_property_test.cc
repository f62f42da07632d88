// Randomized property test of KvCacheManager: thousands of operations from fixed seeds
// (tests/cache/kv_cache_ops.h says which, and what is checked after each), some seeds with
// device faults (no memory to grow the arena; block copies that stop part way) or with
// defragmentation planned on the planner's thread. Every kind of operation must run, the
// pool must grow, evict or shrink, prefixes and sessions must hit, and at the end
// everything comes back. tests/fuzz/kv_cache_ops_fuzz.cc runs the same walk with
// libFuzzer's choices.

#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/cache/kv_cache_ops.h"

namespace kvd {
namespace {

using testing_util::KvOpsConfig;
using testing_util::KvOpsOutcome;

struct Config {
  uint32_t seed;
  KvOpsConfig ops;
};

class KvCachePropertyTest : public ::testing::TestWithParam<Config> {};

TEST_P(KvCachePropertyTest, InvariantsHoldAfterEveryOperation) {
  const Config& cfg = GetParam();
  std::mt19937 rng(cfg.seed);
  const KvOpsOutcome out = testing_util::RunKvCacheOps(
      cfg.ops, /*max_ops=*/2500,
      [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); },
      [] { return true; });
  ASSERT_EQ(out.error, "");

  // Every kind of operation ran, and the pool moved.
  for (int k = 0; k < testing_util::kNumKvOpKinds; ++k) {
    if (k == testing_util::kOpFault && !cfg.ops.device_faults) continue;
    EXPECT_GT(out.num_ops[k], 0) << "operation kind " << k;
  }
  EXPECT_GT(out.stats.chunks_grown, 0);
  EXPECT_GT(out.stats.evictions + out.stats.chunks_released, 0);
  if (cfg.ops.prefix_caching) {
    EXPECT_GT(out.stats.prefix_hit_tokens, 0);
  }
  EXPECT_GT(out.stats.session_hit_tokens, 0);
  EXPECT_GT(out.stats.fork_copies, 0);
  // The end of the load: everything came back.
  EXPECT_EQ(out.end.used_blocks, 0);
  EXPECT_EQ(out.end.pinned_blocks, 0);
  EXPECT_EQ(out.end.num_sessions, 0);
  EXPECT_EQ(out.end.num_chunks, 1);  // shrank back to the initial size
  EXPECT_EQ(out.end.free_blocks + out.end.cached_blocks, out.end.total_blocks);
  EXPECT_EQ(out.live_buffers, 0);  // no leak
}

// Any seed checks the invariants; these also reach every operation and pool movement that the
// test asks for (most seeds do: 24 to 30 of seeds 1-30 for each configuration but the last,
// 17 of 30 there).
INSTANTIATE_TEST_SUITE_P(Seeds, KvCachePropertyTest,
                         ::testing::Values(Config{1, {"lru", true}}, Config{2, {"lru", true}},
                                           Config{3, {"chunk_lru", true}},
                                           Config{4, {"chunk_lru", true}},
                                           Config{10, {"lru", false}},
                                           Config{6, {"lru", true, /*device_faults=*/true}},
                                           Config{8, {"chunk_lru", true, true, true}},
                                           Config{9, {"lru", false, true, true}}),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           const KvOpsConfig& ops = info.param.ops;
                           return "seed" + std::to_string(info.param.seed) + "_" + ops.policy +
                                  (ops.prefix_caching ? "" : "_nocache") +
                                  (ops.device_faults ? "_faults" : "") +
                                  (ops.threaded_planning ? "_threaded" : "");
                         });

}  // namespace
}  // namespace kvd
