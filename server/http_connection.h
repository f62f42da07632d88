#ifndef KVD_SERVER_HTTP_CONNECTION_H_
#define KVD_SERVER_HTTP_CONNECTION_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <string>

namespace kvd {

// What a GET endpoint's handler returns; HEAD sends the same headers without the body.
struct HttpResponse {
  std::string content_type;
  std::string body;
};
using HttpHandler = std::function<HttpResponse()>;
// Path ("/metrics") -> handler. The request target's path, query dropped, must match exactly.
using HttpRoutes = std::map<std::string, HttpHandler>;

// HttpConnection serves one accepted HTTP/1.1 connection: it reads one request head, answers
// it with a single `Connection: close` reply and closes. It never blocks; the owner's poll()
// loop drives it with Step(). The phases come in order, each bounded as a whole from its own
// start (not per recv/send, so a client that trickles a byte now and then cannot hold on):
//
//   kReading --head, EOF, 16 KiB or timeout--> kWriting --reply sent--> kDraining --> kClosed
//
// kReading (kReadTimeout from construction): head lines may end in CRLF or a bare LF, and
//   empty lines before the request line are skipped. GET and HEAD of a route call its handler
//   (200); the target may be origin-form ("/metrics?x=1") or absolute-form
//   ("http://host:port/metrics"). Any other path is 404, any other method 405 (with
//   `Allow: GET, HEAD`), a malformed request line or a head over kMaxRequestBytes 400. A
//   client that ends its side mid-head is answered from what came. At the deadline a partial
//   head gets 408; a connection on which nothing came, or that failed, closes silently.
// kWriting (kWriteTimeout): sends the reply; an error or the deadline closes.
// kDraining (kDrainTimeout, at most kMaxDrainBytes): the sending side is shut down, so the
//   client sees the end of the reply, and input (a body, say) is discarded until the client
//   closes: closing with unread input would send a reset that can destroy the reply still in
//   flight. A client that already ended its side skips this phase.
// kClosed: final; the owner destroys the connection.
//
// Owns its socket from construction and closes it in the destructor only, so destroying a
// connection in any phase is how the owner drops it early. Not thread safe: one thread (the
// server's poll loop) makes every call, and handlers run inline on it inside Step().
class HttpConnection {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Phase { kReading, kWriting, kDraining, kClosed };

  static constexpr size_t kMaxRequestBytes = 16 * 1024;
  static constexpr size_t kMaxDrainBytes = 1024 * 1024;
  static constexpr std::chrono::milliseconds kReadTimeout{2000};
  static constexpr std::chrono::milliseconds kWriteTimeout{2000};
  static constexpr std::chrono::milliseconds kDrainTimeout{2000};

  // Takes ownership of `fd`; the read deadline starts at `now`.
  // REQUIRES: `fd` is a connected, non-blocking stream socket.
  HttpConnection(int fd, Clock::time_point now);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // Does what `revents` (poll()'s result for fd() and PollEvents()) allows in the current
  // phase, answering a complete request from `routes`; then ends the phase if its deadline has
  // passed. Call it after every poll() round, with revents 0 if fd() was not ready, so that
  // deadlines fire. Does nothing once kClosed.
  // REQUIRES: `now` does not go backwards from one call to the next.
  void Step(const HttpRoutes& routes, short revents, Clock::time_point now);

  int fd() const { return fd_; }
  Phase phase() const { return phase_; }
  // When the current phase ends: the owner polls with a timeout that wakes it by then.
  Clock::time_point deadline() const { return deadline_; }
  // The poll() events the current phase waits for: POLLOUT while writing, else POLLIN.
  short PollEvents() const;

 private:
  void Read(const HttpRoutes& routes, Clock::time_point now);
  void StartReply(std::string reply, Clock::time_point now);
  void Write(Clock::time_point now);
  void Drain();

  const int fd_;
  Phase phase_ = Phase::kReading;
  Clock::time_point deadline_;
  std::string in_;   // kReading: the request so far
  std::string out_;  // kWriting: reply bytes not yet sent
  size_t num_drained_bytes_ = 0;
  bool peer_closed_ = false;  // the client ended its side; there is nothing left to drain
};

}  // namespace kvd

#endif  // KVD_SERVER_HTTP_CONNECTION_H_
