// The KV arena's failed growths reach the operator's log: the first at once, then the 2nd,
// 4th, 8th, ..., each naming the pool's size and the arena's error.

#include "server/growth_failure_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace kvd {
namespace {

KvCacheStats Failed(int64_t failures) {
  KvCacheStats s;
  s.num_chunks = 3;
  s.max_chunks = 819;
  s.total_blocks = 1536;
  s.max_blocks = 419328;
  s.chunk_growth_failures = failures;
  s.last_growth_error = "allocating KV arena chunk 4 of 819 (10485760 bytes): out of memory";
  return s;
}

TEST(GrowthFailureLogTest, SaysNothingWhileTheArenaGrows) {
  GrowthFailureLog log;
  std::ostringstream err;
  for (int i = 0; i < 5; ++i) log.Check(KvCacheStats{}, err);
  EXPECT_EQ(err.str(), "");
}

TEST(GrowthFailureLogTest, ReportsTheFirstFailureWithThePoolAndTheError) {
  GrowthFailureLog log;
  std::ostringstream err;
  log.Check(Failed(1), err);
  EXPECT_EQ(err.str(),
            "kvd: warning: the KV pool could not grow past 3 of 819 chunks (1536 of 419328 "
            "blocks): allocating KV arena chunk 4 of 819 (10485760 bytes): out of memory; it "
            "serves within them, evicting cached blocks, and tries one chunk again after "
            "memory_pool.growth_retry_interval, or grows once a chunk is released (1 failure so "
            "far: kvd_kv_pool_growth_failures_total)\n");
}

TEST(GrowthFailureLogTest, ThenReportsOnlyAtPowersOfTwo) {
  GrowthFailureLog log;
  std::ostringstream err;
  std::vector<int> reported;
  for (int failures : {0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 20, 20, 31, 32}) {
    const size_t before = err.str().size();
    log.Check(Failed(failures), err);
    if (err.str().size() != before) reported.push_back(failures);
  }
  // A jump past several powers (9 to 20) is one line, and the next comes at 32.
  EXPECT_THAT(reported, ::testing::ElementsAre(1, 2, 4, 8, 20, 32));
  EXPECT_THAT(err.str(), ::testing::HasSubstr("(32 failures so far"));
}

}  // namespace
}  // namespace kvd
