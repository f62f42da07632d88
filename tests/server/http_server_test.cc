#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvd {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Sends `request` to 127.0.0.1:port (or a unix socket path) and returns everything the
// server wrote before closing the connection.
std::string Roundtrip(int port, const std::string& request, const std::string& unix_path = "") {
  int fd;
  if (unix_path.empty()) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return "";
  } else {
    fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, unix_path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return "";
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

std::map<std::string, HttpServer::Handler> MetricsRoute(std::atomic<int>* calls) {
  return {{"/metrics", [calls] {
             ++*calls;
             return HttpServer::Response{"text/plain; version=0.0.4; charset=utf-8", "kvd_up 1\n"};
           }}};
}

TEST(HttpServerTest, ServesARegisteredPathOnAFreePort) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*server)->address(), absl::StrCat("127.0.0.1:", port));

  const std::string reply =
      Roundtrip(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(reply, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_THAT(reply, HasSubstr("Content-Length: 9\r\n"));
  EXPECT_THAT(reply, EndsWith("\r\n\r\nkvd_up 1\n"));
  EXPECT_EQ(calls.load(), 1);

  // Query strings are ignored; every request gets its own answer.
  EXPECT_THAT(Roundtrip(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(calls.load(), 2);
}

TEST(HttpServerTest, UnknownPathIs404AndOtherMethods405) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_THAT(Roundtrip(port, "GET / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 Not Found"));
  EXPECT_THAT(Roundtrip(port, "GET /metricsx HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404"));
  const std::string post = Roundtrip(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(post, HasSubstr("\r\nAllow: GET, HEAD\r\n"));  // RFC 9110: a 405 says what is
  EXPECT_THAT(Roundtrip(port, "garbage\r\n\r\n"), StartsWith("HTTP/1.1 400"));
  EXPECT_EQ(calls.load(), 0);
}

TEST(HttpServerTest, HeadSendsHeadersOnly) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string reply = Roundtrip((*server)->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 200 OK"));
  EXPECT_THAT(reply, HasSubstr("Content-Length: 9\r\n"));
  EXPECT_THAT(reply, EndsWith("\r\n\r\n"));
}

TEST(HttpServerTest, ServesOnAUnixSocketAndRemovesItOnStop) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/kvd_http_", ::getpid(), ".sock");
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("unix:" + path, MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->address(), "unix:" + path);
  EXPECT_THAT(Roundtrip(0, "GET /metrics HTTP/1.1\r\n\r\n", path), StartsWith("HTTP/1.1 200"));
  (*server)->Stop();
  (*server)->Stop();  // idempotent
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

std::string UnixSocketPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/kvd_http_", ::getpid(), "_", name, ".sock");
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

TEST(HttpServerTest, AUnixPathHoldingSomethingElseIsLeftAloneAndNamed) {
  const std::string path = UnixSocketPath("file");
  std::ofstream(path) << "precious";
  auto server = HttpServer::Start("unix:" + path, {});
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("not a socket"));
  EXPECT_EQ(ReadFile(path), "precious");
  ::unlink(path.c_str());
}

TEST(HttpServerTest, AStaleUnixSocketIsReplacedButALiveOneIsNot) {
  const std::string path = UnixSocketPath("stale");
  {  // A socket file whose server is gone (closed without unlinking, as after a crash).
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  std::atomic<int> calls{0};
  auto live = HttpServer::Start("unix:" + path, MetricsRoute(&calls));
  ASSERT_TRUE(live.ok()) << live.status();

  auto second = HttpServer::Start("unix:" + path, {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use"));
  // The first server still owns its socket.
  EXPECT_THAT(Roundtrip(0, "GET /metrics HTTP/1.1\r\n\r\n", path), StartsWith("HTTP/1.1 200"));
}

// A TCP connection to 127.0.0.1:port whose reads give up after 3 s, so that a test of a
// server that never answers fails instead of hanging. -1 if the connection failed.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const timeval timeout{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// What the server sent on `fd` until it ended the stream. `error` is 0 when the stream ended
// cleanly, else the errno that cut it: ECONNRESET, or EAGAIN after 3 s of silence.
std::string ReadToEnd(int fd, int* error) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  *error = n < 0 ? errno : 0;
  return out;
}

// Sends `request` on a fresh connection and returns the reply and how long it took.
std::string TimedScrape(int port, const std::string& request,
                        std::chrono::steady_clock::duration* took) {
  const auto start = std::chrono::steady_clock::now();
  const int fd = Connect(port);
  if (fd < 0) return "";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  int error;
  std::string reply = ReadToEnd(fd, &error);
  ::close(fd);
  *took = std::chrono::steady_clock::now() - start;
  return reply;
}

// True when the server has closed `fd` (a read sees the end of the stream or a reset), false
// when it is still open with nothing to read.
bool ClosedByServer(int fd) {
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// A scrape answered "at once": under the 2 s read bound that a server handling one
// connection at a time would wait out first, with room for a busy 2-core machine.
constexpr std::chrono::milliseconds kPromptly(1500);

// Every connection is served at once: clients that connect and say nothing (a port scanner,
// a stuck scraper) do not make a scrape wait for their 2 s read bound to run out in turn.
TEST(HttpServerTest, AScrapeIsAnsweredAtOnceWhileIdleConnectionsAreOpen) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < 5; ++i) idle.push_back(Connect(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the server holds all five

  std::chrono::steady_clock::duration took;
  EXPECT_THAT(TimedScrape(port, "GET /metrics HTTP/1.1\r\n\r\n", &took),
              StartsWith("HTTP/1.1 200"));
  EXPECT_LT(took, kPromptly);
  for (const int fd : idle) ::close(fd);
}

// Past the cap, a new connection replaces the oldest idle one, so idle connections cannot
// lock a scrape out; those accepted last stay open.
TEST(HttpServerTest, MoreIdleConnectionsThanTheCapCloseTheOldestAndDelayNoScrape) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < HttpServer::kMaxConnections + 10; ++i) {
    idle.push_back(Connect(port));
    ASSERT_GE(idle.back(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server accepts them all

  std::chrono::steady_clock::duration took;
  EXPECT_THAT(TimedScrape(port, "GET /metrics HTTP/1.1\r\n\r\n", &took),
              StartsWith("HTTP/1.1 200"));
  EXPECT_LT(took, kPromptly);
  EXPECT_TRUE(ClosedByServer(idle.front()));
  EXPECT_FALSE(ClosedByServer(idle.back()));
  for (const int fd : idle) ::close(fd);
}

// A client that trickles its request neither delays a scrape nor keeps its connection past
// the 2 s bound on the whole head.
TEST(HttpServerTest, ATricklingClientGets408AfterTwoSecondsAndDelaysNoScrape) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  const int slow = Connect(port);
  ASSERT_GE(slow, 0);
  const auto slow_start = std::chrono::steady_clock::now();
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    // One byte every 200 ms, never a complete head, for up to 8 s.
    for (int i = 0; i < 40 && !stop.load(); ++i) {
      if (::send(slow, "X", 1, MSG_NOSIGNAL) != 1) break;  // the server gave up on it
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the trickle has begun

  std::chrono::steady_clock::duration took;
  EXPECT_THAT(TimedScrape(port, "GET /metrics HTTP/1.1\r\n\r\n", &took),
              StartsWith("HTTP/1.1 200"));
  EXPECT_LT(took, kPromptly);

  int error;
  EXPECT_THAT(ReadToEnd(slow, &error), StartsWith("HTTP/1.1 408"));
  const auto slow_took = std::chrono::steady_clock::now() - slow_start;
  EXPECT_GE(slow_took, std::chrono::milliseconds(1900));
  EXPECT_LT(slow_took, std::chrono::milliseconds(5000));  // not kept open for the 8 s trickle
  stop.store(true);
  drip.join();
  ::close(slow);
}

// When accept fails for want of descriptors, the pending connection stays queued and the
// listener stays readable; the server pauses accepting instead of retrying in a busy loop,
// and serves the connection once descriptors are free again.
TEST(HttpServerTest, RunningOutOfDescriptorsPausesAcceptingInsteadOfSpinning) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 128;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  // Take every descriptor but one, which the client's socket takes: the server's accept4
  // then fails with EMFILE.
  std::vector<int> filler;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0;) filler.push_back(fd);
  ::close(filler.back());
  filler.pop_back();
  const int client = Connect(port);

  rusage before, after;
  ::getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  ::getrusage(RUSAGE_SELF, &after);
  for (const int fd : filler) ::close(fd);
  ::setrlimit(RLIMIT_NOFILE, &saved);

  const auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  const double cpu_seconds = seconds(after.ru_utime) - seconds(before.ru_utime) +
                             seconds(after.ru_stime) - seconds(before.ru_stime);
  EXPECT_LT(cpu_seconds, 0.1) << "the server retried accept in a busy loop";

  ASSERT_GE(client, 0);
  const std::string request = "GET /metrics HTTP/1.1\r\n\r\n";
  ::send(client, request.data(), request.size(), MSG_NOSIGNAL);
  int error;
  EXPECT_THAT(ReadToEnd(client, &error), StartsWith("HTTP/1.1 200"));
  ::close(client);
}

// RFC 9112 §2.2: a recipient may take a bare LF as a line terminator.
TEST(HttpServerTest, BareLineFeedsEndLinesToo) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::chrono::steady_clock::duration took;
  EXPECT_THAT(TimedScrape(port, "GET /metrics HTTP/1.0\n\n", &took), StartsWith("HTTP/1.1 200"));
  EXPECT_LT(took, kPromptly);
  EXPECT_THAT(TimedScrape(port, "GET /metrics HTTP/1.1\nHost: x\r\nAccept: */*\n\n", &took),
              EndsWith("\r\n\r\nkvd_up 1\n"));
  EXPECT_LT(took, kPromptly);
  // Empty lines before the request line are skipped (RFC 9112 §2.2).
  EXPECT_THAT(Roundtrip(port, "\r\nGET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(calls.load(), 3);
}

// RFC 9112 §3.2.2: a server must accept the absolute form of a target, as proxies send it.
TEST(HttpServerTest, AnAbsoluteFormTargetRoutesByItsPath) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_THAT(Roundtrip(port, absl::StrCat("GET http://127.0.0.1:", port,
                                           "/metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")),
              StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(calls.load(), 1);
  const std::string root = Roundtrip(port, "GET http://localhost HTTP/1.1\r\n\r\n");
  EXPECT_THAT(root, StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(root, EndsWith("no such path: /\n"));
}

// A request the server rejects before reading all of it (a POST's body, a head past 16 KiB)
// leaves input unread; the server must not close on it, which sends a reset that makes the
// client's read fail and can destroy the reply in flight. The client reads the whole reply
// and then a clean end of stream.
TEST(HttpServerTest, ARejectedRequestsUnreadInputDoesNotResetTheReply) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const struct {
    std::string request;
    std::string status_line;
    std::string body;
  } cases[] = {
      {"POST /metrics HTTP/1.1\r\nContent-Length: 200000\r\n\r\n" + std::string(200000, 'a'),
       "HTTP/1.1 405", "only GET and HEAD\n"},
      {"GET /metrics HTTP/1.1\r\nX-Big: " + std::string(40000, 'a') + "\r\n\r\n", "HTTP/1.1 400",
       "request too large\n"},
  };
  for (const auto& c : cases) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    // Sent from a thread while this one reads, as an HTTP client would.
    std::thread sender([&] {
      for (size_t sent = 0; sent < c.request.size();) {
        const ssize_t n =
            ::send(fd, c.request.data() + sent, c.request.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
    });
    int error;
    const std::string reply = ReadToEnd(fd, &error);
    sender.join();
    ::close(fd);
    EXPECT_THAT(reply, StartsWith(c.status_line));
    EXPECT_THAT(reply, EndsWith(absl::StrCat("\r\n\r\n", c.body)));
    EXPECT_EQ(error, 0) << std::strerror(error);
  }
  EXPECT_EQ(calls.load(), 0);
}

// The head limit (16 KiB, its empty line included) is exact however the bytes arrive: the
// server reads 4 KiB at a time, and a head whose end came in the read that crossed the limit
// was once answered.
TEST(HttpServerTest, AHeadOverSixteenKibIs400HoweverItArrives) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  auto head_of = [](size_t bytes) {
    const std::string start = "GET /metrics HTTP/1.1\r\nX-Pad: ";
    return start + std::string(bytes - start.size() - 4, 'a') + "\r\n\r\n";
  };
  ASSERT_EQ(head_of(16384).size(), 16384u);
  EXPECT_THAT(Roundtrip(port, head_of(16384)), StartsWith("HTTP/1.1 200"));
  for (size_t bytes : {16385, 17000, 20400}) {
    EXPECT_THAT(Roundtrip(port, head_of(bytes)), StartsWith("HTTP/1.1 400")) << bytes;
  }
  EXPECT_EQ(calls.load(), 1);
}

TEST(HttpServerTest, StopClosesTheListener) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  server->reset();
  EXPECT_EQ(Roundtrip(port, "GET /metrics HTTP/1.1\r\n\r\n"), "");
}

TEST(HttpServerTest, BadAddressesAreErrors) {
  EXPECT_EQ(HttpServer::Start("no-port", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start("127.0.0.1:99999", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start("[::1:80", {}).status().code(), absl::StatusCode::kInvalidArgument);
  // A port that is taken cannot be bound.
  auto first = HttpServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok());
  auto second = HttpServer::Start((*first)->address(), {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr((*first)->address()));
}

}  // namespace
}  // namespace kvd
