#include "server/http_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

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

// Connections are served one at a time; a client that trickles its request must not hold
// the next scrape for longer than the 2 s read bound (it used to, for as long as it dripped).
TEST(HttpServerTest, ATricklingClientDelaysTheNextScrapeBySecondsNotIndefinitely) {
  std::atomic<int> calls{0};
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoute(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  const int slow = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(slow, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    // One byte every 200 ms, never a complete head, for up to 8 s.
    for (int i = 0; i < 40 && !stop.load(); ++i) {
      if (::send(slow, "X", 1, MSG_NOSIGNAL) != 1) break;  // the server gave up on it
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server reads `slow` first

  const auto start = std::chrono::steady_clock::now();
  const std::string reply = Roundtrip(port, "GET /metrics HTTP/1.1\r\n\r\n");
  const auto waited = std::chrono::steady_clock::now() - start;
  stop.store(true);
  drip.join();
  ::close(slow);
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 200"));
  EXPECT_LT(waited, std::chrono::milliseconds(4000));
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
