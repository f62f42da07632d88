#include "server/termination_signals.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

namespace kvd {
namespace {

// Each case runs in a child process of its own (a death test), since it signals itself:
// there the constructing thread is the only one, as TerminationSignals requires.

// Each of them, SIGHUP included: a closed terminal's hangup drains the daemon as SIGTERM does.
TEST(TerminationSignalsDeathTest, WaitTakesAPendingSignal) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    EXPECT_EXIT(
        {
          TerminationSignals signals;
          ::kill(::getpid(), sig);
          std::exit(signals.Wait(absl::Seconds(10)) == sig ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "")
        << strsignal(sig);
  }
}

TEST(TerminationSignalsDeathTest, WaitTimesOutWithZero) {
  EXPECT_EXIT(
      {
        TerminationSignals signals;
        std::exit(signals.Wait(absl::ZeroDuration()) == 0 &&
                          signals.Wait(absl::Milliseconds(-5)) == 0
                      ? 0
                      : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// A process started to outlive its terminal is not drained by a hangup: under nohup (SIGHUP
// ignored) it is still ignored, and a SIGTERM after it is what Wait returns.
TEST(TerminationSignalsDeathTest, AnIgnoredSighupStaysIgnored) {
  EXPECT_EXIT(
      {
        std::signal(SIGHUP, SIG_IGN);
        TerminationSignals signals;
        ::kill(::getpid(), SIGHUP);
        if (signals.Wait(absl::Milliseconds(200)) != 0) std::exit(1);
        ::kill(::getpid(), SIGTERM);
        std::exit(signals.Wait(absl::Seconds(10)) == SIGTERM ? 0 : 2);
      },
      ::testing::ExitedWithCode(0), "");
}

// A second SIGTERM during the drain is still pending when the daemon finishes: it must not
// kill the process on its way out (it used to: the restored mask delivered it).
TEST(TerminationSignalsDeathTest, SignalsLeftPendingDoNotKillTheProcessOnDestruction) {
  EXPECT_EXIT(
      {
        {
          TerminationSignals signals;
          ::kill(::getpid(), SIGTERM);
          if (signals.Wait() != SIGTERM) std::exit(1);
          ::kill(::getpid(), SIGTERM);  // the second one, never waited for
          ::kill(::getpid(), SIGINT);
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kvd
