#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http_connection.h"
#include "server/unix_socket.h"

namespace kvd {

namespace {

// How long accepting pauses after accept4 fails for want of descriptors or memory.
constexpr std::chrono::milliseconds kAcceptBackoff{100};
// New connections taken per poll round: a flood of them cannot close (as the oldest, past the
// cap) one that was accepted in the round before and whose request has just arrived.
constexpr int kMaxAcceptsPerRound = HttpServer::kMaxConnections / 4;

using Clock = HttpConnection::Clock;

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

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, std::map<std::string, Handler> routes) {
  int fd = -1;
  std::string bound;
  int port = 0;
  std::string unix_path;
  if (absl::StartsWith(address, "unix:")) {
    unix_path = UnixSocketPath(address);
    if (absl::Status s = FreeUnixSocketPath(unix_path, address); !s.ok()) return s;
    sockaddr_un addr{};
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return absl::UnavailableError(Errno("socket"));
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, unix_path.data(), unix_path.size());
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
      fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
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
  // Room for twice the cap: a burst of new connections queues instead of having SYNs dropped,
  // which costs each client a one-second retransmit.
  if (::listen(fd, 2 * kMaxConnections) != 0) {
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
  std::vector<std::unique_ptr<HttpConnection>> conns;  // in accept order, oldest first
  Clock::time_point accept_paused_until;
  std::vector<pollfd> fds;
  while (true) {
    Clock::time_point now = Clock::now();
    const bool accepting = now >= accept_paused_until;
    Clock::time_point wake = accepting ? Clock::time_point::max() : accept_paused_until;
    fds.clear();
    fds.push_back({wake_read_fd_, POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // poll skips a negative fd
    for (const auto& c : conns) {
      fds.push_back({c->fd(), c->PollEvents(), 0});
      wake = std::min(wake, c->deadline());
    }
    int timeout_ms = -1;
    if (wake != Clock::time_point::max()) {
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(wake - now).count()));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      // Short of kernel memory: try again shortly, as accept does. Anything else (EBADF,
      // EINVAL) is a bug in the set above, and retrying would spin.
      if (errno == ENOMEM || errno == EAGAIN) {
        std::this_thread::sleep_for(kAcceptBackoff);
        continue;
      }
      return;
    }
    if (fds[0].revents != 0) return;  // Stop()

    // Open connections go first, so that one whose request has arrived is answered before
    // new ones can crowd it out.
    now = Clock::now();
    for (size_t i = 0; i < conns.size(); ++i) conns[i]->Step(routes_, fds[i + 2].revents, now);
    conns.erase(
        std::remove_if(conns.begin(), conns.end(),
                       [](const auto& c) { return c->phase() == HttpConnection::Phase::kClosed; }),
        conns.end());

    if (fds[1].revents == 0) continue;
    for (int i = 0; i < kMaxAcceptsPerRound; ++i) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;  // that one is gone; try the next
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        // EMFILE, ENFILE, ENOBUFS, ENOMEM (or anything unforeseen): the connection stays
        // queued and the listener readable, so retrying at once would spin.
        accept_paused_until = Clock::now() + kAcceptBackoff;
        break;
      }
      if (conns.size() >= static_cast<size_t>(kMaxConnections)) {
        // Make room: the oldest connection already answered, else the oldest still sending
        // its request, else the oldest being answered.
        auto victim = conns.end();
        for (const auto phase : {HttpConnection::Phase::kDraining, HttpConnection::Phase::kReading,
                                 HttpConnection::Phase::kWriting}) {
          victim = std::find_if(conns.begin(), conns.end(),
                                [phase](const auto& c) { return c->phase() == phase; });
          if (victim != conns.end()) break;
        }
        if (victim != conns.end()) conns.erase(victim);
      }
      conns.push_back(std::make_unique<HttpConnection>(fd, Clock::now()));
    }
  }
}

}  // namespace kvd
