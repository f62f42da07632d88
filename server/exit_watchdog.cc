#include "server/exit_watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/time/clock.h"

namespace kvd {

void ExitIfTeardownHangs(absl::Duration limit, int exit_code) {
  std::thread([limit, exit_code] {
    absl::SleepFor(limit);
    const std::string line = "kvd: shutting down took longer than " + absl::FormatDuration(limit) +
                             "; exiting without finishing it\n";
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
    std::_Exit(exit_code);
  }).detach();
}

}  // namespace kvd
