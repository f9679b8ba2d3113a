#include "serve/http_connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>

#include "serve/http_exchange.h"

namespace moeserve::serve {

namespace {

constexpr size_t kMaxQueuedBytes = 1u << 20;  // a handler waits while more than this is unsent
constexpr int kLingerMs = 1000;               // how long a closing connection reads and drops bytes
constexpr int kRefuseTimeoutMs = 1000;        // the whole life of a connection refused with 503
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

}  // namespace

HttpConnection::HttpConnection(HttpServer::Context& server, tcp::socket socket)
    : server_(server),
      socket_(std::move(socket)),
      fd_(socket_.native_handle()),
      deadline_(socket_.get_executor()),
      accepted_at_(Clock::now()),
      write_timeout_ms_(server.options.io_timeout_ms) {}

void HttpConnection::start() {
  asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
    self->parser_.emplace(HttpLimits{self->server_.options.max_header_bytes, self->server_.options.max_body_bytes});
    self->phase_ = Phase::kHead;
    self->arm_deadline(self->accepted_at_ + std::chrono::milliseconds(self->server_.options.header_timeout_ms));
    self->read_more();
  });
}

void HttpConnection::refuse() {
  asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
    self->write_timeout_ms_ = kRefuseTimeoutMs;
    self->answer_error(503, "too many open connections");
  });
}

void HttpConnection::drain() {
  if (phase_ == Phase::kIdle || phase_ == Phase::kHead) close();
}

void HttpConnection::abort() {
  mark_dead();
  if (!handler_running_.load()) return close();
  // The handler thread may still poll the socket: shut it (which wakes the poll), close it later.
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.cancel(ignored);
}

void HttpConnection::run_on_strand(void (HttpConnection::*what)()) {
  asio::post(socket_.get_executor(), [self = shared_from_this(), what] { ((*self).*what)(); });
}

// ---- deadlines: one timer; its expiry cancels the socket's operations, which then see timed_out_

void HttpConnection::arm_deadline(Clock::time_point at) {
  const uint64_t id = ++deadline_id_;
  timed_out_ = false;
  deadline_.expires_at(at);
  deadline_.async_wait([self = shared_from_this(), id](const boost::system::error_code& ec) {
    if (ec || id != self->deadline_id_ || self->phase_ == Phase::kClosed) return;
    self->timed_out_ = true;
    boost::system::error_code ignored;
    self->socket_.cancel(ignored);
  });
}

void HttpConnection::disarm_deadline() {
  ++deadline_id_;
  deadline_.cancel();
}

// ---- reading a request

void HttpConnection::next_request() {
  parser_.emplace(HttpLimits{server_.options.max_header_bytes, server_.options.max_body_bytes});
  if (!received_.empty()) {  // pipelined: its head began already
    phase_ = Phase::kHead;
    arm_deadline(Clock::now() + std::chrono::milliseconds(server_.options.header_timeout_ms));
    return on_bytes();
  }
  phase_ = Phase::kIdle;
  arm_deadline(Clock::now() + std::chrono::milliseconds(server_.options.idle_timeout_ms));
  read_more();
}

void HttpConnection::read_more() {
  socket_.async_read_some(asio::buffer(read_buffer_), [self = shared_from_this()](const boost::system::error_code& ec,
                                                                                  size_t n) { self->on_read(ec, n); });
}

void HttpConnection::on_read(const boost::system::error_code& ec, size_t n) {
  if (phase_ == Phase::kLingering) {
    if (ec) return close();  // the client closed, or the linger time is up
    return read_more();      // dropped
  }
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    if (timed_out_ && phase_ == Phase::kHead)
      return answer_error(
          408, "request headers not complete within " + std::to_string(server_.options.header_timeout_ms) + " ms");
    if (timed_out_ && phase_ == Phase::kBody)
      return answer_error(
          408, "request body not complete within " + std::to_string(server_.options.body_timeout_ms) + " ms");
    return close();  // closed, reset, idle too long, or the server stops
  }
  received_.append(read_buffer_.data(), n);
  if (phase_ == Phase::kIdle) {  // a keep-alive request's first byte: its head has the header time from now
    phase_ = Phase::kHead;
    arm_deadline(Clock::now() + std::chrono::milliseconds(server_.options.header_timeout_ms));
  }
  on_bytes();
}

void HttpConnection::on_bytes() {
  const bool had_head = parser_->header_done();
  const RequestParser::Progress progress = parser_->feed(received_);
  received_.erase(0, progress.consumed);
  if (progress.state == RequestParser::State::kFailed)
    return answer_error(parser_->failure().status, parser_->failure().message);
  if (!had_head && parser_->header_done()) {
    phase_ = Phase::kBody;
    arm_deadline(Clock::now() + std::chrono::milliseconds(server_.options.body_timeout_ms));
    if (progress.state != RequestParser::State::kDone && parser_->expects_continue()) enqueue(std::string(kContinue));
  }
  if (progress.state == RequestParser::State::kDone) return dispatch();
  read_more();
}

// ---- handling: the handler on a handler thread, its bytes through the queue

void HttpConnection::dispatch() {
  disarm_deadline();
  phase_ = Phase::kHandling;
  response_done_ = false;
  const bool keep_alive = parser_->keep_alive() && !server_.stopping.load();
  const bool http11 = parser_->http11();
  handler_running_ = true;
  ++server_.handlers_running;
  server_.handlers.post([self = shared_from_this(), request = parser_->take_request(), keep_alive, http11]() mutable {
    HttpExchangeImpl exchange(*self, keep_alive, http11);
    const bool reuse = run_handler(self->server_.handler, self->server_.options, request, exchange);
    self->handler_finished(reuse);
  });
}

void HttpConnection::handler_finished(bool reuse) {
  asio::post(socket_.get_executor(), [self = shared_from_this(), reuse] {
    self->handler_running_ = false;
    --self->server_.handlers_running;
    self->response_done_ = true;
    self->reuse_ = reuse;
    if (self->dead_.load()) return self->close();
    self->flush();
  });
}

// An answer of the server's own (a failed request, 503 over the cap): then the connection closes.
void HttpConnection::answer_error(int status, const std::string& message) {
  disarm_deadline();
  phase_ = Phase::kHandling;
  response_done_ = true;
  reuse_ = false;
  enqueue(whole_response(status, "application/json", error_body(server_.options, status, message), false, {}));
}

bool HttpConnection::enqueue(std::string data) {
  std::unique_lock<std::mutex> lock(out_mutex_);
  if (dead_.load()) return false;
  outbox_ += data;
  if (!flush_posted_) {
    flush_posted_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->flush(); });
  }
  // Only a handler thread waits here; the strand's own answers are small and never do.
  out_drained_.wait(lock, [this] { return dead_.load() || outbox_.size() <= kMaxQueuedBytes; });
  return !dead_.load();
}

void HttpConnection::flush() {
  if (write_in_progress_ || phase_ == Phase::kClosed || phase_ == Phase::kLingering) return;
  {
    std::lock_guard<std::mutex> lock(out_mutex_);
    flush_posted_ = false;
    writing_.swap(outbox_);
    outbox_.clear();
  }
  out_drained_.notify_all();
  if (writing_.empty()) return finish_response();
  write_in_progress_ = true;
  // While a body is read, its deadline covers the 100 Continue too; else each write has its own.
  if (phase_ == Phase::kHandling) arm_deadline(Clock::now() + std::chrono::milliseconds(write_timeout_ms_));
  asio::async_write(socket_, asio::buffer(writing_),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) { self->on_written(ec); });
}

void HttpConnection::on_written(const boost::system::error_code& ec) {
  write_in_progress_ = false;
  writing_.clear();
  if (ec) {
    mark_dead();
    if (!handler_running_.load()) close();
    return;
  }
  if (phase_ == Phase::kHandling) disarm_deadline();
  flush();
}

// All of a response is sent: the next request, or the close.
void HttpConnection::finish_response() {
  if (phase_ != Phase::kHandling || !response_done_) return;
  if (reuse_ && !server_.stopping.load()) return next_request();
  linger();
}

void HttpConnection::linger() {
  phase_ = Phase::kLingering;
  mark_dead();
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  arm_deadline(Clock::now() + std::chrono::milliseconds(kLingerMs));
  read_more();
}

void HttpConnection::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  mark_dead();
  disarm_deadline();
  boost::system::error_code ignored;
  socket_.close(ignored);
  server_.remove(this);
}

void HttpConnection::mark_dead() {
  {
    std::lock_guard<std::mutex> lock(out_mutex_);
    dead_ = true;
  }
  out_drained_.notify_all();
}

bool HttpConnection::client_gone(bool may_probe, bool& probed) {
  if (dead_.load()) return true;
  // The fd stays open while the handler runs (abort() only shuts it), so polling it here is safe.
  const int fd = fd_;
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  if (n == 0 && may_probe) {
    probed = true;
    return !enqueue(std::string(kContinue));
  }
  return false;  // half-closed, or it sent more (a pipelined request): still there
}

}  // namespace moeserve::serve
