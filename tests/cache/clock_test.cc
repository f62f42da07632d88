// RealClock: starts at the system time and then follows the monotonic clock, so the time it
// reports never goes back and advances with the time that passes.

#include "cache/clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvd {
namespace {

TEST(RealClockTest, StartsAtTheSystemTimeAndNeverGoesBack) {
  const absl::Time before = absl::Now();
  RealClock clock;
  absl::Time last = clock.Now();
  EXPECT_LE(absl::AbsDuration(last - before), absl::Seconds(1));
  for (int i = 0; i < 100000; ++i) {
    const absl::Time now = clock.Now();
    ASSERT_GE(now, last) << i;
    last = now;
  }
}

TEST(RealClockTest, AdvancesWithTheMonotonicClock) {
  RealClock clock;
  // Steady readings outside the clock's: the clock cannot have advanced more than they did.
  const auto steady_start = std::chrono::steady_clock::now();
  const absl::Time start = clock.Now();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const absl::Duration passed = clock.Now() - start;
  const absl::Duration steady = absl::FromChrono(std::chrono::steady_clock::now() - steady_start);
  EXPECT_GE(passed, absl::Milliseconds(20));
  EXPECT_LE(passed, steady);
}

}  // namespace
}  // namespace kvd
