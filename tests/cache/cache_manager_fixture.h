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
  void ExpectValid(const KvCacheManager& m) {
    ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants();
  }

  FakeBackend backend_;
  FakeClock clock_;
};

}  // namespace kvd::testing_util

#endif  // KVD_TESTS_CACHE_CACHE_MANAGER_FIXTURE_H_
