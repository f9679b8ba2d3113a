#include "serve/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "core/error.h"

namespace moeserve::serve {

namespace {

constexpr int kPollSliceMs = 100;             // how often a waiting connection checks for shutdown
constexpr size_t kMaxDrainBytes = 64u << 20;  // a too-large body is read and dropped up to this

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

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

  // Reads more bytes into the buffer. `idle`: no part of a request read yet, so a stopping
  // server may close the connection instead of waiting.
  ReadResult fill(int timeout_ms, bool idle) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
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
      if (std::chrono::steady_clock::now() >= deadline) return ReadResult::kTimeout;
    }
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
  SocketExchange(int fd, bool keep_alive) : fd_(fd), keep_alive_(keep_alive) {}

  bool responded() const { return state_ != State::kFresh; }
  bool healthy() const { return ok_ && state_ != State::kStreaming; }
  bool keep_alive() const { return keep_alive_; }

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

  bool client_gone() override {
    if (!ok_) return true;
    pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) return !(ok_ = false);
    char byte;
    const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return !(ok_ = false);
    return false;  // the client sent more (a pipelined request): still there
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
  bool ok_ = true;
  State state_ = State::kFresh;
};

// Why a request was not read whole: an error to answer (status > 0), or nothing to send
// (status 0: the client closed or stalled, or the server stops).
struct RequestFailure {
  int status = 0;
  std::string message;
};
using MaybeFailure = std::optional<RequestFailure>;
const RequestFailure kClosed{};

RequestFailure headers_too_large(const HttpServerOptions& options) {
  return {431, "request headers exceed " + std::to_string(options.max_header_bytes) + " bytes"};
}

RequestFailure body_too_large(const HttpServerOptions& options) {
  return {413, "request body exceeds " + std::to_string(options.max_body_bytes) + " bytes"};
}

// The head: request line and headers, up to the blank line (which is consumed, not returned).
MaybeFailure read_head(SocketReader& reader, const HttpServerOptions& options, std::string& head) {
  size_t head_end;
  bool idle = reader.buffer().empty();
  for (;;) {
    head_end = reader.buffer().find("\r\n\r\n");
    if (head_end != std::string::npos) break;
    if (reader.buffer().size() > options.max_header_bytes) return headers_too_large(options);
    const ReadResult r = reader.fill(idle ? options.idle_timeout_ms : options.io_timeout_ms, idle);
    if (r != ReadResult::kOk) return kClosed;  // closed, idle too long, or the server stops
    idle = false;
  }
  if (head_end > options.max_header_bytes) return headers_too_large(options);
  head = reader.buffer().substr(0, head_end);
  reader.buffer().erase(0, head_end + 4);
  return std::nullopt;
}

// Splits the next CRLF-terminated line off `rest`.
std::string_view next_line(std::string_view& rest) {
  const size_t eol = rest.find("\r\n");
  const std::string_view line = rest.substr(0, eol);
  rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 2);
  return line;
}

// The request line into request.method, .path and .query; `version` views into `line`.
MaybeFailure parse_request_line(std::string_view line, HttpRequest& request, std::string_view& version) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return RequestFailure{400, "malformed HTTP request line"};
  request.method = std::string(line.substr(0, sp1));
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  version = line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return RequestFailure{505, "unsupported HTTP version"};
  if (request.method.empty() || target.empty() || target.front() != '/')
    return RequestFailure{400, "malformed HTTP request target"};
  const size_t q = target.find('?');
  request.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) request.query = std::string(target.substr(q + 1));
  return std::nullopt;
}

// The header lines after the request line, names lower-cased, values trimmed.
MaybeFailure parse_headers(std::string_view rest, HttpRequest& request) {
  while (!rest.empty()) {
    const std::string_view line = next_line(rest);
    const size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos || line.front() == ' ' || line.front() == '\t')
      return RequestFailure{400, "malformed HTTP header line"};
    request.headers.emplace_back(lower(line.substr(0, colon)), std::string(trim(line.substr(colon + 1))));
  }
  return std::nullopt;
}

// HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 closes it unless told to keep it.
bool keeps_alive(const HttpRequest& request, std::string_view version) {
  const std::string* connection = request.header("connection");
  const std::string value = connection ? lower(*connection) : "";
  return version == "HTTP/1.1" ? value.find("close") == std::string::npos
                               : value.find("keep-alive") != std::string::npos;
}

bool expects_continue(const HttpRequest& request) {
  const std::string* expect = request.header("expect");
  return expect && lower(*expect) == "100-continue";
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
    char* end = nullptr;
    const unsigned long long size = std::strtoull(size_line.c_str(), &end, 16);
    if (too_long || end == size_line.c_str()) return RequestFailure{400, "malformed chunked request body"};
    if (request.body.size() + size > options.max_body_bytes) return body_too_large(options);
    if (size == 0) {  // trailers, then the blank line
      std::string trailer;
      do {
        if (reader.line(trailer, options.max_header_bytes, io_ms, too_long) != ReadResult::kOk || too_long)
          return kClosed;
      } while (!trailer.empty());
      return std::nullopt;
    }
    if (reader.need(size + 2, io_ms) != ReadResult::kOk) return kClosed;
    if (reader.buffer().compare(size, 2, "\r\n") != 0) return RequestFailure{400, "malformed chunked request body"};
    request.body.append(reader.buffer(), 0, size);
    reader.buffer().erase(0, size + 2);
  }
}

// A Content-Length body, at most max_body_bytes.
MaybeFailure read_sized_body(SocketReader& reader, const HttpServerOptions& options, int fd,
                             const std::string& content_length, HttpRequest& request) {
  const int io_ms = options.io_timeout_ms;
  char* end = nullptr;
  const unsigned long long length = std::strtoull(content_length.c_str(), &end, 10);
  if (content_length.empty() || *end != '\0' || !std::isdigit(static_cast<unsigned char>(content_length[0])))
    return RequestFailure{400, "malformed Content-Length"};
  if (length > options.max_body_bytes) {
    if (expects_continue(request)) return body_too_large(options);
    // Read what the client sends (up to a cap) so that it gets to read the answer.
    size_t left = static_cast<size_t>(std::min<unsigned long long>(length, kMaxDrainBytes));
    while (left > 0) {
      const size_t take = std::min(left, reader.buffer().size());
      reader.buffer().erase(0, take);
      left -= take;
      if (left > 0 && reader.fill(io_ms, false) != ReadResult::kOk) break;
    }
    return body_too_large(options);
  }
  if (!send_continue(fd, request)) return kClosed;
  if (reader.need(length, io_ms) != ReadResult::kOk) return kClosed;
  request.body = reader.buffer().substr(0, length);
  reader.buffer().erase(0, length);
  return std::nullopt;
}

// One whole request off the connection: head, then the body (chunked, sized or none).
MaybeFailure read_request(SocketReader& reader, const HttpServerOptions& options, int fd, HttpRequest& request,
                          bool& keep_alive) {
  std::string head;
  if (MaybeFailure failure = read_head(reader, options, head)) return failure;
  std::string_view rest(head);
  std::string_view version;
  if (MaybeFailure failure = parse_request_line(next_line(rest), request, version)) return failure;
  if (MaybeFailure failure = parse_headers(rest, request)) return failure;
  keep_alive = keeps_alive(request, version);
  if (const std::string* transfer_encoding = request.header("transfer-encoding")) {
    if (lower(*transfer_encoding) != "chunked") return RequestFailure{501, "unsupported Transfer-Encoding"};
    return read_chunked_body(reader, options, fd, request);
  }
  if (const std::string* content_length = request.header("content-length"))
    return read_sized_body(reader, options, fd, *content_length, request);
  return std::nullopt;
}

}  // namespace

std::string_view http_status_text(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [n, v] : headers)
    if (n == name) return &v;
  return nullptr;
}

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
      busy.respond(503, "application/json", options_.error_body(503, "too many open connections"), {});
      ::close(fd);
      continue;
    }
    ++open_connections_;
    auto connection = std::make_shared<Connection>();
    connection->thread = std::thread([this, fd, connection] {
      serve_connection(fd);
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
    bool keep_alive = false;
    if (const MaybeFailure failure = read_request(reader, options_, fd, request, keep_alive)) {
      if (failure->status != 0) {
        SocketExchange ex(fd, false);
        ex.respond(failure->status, "application/json", options_.error_body(failure->status, failure->message), {});
      }
      return;
    }
    SocketExchange exchange(fd, keep_alive && !stopping_.load());
    try {
      handler_(request, exchange);
    } catch (const std::exception& e) {
      if (!exchange.responded()) exchange.respond(500, "application/json", options_.error_body(500, e.what()), {});
    }
    if (!exchange.responded())
      exchange.respond(500, "application/json", options_.error_body(500, "the handler sent no response"), {});
    if (!exchange.healthy() || !exchange.keep_alive()) return;
  }
}

}  // namespace moeserve::serve
