// The HTTP/1.1 server on Boost.Beast over Asio: a small fixed pool of io threads reads and
// writes every connection asynchronously (keep-alive, pipelining); request framing is Beast's
// parser with our stricter checks (serve/http_parse.h). Each complete request runs its handler
// on a handler thread (serve/handler_pool.h), never on an io thread, so that a long completion
// or an SSE stream does not stall other connections; the handler's writes go to the connection's
// queue, which its io thread sends. Idle and slow clients cost a socket and a timer, no thread.
// No TLS: bind it to loopback or put a proxy in front.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
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

// The reply side of one request, used on the handler's thread. A write queues the bytes for the
// connection's io thread and returns (it waits only while much is queued: a client that does not
// read holds back its own handler, nobody else).
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
  // Open connections; one more is answered 503 and closed. Lowered at start() to what the
  // process's open-file limit allows (after raising its soft limit to the hard one).
  int max_connections = 8192;
  int io_threads = 2;              // the fixed pool that does all socket work
  int max_handler_threads = 1024;  // requests handled at once; more wait for a free handler thread
  // Deadlines are absolute, not reset by each byte, so that a client dribbling bytes (slowloris)
  // holds nothing for long: idle from the end of the previous answer to a keep-alive request's
  // first byte (then closed), header from the accept (a new connection) or from that first byte
  // to the end of the head (else 408), body from the end of the head to the end of the body (408).
  int idle_timeout_ms = 60000;
  int header_timeout_ms = 10000;
  int body_timeout_ms = 30000;
  int io_timeout_ms = 30000;  // each write of queued response bytes (a client that stopped reading)
  // The body of errors the server answers itself (400, 408, 413, 431, 500, 503), e.g. OpenAI's JSON.
  std::function<std::string(int status, const std::string& message)> error_body;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // stop()s

  // Binds and listens (throws an Error naming host and port), then starts the io threads.
  void start();
  int port() const { return port_; }
  // Stops accepting and closes every connection that is idle or still sending a head; the
  // others finish the request they are on and close.
  void stop_accepting();
  // stop_accepting(), waits up to `grace` for the requests in flight to be answered, then closes
  // every connection (a handler still running sees its client gone) and joins every thread.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(2));
  int open_connections() const;
  // The most connections start() allows (max_connections after the open-file limit).
  int max_connections() const { return options_.max_connections; }

  struct Context;  // what the connections share (serve/http_connection.h)

 private:
  HttpServerOptions options_;
  HttpHandler handler_;
  int port_ = 0;
  std::shared_ptr<Context> context_;
};

}  // namespace moeserve::serve
