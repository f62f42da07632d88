#ifndef KVD_TESTS_CACHE_CACHE_MANAGER_FIXTURE_H_
#define KVD_TESTS_CACHE_CACHE_MANAGER_FIXTURE_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "gtest/gtest.h"
#include "tests/cache/fake_backend.h"
#include "tests/cache/kv_test_util.h"

namespace kvd::testing_util {

// A KvCacheManager of TinyShape() over a FakeBackend and a FakeClock, for the manager's
// tests.
class CacheManagerTest : public ::testing::Test {
 protected:
  std::unique_ptr<KvCacheManager> Make(const KvCacheOptions& options = TinyOptions()) {
    absl::StatusOr<std::unique_ptr<KvCacheManager>> m =
        KvCacheManager::Create(options, TinyShape(), &backend_, &clock_);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  // 8 blocks, no growth: Iota(8, 100)'s 2 blocks are cached (its sequence 1 ended) and
  // sequence 2, Iota(20, 500), holds 5 more, so 1 block is free.
  std::unique_ptr<KvCacheManager> MakeCachedPrefixAndOneFreeBlock() {
    std::unique_ptr<KvCacheManager> m = Make(TinyOptions(2, 2));
    EXPECT_TRUE(m->AddSequence(1, Iota(8, 100)).ok());
    EXPECT_TRUE(Step(*m, 1, 8));
    m->Free(1);
    EXPECT_TRUE(m->AddSequence(2, Iota(20, 500)).ok());
    EXPECT_TRUE(Step(*m, 2, 20));
    return m;
  }
  // `options` with a 4096-byte device headroom, on a fake device with room for one chunk
  // beyond the first: sequence 1 holds 30 tokens (8 blocks, both chunks) and sequence 2's 16
  // tokens, which would need a third chunk, could not be reserved: growth is stopped, after
  // one failure. REQUIRES: options' geometry is TinyOptions(1, 4)'s (chunks of 4 blocks,
  // 1024 bytes, up to 4).
  std::unique_ptr<KvCacheManager> MakeStoppedAtTheHeadroom(KvCacheOptions options) {
    options.device_headroom_bytes = 4096;
    std::unique_ptr<KvCacheManager> m = Make(options);
    backend_.SimulateDevice(backend_.live_bytes() + 1024 + 4096);
    EXPECT_EQ(*m->AddSequence(1, Iota(30)), 0);
    EXPECT_TRUE(m->Reserve(1, 30));
    EXPECT_EQ(*m->AddSequence(2, Iota(16, 500)), 0);
    EXPECT_FALSE(m->Reserve(2, 16));
    EXPECT_EQ(m->stats().chunk_growth_failures, 1);
    return m;
  }
  void ExpectValid(const KvCacheManager& m) {
    ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants();
  }

  FakeBackend backend_;
  FakeClock clock_;
};

}  // namespace kvd::testing_util

#endif  // KVD_TESTS_CACHE_CACHE_MANAGER_FIXTURE_H_
