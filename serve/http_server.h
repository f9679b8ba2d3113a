// A small HTTP/1.1 server on POSIX sockets: one thread per connection (keep-alive, pipelining),
// Content-Length and chunked request bodies under a size limit, whole and streamed (chunked
// transfer encoding) responses, and a cheap check that a client hung up, so that a handler can
// cancel work for a client that is gone. No TLS: bind it to loopback or put a proxy in front.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace moeserve::serve {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query
  std::string query;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  // The value of a header (name in lower case), or nullptr.
  const std::string* header(std::string_view name) const;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// The reply side of one request, used on the connection's thread by the handler.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // A whole response. False if the client is gone.
  virtual bool respond(int status, std::string_view content_type, std::string_view body,
                       const HttpHeaders& extra_headers = {}) = 0;
  // A streamed response: begin once, then chunks, then end. False once the client is gone.
  virtual bool begin_stream(int status, std::string_view content_type, const HttpHeaders& extra_headers = {}) = 0;
  virtual bool send_chunk(std::string_view data) = 0;
  virtual bool end_stream() = 0;
  // True when the client closed its side of the connection (never blocks).
  virtual bool client_gone() = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpExchange&)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;  // 0: any free port (see HttpServer::port)
  size_t max_body_bytes = 8u << 20;
  size_t max_header_bytes = 64u << 10;
  int max_connections = 1024;
  // Deadlines are absolute, not reset by each byte, so that a client dribbling bytes (slowloris)
  // cannot hold a connection thread: idle from the end of the previous answer (or the accept) to
  // a request's first byte, header from that first byte to the end of its head (else 408).
  int idle_timeout_ms = 60000;    // a keep-alive connection with no new request is closed
  int header_timeout_ms = 10000;  // a request head not complete by then is answered 408
  int io_timeout_ms = 30000;      // a stalled read of a request body, or a stalled write
  // The body of errors the server answers itself (400, 408, 413, 431, 500, 503), e.g. OpenAI's JSON.
  std::function<std::string(int status, const std::string& message)> error_body;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // stop()s

  // Binds and listens (throws an Error naming host and port), then accepts on a thread.
  void start();
  int port() const { return port_; }
  // Stops accepting; connections finish the request they are serving and close.
  void stop_accepting();
  // stop_accepting(), then waits for every connection thread.
  void stop();
  int open_connections() const { return open_connections_.load(); }

 private:
  struct Connection;
  void accept_loop();
  void serve_connection(int fd);
  void reap_finished(bool all);

  HttpServerOptions options_;
  HttpHandler handler_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};  // a pipe that wakes the accept loop
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_connections_{0};
  std::thread accept_thread_;
  std::mutex connections_mutex_;
  std::vector<std::shared_ptr<Connection>> connections_;
};

// "200 OK", "404 Not Found", ...
std::string_view http_status_text(int status);

}  // namespace moeserve::serve
