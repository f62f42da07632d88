#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvd {

namespace {

constexpr size_t kMaxRequestBytes = 16 * 1024;
// Connections are served one at a time, so each phase of one is bounded as a whole, not per
// recv/send: a client that trickles a byte now and then must not hold /metrics for long.
constexpr std::chrono::milliseconds kReadTimeout{2000};
constexpr std::chrono::milliseconds kWriteTimeout{2000};

using Deadline = std::chrono::steady_clock::time_point;

std::string Errno(absl::string_view what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

void CloseFd(int fd) {
  if (fd >= 0) ::close(fd);
}

// Splits "host:port" / "[v6]:port" into host and port.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  std::string port_text;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", address, "': expected [ipv6]:port"));
    }
    *host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", address, "': expected host:port or unix:/path"));
    }
    *host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  if (!absl::SimpleAtoi(port_text, port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "': port must be 0..65535"));
  }
  return absl::OkStatus();
}

// Waits until `fd` is ready for `events` or `deadline` passes; false on timeout or error.
bool WaitReady(int fd, short events, Deadline deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 60'000)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n > 0) return true;  // readable, writable, or an error/hangup the next call reports
  }
}

bool SendAll(int fd, absl::string_view data) {
  const Deadline deadline = std::chrono::steady_clock::now() + kWriteTimeout;
  while (!data.empty()) {
    if (!WaitReady(fd, POLLOUT, deadline)) return false;
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// `extra_headers`: complete header lines, each ending in \r\n.
void Reply(int fd, absl::string_view status, absl::string_view content_type, absl::string_view body,
           bool head_only, absl::string_view extra_headers = "") {
  std::string out = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                                 "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                                 "Connection: close\r\n\r\n");
  if (!head_only) out.append(body.data(), body.size());
  SendAll(fd, out);
}

// Makes `path` free for a new unix socket: nothing there, or a socket that no server answers
// on any more (left behind by a run that died), which is removed. Anything else at the path,
// a regular file, say, or a live server's socket, is never touched: Unavailable naming it.
absl::Status RemoveStaleSocket(const std::string& path, const std::string& address) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::UnavailableError(Errno(absl::StrCat("cannot listen on ", address, ": ", path)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", path,
                     " exists and is not a socket; allowed: a path that does not exist or holds "
                     "a stale socket"));
  }
  // Non-blocking: a live server with a full backlog answers EAGAIN rather than stalling here.
  const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (probe < 0) return absl::UnavailableError(Errno("socket"));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int rc = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int connect_errno = errno;
  CloseFd(probe);
  if (rc == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, ": address in use (a server answers on ", path, ")"));
  }
  if (connect_errno != ECONNREFUSED) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", path, ": ", std::strerror(connect_errno)));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(
        Errno(absl::StrCat("cannot remove the stale socket ", path, " for ", address)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, std::map<std::string, Handler> routes) {
  int fd = -1;
  std::string bound;
  int port = 0;
  std::string unix_path;
  if (absl::StartsWith(address, "unix:")) {
    unix_path = address.substr(5);
    sockaddr_un addr{};
    if (unix_path.empty() || unix_path.size() >= sizeof(addr.sun_path)) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", address, "': unix socket path empty or too long"));
    }
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::UnavailableError(Errno("socket"));
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, unix_path.data(), unix_path.size());
    if (absl::Status s = RemoveStaleSocket(unix_path, address); !s.ok()) {
      CloseFd(fd);
      return s;
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const std::string err = Errno(absl::StrCat("cannot bind ", address));
      CloseFd(fd);
      return absl::UnavailableError(err);
    }
    bound = address;
  } else {
    std::string host;
    if (absl::Status s = SplitHostPort(address, &host, &port); !s.ok()) return s;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* result = nullptr;
    const std::string port_text = std::to_string(port);
    const int rc =
        ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &result);
    if (rc != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", address, "': ", ::gai_strerror(rc)));
    }
    std::string last_error = "no usable address";
    for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
      fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) continue;
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
      last_error = Errno("bind");
      CloseFd(fd);
      fd = -1;
    }
    ::freeaddrinfo(result);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", last_error));
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
    char text[INET6_ADDRSTRLEN] = {};
    if (local.ss_family == AF_INET6) {
      const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&local);
      ::inet_ntop(AF_INET6, &a6->sin6_addr, text, sizeof(text));
      port = ntohs(a6->sin6_port);
      bound = absl::StrCat("[", text, "]:", port);
    } else {
      const auto* a4 = reinterpret_cast<const sockaddr_in*>(&local);
      ::inet_ntop(AF_INET, &a4->sin_addr, text, sizeof(text));
      port = ntohs(a4->sin_port);
      bound = absl::StrCat(text, ":", port);
    }
  }
  if (::listen(fd, 64) != 0) {
    const std::string err = Errno(absl::StrCat("cannot listen on ", address));
    CloseFd(fd);
    return absl::UnavailableError(err);
  }
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const std::string err = Errno("pipe");
    CloseFd(fd);
    return absl::UnavailableError(err);
  }
  std::unique_ptr<HttpServer> server(new HttpServer(fd, wake[0], wake[1], std::move(bound), port,
                                                    std::move(unix_path), std::move(routes)));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

HttpServer::HttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, std::string address,
                       int port, std::string unix_path, std::map<std::string, Handler> routes)
    : listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      address_(std::move(address)),
      port_(port),
      unix_path_(std::move(unix_path)),
      routes_(std::move(routes)) {}

HttpServer::~HttpServer() {
  Stop();
  CloseFd(listen_fd_);
  CloseFd(wake_read_fd_);
  CloseFd(wake_write_fd_);
}

void HttpServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  const char byte = 0;
  while (::write(wake_write_fd_, &byte, 1) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) thread_.join();
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
}

void HttpServer::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_fd_, POLLIN, 0}};
    const int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    HandleConnection(conn);
    ::close(conn);
  }
}

void HttpServer::HandleConnection(int fd) {
  // Read the request head; a GET has no body worth reading.
  const Deadline deadline = std::chrono::steady_clock::now() + kReadTimeout;
  std::string request;
  char buf[4096];
  while (request.find("\r\n\r\n") == std::string::npos) {
    if (request.size() > kMaxRequestBytes) {
      Reply(fd, "400 Bad Request", "text/plain; charset=utf-8", "request too large\n", false);
      return;
    }
    if (!WaitReady(fd, POLLIN, deadline)) {
      if (!request.empty()) {
        Reply(fd, "408 Request Timeout", "text/plain; charset=utf-8",
              "the request head did not arrive in time\n", false);
      }
      return;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) {
      if (request.empty()) return;  // the peer connected and left
      break;                        // tolerate a head cut short: answer what we have
    }
    request.append(buf, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find("\r\n"));
  const std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    Reply(fd, "400 Bad Request", "text/plain; charset=utf-8", "malformed request line\n", false);
    return;
  }
  const std::string& method = parts[0];
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    Reply(fd, "405 Method Not Allowed", "text/plain; charset=utf-8", "only GET and HEAD\n", false,
          "Allow: GET, HEAD\r\n");
    return;
  }
  std::string path = parts[1];
  path = path.substr(0, path.find('?'));
  const auto it = routes_.find(path);
  if (it == routes_.end()) {
    Reply(fd, "404 Not Found", "text/plain; charset=utf-8",
          absl::StrCat("no such path: ", path, "\n"), head);
    return;
  }
  const Response response = it->second();
  Reply(fd, "200 OK", response.content_type, response.body, head);
}

}  // namespace kvd
