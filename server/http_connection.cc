#include "server/http_connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace kvd {

namespace {

// The bytes of a complete reply. `extra_headers`: complete header lines, each ending in \r\n.
std::string Reply(absl::string_view status, absl::string_view content_type, absl::string_view body,
                  bool head_only, absl::string_view extra_headers = "") {
  std::string out = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                                 "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                                 "Connection: close\r\n\r\n");
  if (!head_only) out.append(body.data(), body.size());
  return out;
}

// Where the request head in `in` ends, just past its empty line, or npos while it has not
// arrived. Lines end in CRLF or a bare LF, and empty lines before the request line are
// skipped (RFC 9112 §2.2).
size_t HeadEnd(absl::string_view in) {
  const size_t start = in.find_first_not_of("\r\n");
  if (start == absl::string_view::npos) return absl::string_view::npos;
  for (size_t lf = in.find('\n', start); lf != absl::string_view::npos;
       lf = in.find('\n', lf + 1)) {
    if (absl::StartsWith(in.substr(lf + 1), "\n")) return lf + 2;
    if (absl::StartsWith(in.substr(lf + 1), "\r\n")) return lf + 3;
  }
  return absl::string_view::npos;
}

// The path a request target names, query dropped: origin-form "/metrics?x=1" or
// absolute-form "http://host:port/metrics" (RFC 9112 §3.2.2), whose empty path is "/".
std::string TargetPath(absl::string_view target) {
  bool absolute = false;
  if (!absl::StartsWith(target, "/")) {
    const size_t scheme_end = target.find("://");
    if (scheme_end != absl::string_view::npos) {
      absolute = true;
      target.remove_prefix(scheme_end + 3);
      target.remove_prefix(std::min(target.find_first_of("/?#"), target.size()));
    }
  }
  target = target.substr(0, target.find_first_of("?#"));
  if (absolute && target.empty()) return "/";
  return std::string(target);
}

// The reply to a request whose head (or as much of it as came) is `head`.
std::string Answer(const HttpRoutes& routes, absl::string_view head) {
  head.remove_prefix(std::min(head.find_first_not_of("\r\n"), head.size()));
  absl::string_view line = head.substr(0, head.find('\n'));
  absl::ConsumeSuffix(&line, "\r");
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    return Reply("400 Bad Request", "text/plain; charset=utf-8", "malformed request line\n", false);
  }
  const absl::string_view method = parts[0];
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return Reply("405 Method Not Allowed", "text/plain; charset=utf-8", "only GET and HEAD\n",
                 false, "Allow: GET, HEAD\r\n");
  }
  const std::string path = TargetPath(parts[1]);
  const auto it = routes.find(path);
  if (it == routes.end()) {
    return Reply("404 Not Found", "text/plain; charset=utf-8",
                 absl::StrCat("no such path: ", path, "\n"), head_only);
  }
  const HttpResponse response = it->second();
  return Reply("200 OK", response.content_type, response.body, head_only);
}

}  // namespace

HttpConnection::HttpConnection(int fd, Clock::time_point now)
    : fd_(fd), deadline_(now + kReadTimeout) {}

HttpConnection::~HttpConnection() {
  if (fd_ >= 0) ::close(fd_);
}

short HttpConnection::PollEvents() const { return phase_ == Phase::kWriting ? POLLOUT : POLLIN; }

void HttpConnection::Step(const HttpRoutes& routes, short revents, Clock::time_point now) {
  if (revents != 0) {
    switch (phase_) {
      case Phase::kReading:
        Read(routes, now);
        break;
      case Phase::kWriting:
        Write(now);
        break;
      case Phase::kDraining:
        Drain();
        break;
      case Phase::kClosed:
        break;
    }
  }
  if (phase_ == Phase::kClosed || now < deadline_) return;
  if (phase_ == Phase::kReading && !in_.empty()) {
    StartReply(Reply("408 Request Timeout", "text/plain; charset=utf-8",
                     "the request head did not arrive in time\n", false),
               now);
  } else {
    phase_ = Phase::kClosed;  // nothing came, the reply was not taken, or draining is over
  }
}

void HttpConnection::Read(const HttpRoutes& routes, Clock::time_point now) {
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 || (n == 0 && in_.empty())) {  // an error, or the peer connected and left
      phase_ = Phase::kClosed;
      return;
    }
    if (n == 0) {  // tolerate a head cut short: answer what we have
      peer_closed_ = true;
      StartReply(Answer(routes, in_), now);
      return;
    }
    in_.append(buf, static_cast<size_t>(n));
    // The limit holds however the head arrived: one that ends past it is too large even when
    // its end came in the same read as its first byte past the limit.
    const size_t end = HeadEnd(in_);
    if (end != absl::string_view::npos && end <= kMaxRequestBytes) {
      StartReply(Answer(routes, absl::string_view(in_).substr(0, end)), now);
      return;
    }
    if (end != absl::string_view::npos || in_.size() > kMaxRequestBytes) {
      StartReply(
          Reply("400 Bad Request", "text/plain; charset=utf-8", "request too large\n", false), now);
      return;
    }
  }
}

void HttpConnection::StartReply(std::string reply, Clock::time_point now) {
  in_.clear();
  in_.shrink_to_fit();
  out_ = std::move(reply);
  phase_ = Phase::kWriting;
  deadline_ = now + kWriteTimeout;
  Write(now);  // most replies fit the socket buffer at once
}

void HttpConnection::Write(Clock::time_point now) {
  while (!out_.empty()) {
    const ssize_t n = ::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      phase_ = Phase::kClosed;
      return;
    }
    out_.erase(0, static_cast<size_t>(n));
  }
  out_.shrink_to_fit();
  if (peer_closed_ || ::shutdown(fd_, SHUT_WR) != 0) {
    phase_ = Phase::kClosed;
    return;
  }
  phase_ = Phase::kDraining;
  deadline_ = now + kDrainTimeout;
}

void HttpConnection::Drain() {
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    num_drained_bytes_ += n > 0 ? static_cast<size_t>(n) : 0;
    if (n <= 0 || num_drained_bytes_ > kMaxDrainBytes) {
      phase_ = Phase::kClosed;
      return;
    }
  }
}

}  // namespace kvd
