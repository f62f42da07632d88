#ifndef KVD_SERVER_TERMINATION_SIGNALS_H_
#define KVD_SERVER_TERMINATION_SIGNALS_H_

#include <csignal>

#include "absl/time/time.h"

namespace kvd {

// Receives SIGINT, SIGTERM and SIGHUP synchronously, with no signal handler at all: the
// constructor blocks them in the calling thread (SIGHUP only where it is not ignored, as
// nohup leaves it: such a process goes on ignoring it), every thread started afterwards
// inherits that mask, and Wait() takes a pending one with sigtimedwait. So a signal can
// neither interrupt work nor run code in an async-signal context.
//
// REQUIRES: constructed before the process starts any other thread (gRPC, the backend's
// pool), so that no thread is left with the signals unblocked. The destructor discards the
// signals still pending (so a late one cannot kill the process as it exits), then restores
// the previous mask of the constructing thread. Wait() is called from that thread.
class TerminationSignals {
 public:
  TerminationSignals();
  ~TerminationSignals();
  TerminationSignals(const TerminationSignals&) = delete;
  TerminationSignals& operator=(const TerminationSignals&) = delete;

  // Returns the signal (SIGINT, SIGTERM or SIGHUP) once one is pending, or 0 after `timeout` (a
  // zero timeout polls).
  int Wait(absl::Duration timeout = absl::InfiniteDuration());

 private:
  sigset_t signals_;
  sigset_t previous_;
};

}  // namespace kvd

#endif  // KVD_SERVER_TERMINATION_SIGNALS_H_
