#ifndef KVD_SERVER_HTTP_SERVER_H_
#define KVD_SERVER_HTTP_SERVER_H_

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/http_connection.h"

namespace kvd {

// A deliberately small HTTP/1.1 server for GET endpoints such as /metrics. One thread serves
// every open connection at once from a poll() loop, so no client waits on another; handlers
// run inline on it (a scrape renders in microseconds). Every reply carries
// `Connection: close`. GET and HEAD of a registered path call its handler; the target may be
// origin-form ("/metrics?x=1") or absolute-form ("http://host:port/metrics"), and head lines
// may end in CRLF or a bare LF. Any other path is 404, any other method 405 (with
// `Allow: GET, HEAD`), a malformed request line or a head over 16 KiB 400.
//
// Each connection is an HttpConnection (http_connection.h states its phases), bounded per
// phase from the phase's start: its request head must arrive within 2 s of accept (else 408,
// or a silent close if nothing came) and its reply must be taken within 2 s. Then the server
// shuts down its sending side and discards input (a body, say) until the client closes, for
// at most 2 s or 1 MiB, so that closing with unread input never resets a reply the client is
// still reading. At most kMaxConnections are open; a new one past the cap closes the oldest
// that was already answered, else the oldest still sending its request, else the oldest being
// answered, so neither idle nor reconnecting clients can keep a scrape waiting. When accept
// fails for want of descriptors or memory, the pending connection stays queued and accepting
// pauses for 100 ms instead of spinning; poll() short of memory waits as long and retries.
//
// Listens on "host:port" (IPv4, a host name, or "[v6]:port"; port 0 picks a free port, and
// address() reports the real one) or "unix:/path". A socket left at the path by a server
// that is gone is replaced; a live server's socket, or anything that is not a socket, is
// left alone and Start fails.
//
// Thread safety: handlers run on the server thread and must be thread safe with respect to
// the rest of the program. Start/Stop are called from one owning thread. The destructor
// stops the server.
class HttpServer {
 public:
  using Response = HttpResponse;
  using Handler = HttpHandler;

  // Open connections at most; see the class comment for which one a new connection replaces.
  static constexpr int kMaxConnections = 64;

  // Binds, listens and starts serving `routes` (path -> handler). Errors: InvalidArgument
  // for a malformed address, Unavailable when the address cannot be bound (in use, or a unix
  // path that holds something other than a stale socket); the message names the address.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           std::map<std::string, Handler> routes);

  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound address, port resolved: "127.0.0.1:40123", "[::1]:9090", "unix:/run/kvd.sock".
  const std::string& address() const { return address_; }
  int port() const { return port_; }  // 0 for unix sockets

  // Stops accepting, closes every open connection and joins the thread. Idempotent.
  void Stop();

 private:
  HttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, std::string address, int port,
             std::string unix_path, std::map<std::string, Handler> routes);
  void Serve();

  const int listen_fd_;
  const int wake_read_fd_;  // self-pipe: Stop() writes a byte to end poll()
  const int wake_write_fd_;
  const std::string address_;
  const int port_;
  const std::string unix_path_;  // unlinked on Stop; empty for TCP
  const std::map<std::string, Handler> routes_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace kvd

#endif  // KVD_SERVER_HTTP_SERVER_H_
