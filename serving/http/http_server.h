// An HTTP/1.1 server on libevent's evhttp: a small fixed number of event-loop
// threads share one listening socket, each running its own event base, so
// connections cost no thread of their own and a slow client (half a body
// sent, then silence) holds only its connection's buffers. Keep-alive,
// request size limits applied by evhttp before a body is read (a declared
// Content-Length over the limit is answered 413 at once), per-connection
// timeouts, and TLS through libevent's OpenSSL bufferevents.
//
// It knows nothing of inference: each request goes to the Handler on its
// loop thread as an HttpExchange, which the handler (or any thread after
// it) answers exactly once with Reply. Only libevent code is in
// http_server.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct evhttp_request;
struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace numaserve::serving::http {

class HttpServer;

// What one reply carries. Its body is `body`, then each of `more_body`
// (sent without a copy; they must stay valid while `keep` lives).
struct HttpReply {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // Content-Type among them
  std::string body;
  std::vector<absl::string_view> more_body;
  std::shared_ptr<const void> keep;
  // Runs once on the server's loop thread when the whole reply has left
  // the server's buffers (taken by the socket or the TLS layer), or when
  // the connection is gone first; `keep` is let go then.
  std::function<void()> on_written;
};

// A request body taken from its exchange (HttpExchange::TakeBody): the
// first bytes made contiguous, the rest in the pieces they arrived in (no
// copy); both valid while `owner` lives, on any thread.
struct TakenBody {
  absl::string_view prefix;
  std::vector<absl::string_view> rest;
  std::shared_ptr<const void> owner;
};

// One request and its reply. The accessors are valid on the loop thread
// that handed it to the Handler, until the handler returns; Reply may be
// called from any thread, exactly once, and ends the exchange.
class HttpExchange {
 public:
  const std::string& method() const { return method_; }  // "GET", "POST", ...
  const std::string& path() const { return path_; }      // as sent, without "?query"
  // The values of header `name` (case-insensitive), in order.
  std::vector<absl::string_view> Headers(absl::string_view name) const;
  // The whole body, made contiguous.
  absl::string_view Body();
  // Frees the body's buffers early (the handler has read what it needs).
  void DropBody();
  size_t BodySize() const;
  // Takes the body out of the exchange: its first `prefix` bytes (at most
  // the body's) contiguous, the others where they lie.
  TakenBody TakeBody(size_t prefix);
  // Sends `reply`; thread-safe. The exchange is deleted once sent.
  void Reply(HttpReply reply);

 private:
  friend class HttpServer;
  HttpExchange(HttpServer* server, int loop, evhttp_request* request);
  HttpServer* const server_;
  const int loop_;
  evhttp_request* const request_;
  std::string method_;
  std::string path_;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 picks a free one
  // Event-loop threads; each serves its share of the connections.
  int threads = 2;
  // The largest request body; a request declaring more is answered 413
  // before its body is read (evhttp's own limit).
  size_t max_body_bytes = size_t{64} << 20;
  // The largest request line and headers together.
  size_t max_header_bytes = size_t{64} << 10;
  // A connection that sends or takes nothing for this long is closed, a
  // half-sent request with it.
  std::chrono::seconds timeout{60};
  // TLS (TLS 1.2 or later): a context with the server's certificate and
  // key (and client verification for mTLS); null = plain HTTP.
  std::shared_ptr<ssl_ctx_st> tls;
};

class HttpServer {
 public:
  using Handler = std::function<void(HttpExchange* exchange)>;

  // Listens on host:port and starts the loops; UNAVAILABLE naming the
  // address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           Handler handler);
  ~HttpServer();  // Stop(), then frees everything

  int port() const { return port_; }

  // Stops accepting connections, waits (until `deadline`) for every
  // exchange already handed to the handler to be answered and its reply
  // written, then stops the loops. Idempotent.
  void Stop(std::chrono::steady_clock::time_point deadline);

  struct Loop;  // one event-loop thread (http_server.cc)

 private:
  friend class HttpExchange;
  HttpServer(const HttpServerOptions& options, Handler handler);
  absl::Status Listen();
  absl::Status StartLoops();
  // Hands `reply` to the loop that owns `exchange` (or sends it at once
  // when called on that loop's thread).
  void Post(HttpExchange* exchange, HttpReply reply);
  // evhttp's callback for every request a loop has read whole.
  static void OnRequest(evhttp_request* request, void* arg);

  const HttpServerOptions options_;
  const Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<std::unique_ptr<Loop>> loops_;
  // Exchanges handed to the handler whose replies are not yet written.
  std::atomic<int64_t> open_exchanges_{0};
  bool stopped_ = false;
};

}  // namespace numaserve::serving::http
