// Fuzz target: any bytes a client sends to the metrics endpoint (HttpConnection).
//
// Invariants: a connection always closes; any input gets exactly one well-formed reply
// (status 200, 400, 404 or 405, a Content-Length that counts the body sent, nothing after
// it), no input gets none; and the reply does not depend on how the bytes were split
// across reads: delivered in one write or in small pieces with the server stepping
// between them, the same request gets the same reply.

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/http_connection.h"
#include "tests/fuzz/fuzz_check.h"

namespace kvd {
namespace {

using fuzz::Require;

// Past the 16 KiB head limit, well inside a socket pair's buffer.
constexpr size_t kMaxInputBytes = 64 * 1024;

const HttpRoutes& Routes() {
  static const HttpRoutes* routes = new HttpRoutes{
      {"/metrics",
       [] {
         return HttpResponse{"text/plain; version=0.0.4", "kvd_up 1\n"};
       }},
      {"/healthz",
       [] {
         return HttpResponse{"text/plain", "ok\n"};
       }},
  };
  return *routes;
}

// Steps `connection` once with what poll() says of its socket now.
void StepOnce(HttpConnection& connection, HttpConnection::Clock::time_point now) {
  pollfd fd{connection.fd(), connection.PollEvents(), 0};
  Require(::poll(&fd, 1, 0) >= 0, "poll failed");
  connection.Step(Routes(), fd.revents, now);
}

// Sends `request` to a fresh connection in pieces of `piece_bytes` (0: all at once),
// stepping the server between pieces, ends the client's side and returns all it received.
std::string Exchange(absl::string_view request, size_t piece_bytes) {
  int fds[2];
  Require(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0, "socketpair failed");
  const int client = fds[1];
  const auto now = HttpConnection::Clock::now();  // fixed: no deadline ever passes
  std::string received;
  auto take_reply = [&] {
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(client, buf, sizeof(buf), MSG_DONTWAIT)) > 0) received.append(buf, n);
  };
  {
    HttpConnection connection(fds[0], now);
    size_t sent = 0;
    int steps = 0;
    while (sent < request.size() && connection.phase() != HttpConnection::Phase::kClosed) {
      const size_t want =
          piece_bytes == 0 ? request.size() - sent : std::min(piece_bytes, request.size() - sent);
      const ssize_t n = ::send(client, request.data() + sent, want, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += static_cast<size_t>(n);
      StepOnce(connection, now);
      take_reply();
      Require(++steps < 1'000'000, "the client's bytes are not being read");
    }
    ::shutdown(client, SHUT_WR);
    for (int i = 0; connection.phase() != HttpConnection::Phase::kClosed; ++i) {
      Require(i < 10'000, "the connection did not close after the client ended its side");
      StepOnce(connection, now);
      take_reply();
    }
  }  // the server's socket closes here
  take_reply();
  ::close(client);
  return received;
}

// The status code of `reply`, after checking that it is one well-formed response.
int CheckReply(absl::string_view reply, bool head_request) {
  Require(absl::StartsWith(reply, "HTTP/1.1 "), "the reply has no status line");
  int status = 0;
  Require(reply.size() >= 12 && absl::SimpleAtoi(reply.substr(9, 3), &status),
          "the status code is not a number");
  Require(status == 200 || status == 400 || status == 404 || status == 405,
          "unexpected status code");
  const size_t head_end = reply.find("\r\n\r\n");
  Require(head_end != absl::string_view::npos, "the reply head does not end");
  const absl::string_view head = reply.substr(0, head_end + 2);
  const absl::string_view body = reply.substr(head_end + 4);
  const size_t length_at = head.find("\r\nContent-Length: ");
  Require(length_at != absl::string_view::npos, "the reply has no Content-Length");
  const absl::string_view length_text =
      head.substr(length_at + 18, head.find("\r\n", length_at + 2) - (length_at + 18));
  size_t length = 0;
  Require(absl::SimpleAtoi(length_text, &length), "Content-Length is not a number");
  // HEAD gets the headers of the GET reply (200 or 404) and no body; 400 and 405 carry theirs.
  const bool body_sent = !(head_request && (status == 200 || status == 404));
  Require(body.size() == (body_sent ? length : 0), "the body is not Content-Length bytes");
  Require(absl::StrContains(head, "\r\nConnection: close\r\n"), "no Connection: close");
  return status;
}

}  // namespace
}  // namespace kvd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvd::fuzz::InputReader input(data, size);
  const size_t small_piece = 1 + input.Byte() % 64;
  const std::string_view bytes = input.Bytes(kvd::kMaxInputBytes);
  const absl::string_view request(bytes.data(), bytes.size());
  // At most 256 pieces, so that a large request costs a few hundred steps, not 64k.
  const size_t piece_bytes = std::max(small_piece, request.size() / 256 + 1);

  const std::string whole = kvd::Exchange(request, 0);
  const std::string pieces = kvd::Exchange(request, piece_bytes);
  if (request.empty()) {
    kvd::fuzz::Require(whole.empty() && pieces.empty(), "a reply to nothing");
    return 0;
  }
  // The method as Answer() reads it (blank lines, then words split on spaces), for HEAD's
  // empty body.
  const size_t start = request.find_first_not_of("\r\n ");
  const bool head_request =
      start != absl::string_view::npos && absl::StartsWith(request.substr(start), "HEAD ");
  kvd::CheckReply(whole, head_request);
  kvd::CheckReply(pieces, head_request);
  kvd::fuzz::Require(whole == pieces, "the reply depends on how the request was split");
  return 0;
}
