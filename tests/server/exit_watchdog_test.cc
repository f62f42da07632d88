// A teardown that hangs after `kvd serve` has drained ends the process anyway, with the exit
// code it would have had and a line that says so; one that finishes is not disturbed.

#include "server/exit_watchdog.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/time/clock.h"

namespace kvd {
namespace {

TEST(ExitWatchdogDeathTest, AHungTeardownEndsTheProcessWithItsExitCode) {
  EXPECT_EXIT(
      {
        ExitIfTeardownHangs(absl::Milliseconds(100), 3);
        absl::SleepFor(absl::Seconds(30));  // a destructor that never returns
        std::exit(0);
      },
      ::testing::ExitedWithCode(3),
      "kvd: shutting down took longer than 100ms; exiting without finishing it");
}

TEST(ExitWatchdogDeathTest, ATeardownThatFinishesKeepsItsOwnExit) {
  EXPECT_EXIT(
      {
        ExitIfTeardownHangs(absl::Seconds(30), 3);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kvd
