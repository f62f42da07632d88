#include "server/termination_signals.h"

#include <pthread.h>

#include <cerrno>
#include <ctime>

namespace kvd {

TerminationSignals::TerminationSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
}

TerminationSignals::~TerminationSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

int TerminationSignals::Wait(absl::Duration timeout) {
  while (true) {
    int signal;
    if (timeout == absl::InfiniteDuration()) {
      signal = sigwaitinfo(&signals_, nullptr);
    } else {
      const timespec ts = absl::ToTimespec(timeout);
      signal = sigtimedwait(&signals_, nullptr, &ts);
      if (signal < 0 && errno == EAGAIN) return 0;
    }
    if (signal > 0) return signal;
    // EINTR: another signal interrupted the wait; keep waiting.
  }
}

}  // namespace kvd
