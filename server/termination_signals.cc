#include "server/termination_signals.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <ctime>

namespace kvd {

TerminationSignals::TerminationSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  // A process started to outlive its terminal (nohup, or SIGHUP ignored by its parent) keeps
  // ignoring hangups: a blocked signal is queued even when ignored, so taking it here would
  // stop what nohup started.
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) {
    sigaddset(&signals_, SIGHUP);
  }
  pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
}

TerminationSignals::~TerminationSignals() {
  // A signal that arrived after the last Wait() (a second SIGTERM during the drain) is still
  // pending; unblocking would deliver it with the default action and kill a process that is
  // exiting cleanly. Take them all first.
  while (Wait(absl::ZeroDuration()) != 0) {
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

int TerminationSignals::Wait(absl::Duration timeout) {
  while (true) {
    int signal;
    if (timeout == absl::InfiniteDuration()) {
      signal = sigwaitinfo(&signals_, nullptr);
    } else {
      // sigtimedwait refuses a negative time (EINVAL, which would spin here): poll instead.
      const timespec ts = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
      signal = sigtimedwait(&signals_, nullptr, &ts);
      if (signal < 0 && errno == EAGAIN) return 0;
    }
    if (signal > 0) return signal;
    // EINTR: another signal interrupted the wait; keep waiting.
  }
}

}  // namespace kvd
