#ifndef KVD_SERVER_UNIX_SOCKET_H_
#define KVD_SERVER_UNIX_SOCKET_H_

#include <string>

#include "absl/status/status.h"

namespace kvd {

// Makes `path` free for a new unix socket, for the listener at `address` (named in errors):
// nothing there, or a socket no server answers on any more (left behind by a run that
// died), which is removed. Anything else at the path, a regular file, say, or a live
// server's socket, is never touched: Unavailable naming it. Both listeners call it before
// they bind: gRPC would otherwise delete whatever socket is at the path, a live daemon's
// included, and take its place.
absl::Status FreeUnixSocketPath(const std::string& path, const std::string& address);

// The socket path of a "unix:" address, read as gRPC reads it: unix:path, or
// unix://absolute_path. REQUIRES: `address` starts with "unix:".
std::string UnixSocketPath(const std::string& address);

}  // namespace kvd

#endif  // KVD_SERVER_UNIX_SOCKET_H_
