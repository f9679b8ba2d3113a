#include "serve/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "serve/http_parse.h"

namespace moeserve::serve {

namespace {

using http_parse::body_framing;
using http_parse::BodyFraming;
using http_parse::expects_continue;
using http_parse::keeps_alive;
using http_parse::MaybeFailure;
using http_parse::next_line;
using http_parse::parse_chunk_size;
using http_parse::parse_headers;
using http_parse::parse_request_line;
using http_parse::RequestFailure;
using Clock = std::chrono::steady_clock;

constexpr int kPollSliceMs = 100;             // how often a waiting connection checks for shutdown
constexpr size_t kMaxDrainBytes = 64u << 20;  // a too-large body is read and dropped up to this

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;  // EPIPE / ECONNRESET / EAGAIN after the send timeout
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Why reading a request stopped.
enum class ReadResult { kOk, kClosed, kTimeout, kStopping };

// Buffered reads from a connection with timeouts that keep an eye on the server stopping.
class SocketReader {
 public:
  SocketReader(int fd, const std::atomic<bool>& stopping) : fd_(fd), stopping_(stopping) {}

  std::string& buffer() { return buf_; }

  // Reads more bytes into the buffer, waiting until `deadline` at most. `idle`: no part of a
  // request read yet, so a stopping server may close the connection instead of waiting.
  ReadResult fill_until(Clock::time_point deadline, bool idle) {
    for (;;) {
      if (idle && stopping_.load()) return ReadResult::kStopping;
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, kPollSliceMs);
      if (ready < 0 && errno != EINTR) return ReadResult::kClosed;
      if (ready > 0) {
        char chunk[16384];
        const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return ReadResult::kClosed;
        buf_.append(chunk, static_cast<size_t>(n));
        return ReadResult::kOk;
      }
      if (Clock::now() >= deadline) return ReadResult::kTimeout;
    }
  }

  // A body read: it may take long as a whole, but each read must make progress in timeout_ms.
  ReadResult fill(int timeout_ms, bool idle) {
    return fill_until(Clock::now() + std::chrono::milliseconds(timeout_ms), idle);
  }

  // Reads until the buffer holds `n` bytes.
  ReadResult need(size_t n, int timeout_ms) {
    while (buf_.size() < n) {
      const ReadResult r = fill(timeout_ms, false);
      if (r != ReadResult::kOk) return r;
    }
    return ReadResult::kOk;
  }

  // Reads a CRLF-terminated line (without the CRLF) of at most max_len bytes.
  ReadResult line(std::string& out, size_t max_len, int timeout_ms, bool& too_long) {
    too_long = false;
    for (;;) {
      const size_t eol = buf_.find("\r\n");
      if (eol != std::string::npos) {
        out = buf_.substr(0, eol);
        buf_.erase(0, eol + 2);
        return ReadResult::kOk;
      }
      if (buf_.size() > max_len) {
        too_long = true;
        return ReadResult::kOk;
      }
      const ReadResult r = fill(timeout_ms, false);
      if (r != ReadResult::kOk) return r;
    }
  }

 private:
  int fd_;
  const std::atomic<bool>& stopping_;
  std::string buf_;
};

class SocketExchange final : public HttpExchange {
 public:
  // `http11`: the client speaks HTTP/1.1, so it must accept interim (1xx) responses.
  SocketExchange(int fd, bool keep_alive, bool http11 = false) : fd_(fd), keep_alive_(keep_alive), http11_(http11) {}

  bool responded() const { return state_ != State::kFresh; }
  bool healthy() const { return ok_ && state_ != State::kStreaming; }
  bool keep_alive() const { return keep_alive_; }
  // The answer (if any is still to come) says Connection: close, and the connection closes after it.
  void close_after() { keep_alive_ = false; }

  bool respond(int status, std::string_view content_type, std::string_view body,
               const HttpHeaders& extra_headers) override {
    if (state_ != State::kFresh) return false;
    state_ = State::kDone;
    std::string head = status_line(status, content_type, extra_headers);
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
    head.append(body);
    return ok_ = ok_ && write_all(fd_, head);
  }

  bool begin_stream(int status, std::string_view content_type, const HttpHeaders& extra_headers) override {
    if (state_ != State::kFresh) return false;
    state_ = State::kStreaming;
    std::string head = status_line(status, content_type, extra_headers);
    head += "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    return ok_ = ok_ && write_all(fd_, head);
  }

  bool send_chunk(std::string_view data) override {
    if (state_ != State::kStreaming || !ok_) return false;
    if (data.empty()) return true;  // an empty chunk would end the stream
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    std::string chunk = size;
    chunk.append(data);
    chunk += "\r\n";
    return ok_ = write_all(fd_, chunk);
  }

  bool end_stream() override {
    if (state_ != State::kStreaming) return false;
    state_ = State::kDone;
    return ok_ = ok_ && write_all(fd_, "0\r\n\r\n");
  }

  // The end of the client's sending side (FIN) is no proof that it is gone: a client may
  // shutdown(SHUT_WR) after its request and still read the answer. Only a reset or an error
  // is; a client that closed resets the connection when it is written to, which streams do
  // anyway, and a response not begun yet gets a probe for it: one interim 100 Continue, which
  // HTTP/1.1 clients must take before the final response.
  bool client_gone() override {
    if (!ok_) return true;
    pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP)) return !(ok_ = false);
    char byte;
    const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return !(ok_ = false);
    if (n == 0 && !probed_ && http11_ && state_ == State::kFresh) {
      probed_ = true;
      if (!write_all(fd_, "HTTP/1.1 100 Continue\r\n\r\n")) return !(ok_ = false);
    }
    return false;  // half-closed, or it sent more (a pipelined request): still there
  }

 private:
  enum class State { kFresh, kStreaming, kDone };

  std::string status_line(int status, std::string_view content_type, const HttpHeaders& extra) const {
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + std::string(http_status_text(status)) + "\r\n";
    head += "Content-Type: " + std::string(content_type) + "\r\n";
    head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    for (const auto& [name, value] : extra) head += name + ": " + value + "\r\n";
    return head;
  }

  int fd_;
  bool keep_alive_;
  bool http11_;
  bool probed_ = false;  // the 100 Continue probe of a half-closed client went out
  bool ok_ = true;
  State state_ = State::kFresh;
};

const RequestFailure kClosed{};

RequestFailure headers_too_large(const HttpServerOptions& options) {
  return {431, "request headers exceed " + std::to_string(options.max_header_bytes) + " bytes"};
}

RequestFailure body_too_large(const HttpServerOptions& options) {
  return {413, "request body exceeds " + std::to_string(options.max_body_bytes) + " bytes"};
}

// The head: request line and headers, up to the blank line (which is consumed, not returned).
// Both deadlines are absolute (see HttpServerOptions): a byte now and then extends neither.
MaybeFailure read_head(SocketReader& reader, const HttpServerOptions& options, std::string& head) {
  const Clock::time_point idle_deadline = Clock::now() + std::chrono::milliseconds(options.idle_timeout_ms);
  std::optional<Clock::time_point> head_deadline;  // from the request's first byte
  size_t head_end;
  for (;;) {
    if (!head_deadline && !reader.buffer().empty())
      head_deadline = Clock::now() + std::chrono::milliseconds(options.header_timeout_ms);
    head_end = reader.buffer().find("\r\n\r\n");
    if (head_end != std::string::npos) break;
    if (reader.buffer().size() > options.max_header_bytes) return headers_too_large(options);
    const ReadResult r = reader.fill_until(head_deadline.value_or(idle_deadline), !head_deadline);
    if (r == ReadResult::kTimeout && head_deadline)
      return RequestFailure{408,
                            "request headers not complete within " + std::to_string(options.header_timeout_ms) + " ms"};
    if (r != ReadResult::kOk) return kClosed;  // closed, idle too long, or the server stops
  }
  if (head_end > options.max_header_bytes) return headers_too_large(options);
  head = reader.buffer().substr(0, head_end);
  reader.buffer().erase(0, head_end + 4);
  return std::nullopt;
}

// Tells a client that waits for it (Expect: 100-continue) to send the body; false: it is gone.
bool send_continue(int fd, const HttpRequest& request) {
  return !expects_continue(request) || write_all(fd, "HTTP/1.1 100 Continue\r\n\r\n");
}

// A Transfer-Encoding: chunked body, at most max_body_bytes, trailers skipped.
MaybeFailure read_chunked_body(SocketReader& reader, const HttpServerOptions& options, int fd, HttpRequest& request) {
  const int io_ms = options.io_timeout_ms;
  if (!send_continue(fd, request)) return kClosed;
  for (;;) {
    std::string size_line;
    bool too_long = false;
    if (reader.line(size_line, 1024, io_ms, too_long) != ReadResult::kOk) return kClosed;
    const std::optional<uint64_t> size = too_long ? std::nullopt : parse_chunk_size(size_line);
    if (!size) return RequestFailure{400, "malformed chunked request body"};
    // Against what is left of the limit (the body never exceeds it), so no sum can wrap around.
    if (*size > options.max_body_bytes - request.body.size()) return body_too_large(options);
    if (*size == 0) {  // trailers, then the blank line
      std::string trailer;
      do {
        if (reader.line(trailer, options.max_header_bytes, io_ms, too_long) != ReadResult::kOk || too_long)
          return kClosed;
      } while (!trailer.empty());
      return std::nullopt;
    }
    const size_t n = static_cast<size_t>(*size);
    if (reader.need(n + 2, io_ms) != ReadResult::kOk) return kClosed;
    if (reader.buffer().compare(n, 2, "\r\n") != 0) return RequestFailure{400, "malformed chunked request body"};
    request.body.append(reader.buffer(), 0, n);
    reader.buffer().erase(0, n + 2);
  }
}

// A Content-Length body, at most max_body_bytes.
MaybeFailure read_sized_body(SocketReader& reader, const HttpServerOptions& options, int fd, uint64_t length,
                             HttpRequest& request) {
  const int io_ms = options.io_timeout_ms;
  if (length > options.max_body_bytes) {
    if (expects_continue(request)) return body_too_large(options);
    // Read what the client sends (up to a cap) so that it gets to read the answer.
    size_t left = static_cast<size_t>(std::min<uint64_t>(length, kMaxDrainBytes));
    while (left > 0) {
      const size_t take = std::min(left, reader.buffer().size());
      reader.buffer().erase(0, take);
      left -= take;
      if (left > 0 && reader.fill(io_ms, false) != ReadResult::kOk) break;
    }
    return body_too_large(options);
  }
  if (!send_continue(fd, request)) return kClosed;
  if (reader.need(static_cast<size_t>(length), io_ms) != ReadResult::kOk) return kClosed;
  request.body = reader.buffer().substr(0, length);
  reader.buffer().erase(0, length);
  return std::nullopt;
}

// What the connection learnt of the client from a request's head.
struct ClientTraits {
  bool keep_alive = false;
  bool http11 = false;
};

// One whole request off the connection: head, then the body (chunked, sized or none).
MaybeFailure read_request(SocketReader& reader, const HttpServerOptions& options, int fd, HttpRequest& request,
                          ClientTraits& client) {
  std::string head;
  if (MaybeFailure failure = read_head(reader, options, head)) return failure;
  std::string_view rest(head);
  std::string_view version;
  if (MaybeFailure failure = parse_request_line(next_line(rest), request, version)) return failure;
  if (MaybeFailure failure = parse_headers(rest, request)) return failure;
  client = {keeps_alive(request, version), version == "HTTP/1.1"};
  BodyFraming framing;
  if (MaybeFailure failure = body_framing(request, framing)) return failure;
  if (framing.chunked) return read_chunked_body(reader, options, fd, request);
  if (framing.length) return read_sized_body(reader, options, fd, *framing.length, request);
  return std::nullopt;
}

// read_request, where an exception (a defect that the checks above missed, or memory running
// out) answers 400 instead of escaping the connection thread, which would end the process.
MaybeFailure read_request_guarded(SocketReader& reader, const HttpServerOptions& options, int fd, HttpRequest& request,
                                  ClientTraits& client) {
  try {
    return read_request(reader, options, fd, request, client);
  } catch (...) {
    return RequestFailure{400, "malformed HTTP request"};
  }
}

// The error body, and a plain one should making it fail (e.g. a message that is not UTF-8).
std::string error_body(const HttpServerOptions& options, int status, const std::string& message) {
  try {
    return options.error_body(status, message);
  } catch (...) {
    return options.error_body(status, std::string(http_status_text(status)));
  }
}

// Runs the handler; whatever it throws is answered 500 (if no answer began) and closes the
// connection. False: the connection must close.
bool run_handler(const HttpHandler& handler, const HttpServerOptions& options, const HttpRequest& request,
                 SocketExchange& exchange) {
  std::optional<std::string> failure;  // what it threw
  try {
    handler(request, exchange);
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "the handler failed";
  }
  if (failure) exchange.close_after();
  if (!exchange.responded())
    exchange.respond(500, "application/json",
                     error_body(options, 500, failure.value_or("the handler sent no response")), {});
  return !failure && exchange.healthy() && exchange.keep_alive();
}

}  // namespace

struct HttpServer::Connection {
  std::thread thread;
  std::atomic<bool> done{false};
};

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {
  if (!options_.error_body) options_.error_body = [](int, const std::string& message) { return message + "\n"; };
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options_.port);
  const int rc = ::getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &found);
  MS_CHECK(rc == 0, "--host {}: {}", options_.host, gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
    } else {
      last_error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  MS_CHECK(listen_fd_ >= 0, "cannot listen on {}:{}: {}", options_.host, options_.port, last_error);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  MS_CHECK(::pipe2(wake_fd_, O_CLOEXEC) == 0, "pipe: {}", std::strerror(errno));
  accept_thread_ = std::thread([this] { accept_loop(); });
}

void HttpServer::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    const int ready = ::poll(fds, 2, 1000);
    if (stopping_.load()) return;
    reap_finished(false);
    if (ready <= 0 || !(fds[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    timeval send_timeout{options_.io_timeout_ms / 1000, (options_.io_timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    if (open_connections_.load() >= options_.max_connections) {
      SocketExchange busy(fd, false);
      busy.respond(503, "application/json", error_body(options_, 503, "too many open connections"), {});
      ::close(fd);
      continue;
    }
    ++open_connections_;
    auto connection = std::make_shared<Connection>();
    connection->thread = std::thread([this, fd, connection] {
      try {
        serve_connection(fd);
      } catch (...) {  // the last guard (an answer failed): close the connection, keep the process
      }
      ::close(fd);
      --open_connections_;
      connection->done = true;
    });
    std::lock_guard<std::mutex> lock(connections_mutex_);
    connections_.push_back(std::move(connection));
  }
}

void HttpServer::reap_finished(bool all) {
  std::vector<std::shared_ptr<Connection>> finished;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    auto keep = std::partition(connections_.begin(), connections_.end(),
                               [&](const auto& c) { return !(all || c->done.load()); });
    finished.assign(keep, connections_.end());
    connections_.erase(keep, connections_.end());
  }
  for (auto& c : finished) c->thread.join();
}

void HttpServer::stop_accepting() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_[1], &byte, 1);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void HttpServer::stop() {
  stop_accepting();
  reap_finished(true);
  for (int& fd : wake_fd_)
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
}

void HttpServer::serve_connection(int fd) {
  SocketReader reader(fd, stopping_);
  for (;;) {
    HttpRequest request;
    ClientTraits client;
    if (const MaybeFailure failure = read_request_guarded(reader, options_, fd, request, client)) {
      if (failure->status != 0) {  // answered, then closed: what follows cannot be framed
        SocketExchange ex(fd, false);
        ex.respond(failure->status, "application/json", error_body(options_, failure->status, failure->message), {});
      }
      return;
    }
    SocketExchange exchange(fd, client.keep_alive && !stopping_.load(), client.http11);
    if (!run_handler(handler_, options_, request, exchange)) return;
  }
}

}  // namespace moeserve::serve
