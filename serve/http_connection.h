// One HTTP connection of serve::HttpServer, internal to it. Everything but the handler runs on
// the connection's strand (one io thread at a time): reading and parsing requests under their
// deadlines, writing the queued response bytes, closing. A handler runs on a HandlerPool thread
// and talks to the connection only through its output queue (enqueue) and client_gone().
//
//   accept -> kHead (deadline from the accept) -> kBody (body deadline) -> kHandling (handler
//   thread; the strand writes what it queues) -> kIdle (keep-alive: idle deadline until the
//   first byte, then kHead with a header deadline from it) ... -> kLingering (an error answer or
//   Connection: close: our side shut, the client's bytes read and dropped for a moment so that it
//   gets the answer) -> closed
#pragma once

#include <array>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "serve/handler_pool.h"
#include "serve/http_parse.h"
#include "serve/http_server.h"

namespace moeserve::serve {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Strand = asio::strand<asio::io_context::executor_type>;

class HttpConnection;

struct HttpServer::Context {
  Context(const HttpServerOptions& options, HttpHandler handler);

  const HttpServerOptions options;
  const HttpHandler handler;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> keep_running{io.get_executor()};
  Strand accept_strand{io.get_executor()};
  tcp::acceptor acceptor{accept_strand};
  asio::steady_timer accept_retry{accept_strand};  // after EMFILE: wait, then accept again
  HandlerPool handlers;
  std::vector<std::thread> io_threads;
  std::atomic<bool> stopping{false};
  std::atomic<int> handlers_running{0};

  void accept();
  void add(const std::shared_ptr<HttpConnection>& connection);
  void remove(HttpConnection* connection);
  int open_connections() const;
  // `what` on each open connection's strand.
  void for_each_connection(void (HttpConnection::*what)());

 private:
  void on_accept(const boost::system::error_code& ec, tcp::socket socket);
  mutable std::mutex mutex_;
  std::unordered_map<HttpConnection*, std::weak_ptr<HttpConnection>> connections_;
};

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(HttpServer::Context& server, tcp::socket socket);

  // Begins reading the first request (header deadline from now, the accept).
  void start();
  // Answers 503 (over the connection cap) and closes, within a second.
  void refuse();
  // Server stopping: closes now if no request is in progress (idle, or a head still coming).
  void drain();
  // Server stopped: closes now; a running handler sees its client gone.
  void abort();
  // Posts one of the above (drain, abort) to the connection's strand.
  void run_on_strand(void (HttpConnection::*what)());

  // From the handler thread: queues bytes to send; false once the connection is dead. Waits
  // while more than a bound is queued and unsent (backpressure).
  bool enqueue(std::string data);
  // From the handler thread: the client reset the connection or the server closed it. A FIN
  // alone is no proof (a client may shut its sending side and read the answer): a response not
  // begun yet gets one interim "100 Continue" as a probe, which HTTP/1.1 clients must accept.
  bool client_gone(bool may_probe, bool& probed);
  // From the handler thread: the handler returned; `reuse`: the connection may serve another.
  void handler_finished(bool reuse);

 private:
  enum class Phase { kIdle, kHead, kBody, kHandling, kLingering, kClosed };
  using Clock = std::chrono::steady_clock;

  void arm_deadline(Clock::time_point at);
  void disarm_deadline();
  void next_request();
  void read_more();
  void on_read(const boost::system::error_code& ec, size_t n);
  void on_bytes();
  void dispatch();
  void answer_error(int status, const std::string& message);
  void flush();
  void on_written(const boost::system::error_code& ec);
  void finish_response();
  void linger();
  void close();
  void mark_dead();

  HttpServer::Context& server_;
  tcp::socket socket_;
  const int fd_;  // socket_'s, for client_gone() on the handler thread (open until the handler is done)
  asio::steady_timer deadline_;
  const Clock::time_point accepted_at_;
  // Strand-only state.
  Phase phase_ = Phase::kHead;
  uint64_t deadline_id_ = 0;  // a deadline that fired after it was re-armed is stale
  bool timed_out_ = false;
  std::optional<RequestParser> parser_;
  std::string received_;  // bytes read and not yet consumed by a request
  std::array<char, 16384> read_buffer_;
  std::string writing_;  // the bytes of the write in progress
  bool write_in_progress_ = false;
  bool response_done_ = false;  // the handler (or an error answer) queued all it will
  bool reuse_ = false;
  int write_timeout_ms_;
  // Shared with the handler thread (under out_mutex_).
  std::mutex out_mutex_;
  std::condition_variable out_drained_;
  std::string outbox_;
  bool flush_posted_ = false;
  std::atomic<bool> dead_{false};
  std::atomic<bool> handler_running_{false};
};

}  // namespace moeserve::serve
