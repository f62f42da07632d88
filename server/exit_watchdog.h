#ifndef KVD_SERVER_EXIT_WATCHDOG_H_
#define KVD_SERVER_EXIT_WATCHDOG_H_

#include "absl/time/time.h"

namespace kvd {

// Bounds the teardown that follows a finished drain. Once `kvd serve` has said "stopped",
// destroying the daemon (the gRPC server, the engine, the backend) should take moments; a
// gRPC server whose threads could not all be created (a pid or memory limit) was seen to
// hang in its destructor for good, holding the pod until its grace period's SIGKILL. Arms a
// detached thread that, unless the process has exited within `limit`, writes a line to
// stderr and ends the process with `exit_code` (std::_Exit: no destructors, nothing flushed
// but stderr). Thread safe; call once, as the last thing before the teardown.
void ExitIfTeardownHangs(absl::Duration limit, int exit_code);

}  // namespace kvd

#endif  // KVD_SERVER_EXIT_WATCHDOG_H_
