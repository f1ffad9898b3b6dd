// HttpServer (http_server.h) on libevent: the listening socket, one event
// base and evhttp per loop thread, the queue that carries replies made on
// other threads back to the loop that owns their connection, and the
// zero-copy reply bodies whose release is the moment a reply is written.
#include "serving/http/http_server.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <event2/util.h>
#include <netdb.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "base/errno_text.h"
#include "base/log.h"
#include "base/mutex.h"
#include "serving/http/http_status.h"

namespace numaserve::serving::http {

using base::Log;
using base::LogLevel;

struct HttpServer::Loop {
  HttpServer* server = nullptr;
  int index = 0;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  evconnlistener* listener = nullptr;  // owned by `http` once bound
  event* wake = nullptr;               // made active to send the queued replies
  std::thread thread;
  std::atomic<std::thread::id> thread_id{};
  base::Mutex mu;
  std::vector<std::pair<HttpExchange*, HttpReply>> ready ABSL_GUARDED_BY(mu);
  bool running ABSL_GUARDED_BY(mu) = true;  // false: the loop stopped; replies are dropped
};

namespace {

// A reply's body, alive until libevent has let go of every piece of it.
struct WrittenReply {
  std::string body;
  std::shared_ptr<const void> keep;
  std::function<void()> on_written;
  int pieces = 0;
  std::atomic<int64_t>* open_exchanges;
};

void ReplyWritten(WrittenReply* w) {
  if (w->on_written) w->on_written();
  w->open_exchanges->fetch_sub(1);
  delete w;
}

// evbuffer_add_reference's cleanup: one piece of a reply left the buffers.
void PieceWritten(const void*, size_t, void* extra) {
  auto* w = static_cast<WrittenReply*>(extra);
  if (--w->pieces == 0) ReplyWritten(w);
}

const char* MethodName(evhttp_cmd_type command) {
  switch (command) {
    case EVHTTP_REQ_GET:
      return "GET";
    case EVHTTP_REQ_POST:
      return "POST";
    case EVHTTP_REQ_HEAD:
      return "HEAD";
    case EVHTTP_REQ_PUT:
      return "PUT";
    case EVHTTP_REQ_DELETE:
      return "DELETE";
    case EVHTTP_REQ_OPTIONS:
      return "OPTIONS";
    case EVHTTP_REQ_TRACE:
      return "TRACE";
    case EVHTTP_REQ_CONNECT:
      return "CONNECT";
    case EVHTTP_REQ_PATCH:
      return "PATCH";
  }
  return "OTHER";
}

// Sends `reply` on the loop thread that owns `request`.
void Send(evhttp_request* request, HttpReply reply, std::atomic<int64_t>* open_exchanges) {
  evkeyvalq* headers = evhttp_request_get_output_headers(request);
  for (const auto& [name, value] : reply.headers) {
    evhttp_add_header(headers, name.c_str(), value.c_str());
  }
  auto* w = new WrittenReply{std::move(reply.body), std::move(reply.keep),
                             std::move(reply.on_written), 0, open_exchanges};
  evbuffer* out = evbuffer_new();
  w->pieces = (w->body.empty() ? 0 : 1);
  for (absl::string_view piece : reply.more_body) w->pieces += piece.empty() ? 0 : 1;
  const int pieces = w->pieces;
  if (out != nullptr && !w->body.empty()) {
    evbuffer_add_reference(out, w->body.data(), w->body.size(), PieceWritten, w);
  }
  for (absl::string_view piece : reply.more_body) {
    if (out != nullptr && !piece.empty()) {
      evbuffer_add_reference(out, piece.data(), piece.size(), PieceWritten, w);
    }
  }
  evhttp_send_reply(request, reply.status, ReasonPhrase(reply.status), out);
  if (out != nullptr) evbuffer_free(out);
  // Nothing referenced (or no buffer): the reply is as written as it gets.
  if (pieces == 0 || out == nullptr) ReplyWritten(w);
}

void SendQueued(evutil_socket_t, short, void* arg) {
  auto* loop = static_cast<HttpServer::Loop*>(arg);
  std::vector<std::pair<HttpExchange*, HttpReply>> ready;
  {
    base::MutexLock lock(&loop->mu);
    ready.swap(loop->ready);
  }
  for (auto& [exchange, reply] : ready) exchange->Reply(std::move(reply));
}

// A TLS connection: the bufferevent evhttp reads and writes through.
bufferevent* MakeTlsBufferevent(event_base* base, void* arg) {
  auto* ctx = static_cast<SSL_CTX*>(arg);
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr) {
    // evhttp then makes a plain bufferevent; OnRequest refuses to serve it.
    Log(LogLevel::kError, "http", "cannot make a TLS connection (SSL_new failed)");
    return nullptr;
  }
  bufferevent* bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                    BEV_OPT_CLOSE_ON_FREE);
  if (bev == nullptr) {
    SSL_free(ssl);
    return nullptr;
  }
  // Clients that close without TLS's close_notify are not an error.
  bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
  return bev;
}

// Every method reaches the handler, which answers 405 where it does not fit.
constexpr ev_uint16_t kAllMethods = EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                    EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
                                    EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH;

}  // namespace

HttpExchange::HttpExchange(HttpServer* server, int loop, evhttp_request* request)
    : server_(server), loop_(loop), request_(request) {
  method_ = MethodName(evhttp_request_get_command(request));
  const evhttp_uri* uri = evhttp_request_get_evhttp_uri(request);
  const char* path = uri == nullptr ? nullptr : evhttp_uri_get_path(uri);
  path_ = path == nullptr ? "" : path;
}

std::vector<absl::string_view> HttpExchange::Headers(absl::string_view name) const {
  std::vector<absl::string_view> values;
  const std::string wanted(name);
  evkeyvalq* headers = evhttp_request_get_input_headers(request_);
  for (evkeyval* h = headers->tqh_first; h != nullptr; h = h->next.tqe_next) {
    if (evutil_ascii_strcasecmp(h->key, wanted.c_str()) == 0) values.emplace_back(h->value);
  }
  return values;
}

absl::string_view HttpExchange::Body() {
  evbuffer* in = evhttp_request_get_input_buffer(request_);
  const size_t size = evbuffer_get_length(in);
  if (size == 0) return {};
  const unsigned char* data = evbuffer_pullup(in, -1);
  if (data == nullptr) return {};
  return {reinterpret_cast<const char*>(data), size};
}

size_t HttpExchange::BodySize() const {
  return evbuffer_get_length(evhttp_request_get_input_buffer(request_));
}

TakenBody HttpExchange::TakeBody(size_t prefix) {
  // The chains move to a buffer of the body's own (no copy), which the
  // request keeps until it is answered.
  std::shared_ptr<evbuffer> owned(evbuffer_new(), evbuffer_free);
  TakenBody body;
  if (owned == nullptr) return body;
  evbuffer* in = evhttp_request_get_input_buffer(request_);
  evbuffer_add_buffer(owned.get(), in);
  const size_t size = evbuffer_get_length(owned.get());
  prefix = std::min(prefix, size);
  if (prefix > 0) {
    const unsigned char* data = evbuffer_pullup(owned.get(), static_cast<ev_ssize_t>(prefix));
    if (data == nullptr) return body;
    body.prefix = {reinterpret_cast<const char*>(data), prefix};
  }
  if (size > prefix) {
    evbuffer_ptr at;
    evbuffer_ptr_set(owned.get(), &at, prefix, EVBUFFER_PTR_SET);
    const auto rest = static_cast<ev_ssize_t>(size - prefix);
    const int n = evbuffer_peek(owned.get(), rest, &at, nullptr, 0);
    std::vector<evbuffer_iovec> pieces(static_cast<size_t>(std::max(n, 0)));
    evbuffer_peek(owned.get(), rest, &at, pieces.data(), n);
    size_t left = size - prefix;
    for (const evbuffer_iovec& v : pieces) {
      const size_t len = std::min(left, v.iov_len);
      if (len == 0) break;
      body.rest.emplace_back(static_cast<const char*>(v.iov_base), len);
      left -= len;
    }
  }
  body.owner = std::move(owned);
  return body;
}

void HttpExchange::DropBody() {
  evbuffer* in = evhttp_request_get_input_buffer(request_);
  evbuffer_drain(in, evbuffer_get_length(in));
}

void HttpExchange::Reply(HttpReply reply) { server_->Post(this, std::move(reply)); }

HttpServer::HttpServer(const HttpServerOptions& options, Handler handler)
    : options_(options), handler_(std::move(handler)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              Handler handler) {
  // Once, before any event base: locks, so event_active and
  // event_base_loopbreak may be called from other threads.
  static const int threads_ready = evthread_use_pthreads();
  if (threads_ready != 0) return absl::InternalError("libevent: evthread_use_pthreads failed");
  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(handler)));
  if (absl::Status s = server->Listen(); !s.ok()) return s;
  if (absl::Status s = server->StartLoops(); !s.ok()) return s;
  return server;
}

absl::Status HttpServer::Listen() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(options_.port);
  const std::string where = absl::StrCat(options_.host, ":", options_.port);
  if (int rc = getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", where, ": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
      last_error = base::ErrnoText(errno);
      close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", where, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return absl::OkStatus();
}

absl::Status HttpServer::StartLoops() {
  const timeval timeout{static_cast<time_t>(options_.timeout.count()), 0};
  for (int i = 0; i < options_.threads; ++i) {
    auto loop = std::make_unique<Loop>();
    loop->server = this;
    loop->index = i;
    loop->base = event_base_new();
    loop->http = loop->base == nullptr ? nullptr : evhttp_new(loop->base);
    // Thread-safe: Stop disables it from another thread.
    loop->listener =
        loop->http == nullptr
            ? nullptr
            : evconnlistener_new(loop->base, nullptr, nullptr,
                                 LEV_OPT_CLOSE_ON_EXEC | LEV_OPT_THREADSAFE, 0, listen_fd_);
    loop->wake =
        loop->base == nullptr ? nullptr : event_new(loop->base, -1, 0, SendQueued, loop.get());
    if (loop->listener == nullptr || loop->wake == nullptr ||
        evhttp_bind_listener(loop->http, loop->listener) == nullptr) {
      loops_.push_back(std::move(loop));
      return absl::InternalError("libevent: cannot set up an HTTP event loop");
    }
    evhttp_set_max_body_size(loop->http, static_cast<ev_ssize_t>(options_.max_body_bytes));
    evhttp_set_max_headers_size(loop->http, static_cast<ev_ssize_t>(options_.max_header_bytes));
    evhttp_set_timeout_tv(loop->http, &timeout);
    evhttp_set_allowed_methods(loop->http, kAllMethods);
    // Replies name their own Content-Type; an empty one has none.
    evhttp_set_default_content_type(loop->http, nullptr);
    evhttp_set_gencb(loop->http, &HttpServer::OnRequest, loop.get());
    if (options_.tls != nullptr)
      evhttp_set_bevcb(loop->http, MakeTlsBufferevent, options_.tls.get());
    Loop* raw = loop.get();
    loop->thread = std::thread([raw] {
      raw->thread_id = std::this_thread::get_id();
      event_base_loop(raw->base, EVLOOP_NO_EXIT_ON_EMPTY);
    });
    loops_.push_back(std::move(loop));
  }
  return absl::OkStatus();
}

void HttpServer::OnRequest(evhttp_request* request, void* arg) {
  auto* loop = static_cast<Loop*>(arg);
  HttpServer* server = loop->server;
  if (server->options_.tls != nullptr) {
    // Only where MakeTlsBufferevent failed: never serve such a connection.
    bufferevent* bev = evhttp_connection_get_bufferevent(evhttp_request_get_connection(request));
    if (bufferevent_openssl_get_ssl(bev) == nullptr) {
      evhttp_send_error(request, 500, "no TLS");
      return;
    }
  }
  server->open_exchanges_.fetch_add(1);
  server->handler_(new HttpExchange(server, loop->index, request));
}

void HttpServer::Post(HttpExchange* exchange, HttpReply reply) {
  Loop& loop = *loops_[exchange->loop_];
  if (std::this_thread::get_id() == loop.thread_id.load()) {
    Send(exchange->request_, std::move(reply), &open_exchanges_);
    delete exchange;
    return;
  }
  {
    base::MutexLock lock(&loop.mu);
    if (loop.running) {
      loop.ready.emplace_back(exchange, std::move(reply));
      event_active(loop.wake, 0, 0);
      return;
    }
  }
  // The loop has stopped (Stop's deadline passed): the reply cannot be
  // sent; what it holds is given back.
  if (reply.on_written) reply.on_written();
  open_exchanges_.fetch_sub(1);
  delete exchange;
}

void HttpServer::Stop(std::chrono::steady_clock::time_point deadline) {
  if (stopped_) return;
  stopped_ = true;
  for (auto& loop : loops_) {
    if (loop->listener != nullptr) evconnlistener_disable(loop->listener);
  }
  while (open_exchanges_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (open_exchanges_.load() > 0) {
    Log(LogLevel::kWarning, "http",
        absl::StrCat(open_exchanges_.load(), " HTTP request(s) not answered before the deadline"));
  }
  for (auto& loop : loops_) {
    {
      base::MutexLock lock(&loop->mu);
      loop->running = false;
    }
    if (loop->base != nullptr) event_base_loopbreak(loop->base);
  }
  for (auto& loop : loops_) {
    if (loop->thread.joinable()) loop->thread.join();
    loop->thread_id = std::thread::id();
    // Replies queued after the loop's last turn.
    SendQueued(-1, 0, loop.get());
  }
  // Connections still waiting in the backlog are refused now.
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

HttpServer::~HttpServer() {
  Stop(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  // Connections still holding an exchange would free it under its owner:
  // then the loops are left as they are (the process is ending).
  const bool can_free = open_exchanges_.load() == 0;
  for (auto& loop : loops_) {
    if (can_free && loop->http != nullptr) evhttp_free(loop->http);  // its listener too
    if (can_free && loop->wake != nullptr) event_free(loop->wake);
    if (can_free && loop->base != nullptr) event_base_free(loop->base);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
}

}  // namespace numaserve::serving::http
