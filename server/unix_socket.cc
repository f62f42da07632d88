#include "server/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvd {

absl::Status FreeUnixSocketPath(const std::string& path, const std::string& address) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address,
                                                   "': unix socket path empty or longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", path,
                     " exists and is not a socket; allowed: a path that does not exist or holds "
                     "a stale socket"));
  }
  // Non-blocking: a live server with a full backlog answers EAGAIN rather than stalling here.
  const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (probe < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int rc = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int connect_errno = errno;
  ::close(probe);
  if (rc == 0 || connect_errno == EAGAIN) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, ": address in use (a server answers on ", path, ")"));
  }
  if (connect_errno != ECONNREFUSED) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", path, ": ", std::strerror(connect_errno)));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(absl::StrCat("cannot remove the stale socket ", path, " for ",
                                               address, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string UnixSocketPath(const std::string& address) {
  return address.substr(absl::StartsWith(address, "unix://") ? 7 : 5);
}

}  // namespace kvd
