// The HTTP layer over real sockets: keep-alive, chunked bodies, limits, streaming, noticing a
// client that hung up, and the hardening against hostile clients (framing, overflow, slowloris).
#include "serve/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace moeserve::serve {
namespace {

class Client {
 public:
  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval timeout{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~Client() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void send(const std::string& data) {
    ASSERT_EQ(::send(fd_, data.data(), data.size(), MSG_NOSIGNAL), (ssize_t)data.size());
  }
  // A send that may fail (the server closed): for clients that misbehave on purpose.
  bool try_send(const std::string& data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == (ssize_t)data.size();
  }
  void shutdown_write() { ASSERT_EQ(::shutdown(fd_, SHUT_WR), 0); }
  // Reads until `marker` appears (or the peer closes); returns everything read.
  std::string read_until(const std::string& marker) {
    while (buffer_.find(marker) == std::string::npos) {
      char chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) break;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
    std::string out;
    const size_t at = buffer_.find(marker);
    const size_t end = at == std::string::npos ? buffer_.size() : at + marker.size();
    out = buffer_.substr(0, end);
    buffer_.erase(0, end);
    return out;
  }
  bool peer_closed() {
    char c;
    return ::recv(fd_, &c, 1, 0) == 0;
  }

 private:
  int fd_ = -1;
  std::string buffer_;
};

struct Fixture {
  std::atomic<bool> saw_gone{false};
  HttpServer server;
  explicit Fixture(size_t max_body = 1024, int header_timeout_ms = 10000,
                   const std::function<void(HttpServerOptions&)>& tweak = {})
      : server(
            [&] {
              HttpServerOptions o;
              o.host = "127.0.0.1";
              o.port = 0;
              o.max_body_bytes = max_body;
              o.header_timeout_ms = header_timeout_ms;
              if (tweak) tweak(o);
              o.error_body = [](int status, const std::string& m) {
                return "{\"status\":" + std::to_string(status) + ",\"message\":\"" + m + "\"}";
              };
              return o;
            }(),
            [this](const HttpRequest& r, HttpExchange& ex) { handle(r, ex); }) {
    server.start();
  }
  void handle(const HttpRequest& r, HttpExchange& ex) {
    if (r.path == "/echo") {
      const std::string* custom = r.header("x-custom");
      ex.respond(200, "text/plain", r.method + " " + r.body + " " + (custom ? *custom : "-") + " " + r.query);
    } else if (r.path == "/stream") {
      ex.begin_stream(200, "text/event-stream");
      ex.send_chunk("data: one\n\n");
      ex.send_chunk("data: two\n\n");
      ex.end_stream();
    } else if (r.path == "/wait-for-hangup") {
      ex.begin_stream(200, "text/event-stream");
      ex.send_chunk("data: started\n\n");
      // Like a real stream, it keeps writing: a closed client answers a write with a reset.
      for (int i = 0; i < 500 && !ex.client_gone(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        ex.send_chunk(": waiting\n\n");
      }
      saw_gone = ex.client_gone();
    } else if (r.path == "/collect") {  // like a non-streamed completion: waits, watching the client
      for (int i = 0; i < 30; ++i) {
        if (ex.client_gone()) {
          saw_gone = true;
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ex.respond(200, "text/plain", "collected");
    } else if (r.path == "/sleep") {  // like a long completion: holds its handler thread
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(r.query)));
      ex.respond(200, "text/plain", "slept");
    } else if (r.path == "/throw") {
      throw std::runtime_error("boom");
    } else if (r.path == "/throw-int") {
      throw 42;  // not a std::exception
    }
  }
};

TEST(HttpServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  Fixture f;
  Client c(f.server.port());
  for (int i = 0; i < 3; ++i) {
    const std::string body = "hello" + std::to_string(i);
    c.send("POST /echo?x=1 HTTP/1.1\r\nHost: a\r\nX-Custom: v\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body);
    const std::string reply = c.read_until(body + " v x=1");
    EXPECT_NE(reply.find("HTTP/1.1 200 OK"), std::string::npos) << reply;
    EXPECT_NE(reply.find("Connection: keep-alive"), std::string::npos);
  }
}

TEST(HttpServer, PipelinedRequestsAndChunkedBodies) {
  Fixture f;
  Client c(f.server.port());
  c.send(
      "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
      "GET /echo HTTP/1.1\r\n\r\n");
  EXPECT_NE(c.read_until("POST abcde - ").find("200 OK"), std::string::npos);
  EXPECT_NE(c.read_until("GET  - ").find("200 OK"), std::string::npos);
}

TEST(HttpServer, OversizeBodyIs413AndMalformedRequestsAre400) {
  Fixture f(16);
  {
    Client c(f.server.port());
    c.send("POST /echo HTTP/1.1\r\nContent-Length: 40\r\n\r\n0123456789012345678901234567890123456789");
    const std::string reply = c.read_until("}");
    EXPECT_NE(reply.find("413 Payload Too Large"), std::string::npos) << reply;
    EXPECT_NE(reply.find("exceeds 16 bytes"), std::string::npos) << reply;
  }
  {
    Client c(f.server.port());
    c.send("POST /echo HTTP/1.1\r\nContent-Length: 40\r\nExpect: 100-continue\r\n\r\n");
    EXPECT_NE(c.read_until("}").find("413"), std::string::npos);  // refused before the body is sent
  }
  {
    Client c(f.server.port());
    c.send("NONSENSE\r\n\r\n");
    EXPECT_NE(c.read_until("}").find("400 Bad Request"), std::string::npos);
    EXPECT_TRUE(c.peer_closed());
  }
  {
    Client c(f.server.port());
    c.send("POST /echo HTTP/1.1\r\nContent-Length: -3\r\n\r\n");
    EXPECT_NE(c.read_until("}").find("400"), std::string::npos);
  }
  {
    Client c(f.server.port());
    c.send("GET /throw HTTP/1.1\r\n\r\n");
    const std::string reply = c.read_until("}");
    EXPECT_NE(reply.find("500"), std::string::npos);
    EXPECT_NE(reply.find("boom"), std::string::npos);
  }
}

TEST(HttpServer, StreamsChunks) {
  Fixture f;
  Client c(f.server.port());
  c.send("GET /stream HTTP/1.1\r\n\r\n");
  const std::string reply = c.read_until("0\r\n\r\n");
  EXPECT_NE(reply.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(reply.find("b\r\ndata: one\n\n\r\n"), std::string::npos) << reply;
  EXPECT_NE(reply.find("b\r\ndata: two\n\n\r\n"), std::string::npos) << reply;
}

TEST(HttpServer, HandlerSeesAClientThatHungUp) {
  Fixture f;
  {
    Client c(f.server.port());
    c.send("GET /wait-for-hangup HTTP/1.1\r\n\r\n");
    c.read_until("started");
  }  // closes
  for (int i = 0; i < 300 && !f.saw_gone; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(f.saw_gone.load());
}

TEST(HttpServer, StopClosesIdleConnectionsAndRefusesNewOnes) {
  Fixture f;
  Client idle(f.server.port());
  idle.send("GET /echo HTTP/1.1\r\n\r\n");
  idle.read_until("GET  - ");
  const int port = f.server.port();
  const auto start = std::chrono::steady_clock::now();
  f.server.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(idle.peer_closed());
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
}

// Sends `request` on a fresh connection; expects a 400 answer and the connection closed.
void expect_rejected(const Fixture& f, const std::string& request) {
  Client c(f.server.port());
  c.send(request);
  const std::string reply = c.read_until("}");
  EXPECT_NE(reply.find("400 Bad Request"), std::string::npos) << request << "\n->\n" << reply;
  EXPECT_TRUE(c.peer_closed()) << request;
}

void expect_echo_served(const Fixture& f) {
  Client c(f.server.port());
  c.send("POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nok");
  EXPECT_NE(c.read_until("POST ok - ").find("200 OK"), std::string::npos);
}

TEST(HttpServer, ChunkSizeOverflowIsRefusedAndTheServerLives) {
  Fixture f(1024);
  for (const std::string chunks : {"1\r\na\r\nffffffffffffffff\r\n\r\n", "ffffffffffffffff\r\n",
                                   "10\r\n0123456789abcdef\r\nfffffffffffffff0\r\nxx\r\n0\r\n\r\n"}) {
    Client c(f.server.port());
    c.send("POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks);
    const std::string reply = c.read_until("}");
    EXPECT_NE(reply.find("413 Payload Too Large"), std::string::npos) << chunks << "\n->\n" << reply;
    EXPECT_TRUE(c.peer_closed());
  }
  expect_echo_served(f);
}

TEST(HttpServer, AnExceptionOfAnyTypeIs500AndTheServerLives) {
  Fixture f;
  Client c(f.server.port());
  c.send("GET /throw-int HTTP/1.1\r\n\r\n");
  const std::string reply = c.read_until("}");
  EXPECT_NE(reply.find("500 Internal Server Error"), std::string::npos) << reply;
  EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  EXPECT_TRUE(c.peer_closed());
  expect_echo_served(f);
}

TEST(HttpServer, AmbiguousBodyFramingIs400AndCloses) {
  Fixture f;
  const std::string post = "POST /echo HTTP/1.1\r\n";
  const std::string chunked = post + "Transfer-Encoding: chunked\r\n\r\n";
  for (const std::string& request : {
           post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
           post + "Content-Length: 5, 6\r\n\r\nhello!",
           post + "Content-Length: 5, 5\r\n\r\nhello",
           post + "Content-Length: +5\r\n\r\nhello",
           post + "Content-Length: 0x5\r\n\r\nhello",
           post + "Content-Length: 5a\r\n\r\nhello",
           post + "Content-Length: -3\r\n\r\n",
           post + "Content-Length : 5\r\n\r\nhello",
           post + "X-A: a\nContent-Length: 5\r\n\r\nhello",
           post + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
           post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
           post + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
           post + "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
           post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
           post + "Transfer-Encoding: identity\r\n\r\n",
           post + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
           chunked + "1x\r\na\r\n0\r\n\r\n",
           chunked + "+5\r\nhello\r\n0\r\n\r\n",
           chunked + " 5\r\nhello\r\n0\r\n\r\n",
           chunked + "5 \r\nhello\r\n0\r\n\r\n",
           chunked + "0x5\r\nhello\r\n0\r\n\r\n",
           chunked + "-1\r\na\r\n0\r\n\r\n",
           chunked + "\r\n",
       })
    expect_rejected(f, request);
  expect_echo_served(f);
}

TEST(HttpServer, ChunkExtensionsAndRepeatedEqualLengthsAreAccepted) {
  Fixture f;
  Client c(f.server.port());
  c.send("POST /echo HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n5;ext=1\r\nhello\r\nA;x\r\n0123456789\r\n0\r\n\r\n");
  EXPECT_NE(c.read_until("POST hello0123456789 - ").find("200 OK"), std::string::npos);
  c.send("POST /echo HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_NE(c.read_until("POST hi - ").find("200 OK"), std::string::npos);
}

TEST(HttpServer, AHalfClosedClientStillGetsTheAnswer) {
  Fixture f;
  Client c(f.server.port());
  c.send("GET /collect HTTP/1.1\r\n\r\n");
  c.shutdown_write();  // "that is all I send"; it still reads
  const std::string reply = c.read_until("collected");
  EXPECT_NE(reply.find("HTTP/1.1 200 OK"), std::string::npos) << reply;
  EXPECT_NE(reply.find("collected"), std::string::npos) << reply;
  EXPECT_FALSE(f.saw_gone.load());
}

TEST(HttpServer, AWaitingHandlerSeesAClientThatClosed) {
  Fixture f;
  {
    Client c(f.server.port());
    c.send("GET /collect HTTP/1.1\r\n\r\n");
  }  // closes both ways, before the answer
  for (int i = 0; i < 300 && !f.saw_gone; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(f.saw_gone.load());
}

TEST(HttpServer, HeaderDeadlineIsAbsoluteNotPerByte) {
  Fixture f(1024, /*header_timeout_ms=*/500);
  Client slow(f.server.port());
  const std::string dribble = "GET /echo HTTP/1.1\r\nX-Slow: " + std::string(40, 'a');
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < dribble.size() && slow.try_send(dribble.substr(i, 1)); ++i) {
    if (i == 3) expect_echo_served(f);  // another connection is served meanwhile
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(2)) break;
  }
  const std::string reply = slow.read_until("}");
  EXPECT_NE(reply.find("408 Request Timeout"), std::string::npos) << reply;
  EXPECT_TRUE(slow.peer_closed());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

using Clock = std::chrono::steady_clock;

TEST(HttpServer, ALongHandlerDoesNotStallOtherConnections) {
  Fixture f(1024, 10000, [](HttpServerOptions& o) { o.io_threads = 1; });
  Client sleeper(f.server.port());
  sleeper.send("GET /sleep?1500 HTTP/1.1\r\n\r\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = Clock::now();
  expect_echo_served(f);  // one io thread, and the handler of /sleep still runs
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_NE(sleeper.read_until("slept").find("200 OK"), std::string::npos);
}

TEST(HttpServer, IdleConnectionsHoldNoThreadAndConnectionsOverTheCapAre503) {
  Fixture f(1024, 10000, [](HttpServerOptions& o) {
    o.max_connections = 50;
    o.max_handler_threads = 4;
  });
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 49; ++i) idle.push_back(std::make_unique<Client>(f.server.port()));
  for (int i = 0; i < 300 && f.server.open_connections() < 49; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(f.server.open_connections(), 49);
  expect_echo_served(f);                                             // the 50th
  for (int i = 0; i < 300 && f.server.open_connections() > 49; ++i)  // until the server saw it close
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  idle.push_back(std::make_unique<Client>(f.server.port()));
  for (int i = 0; i < 300 && f.server.open_connections() < 50; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto start = Clock::now();
  Client over(f.server.port());
  over.send("GET /echo HTTP/1.1\r\n\r\n");
  const std::string reply = over.read_until("}");
  EXPECT_NE(reply.find("503 Service Unavailable"), std::string::npos) << reply;
  EXPECT_NE(reply.find("too many open connections"), std::string::npos) << reply;
  EXPECT_TRUE(over.peer_closed());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  idle.pop_back();  // room again
  for (int i = 0; i < 300 && f.server.open_connections() >= 50; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  expect_echo_served(f);
}

TEST(HttpServer, BodyDeadlineIsAbsolute) {
  Fixture f(1024, 10000, [](HttpServerOptions& o) { o.body_timeout_ms = 400; });
  Client slow(f.server.port());
  slow.send("POST /echo HTTP/1.1\r\nContent-Length: 40\r\n\r\n");
  const auto start = Clock::now();
  for (int i = 0; i < 20 && slow.try_send("a"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string reply = slow.read_until("}");
  EXPECT_NE(reply.find("408 Request Timeout"), std::string::npos) << reply;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
}

TEST(HttpServer, IdleKeepAliveConnectionsCloseAtTheIdleDeadline) {
  Fixture f(1024, 10000, [](HttpServerOptions& o) { o.idle_timeout_ms = 300; });
  Client c(f.server.port());
  c.send("GET /echo HTTP/1.1\r\n\r\n");
  c.read_until("GET  - ");
  const auto start = Clock::now();
  EXPECT_TRUE(c.peer_closed());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
}

TEST(HttpServer, StopIsBoundedWithSlowClientsAndAStreamThatNeverEnds) {
  auto f = std::make_unique<Fixture>();
  Client streaming(f->server.port());
  streaming.send("GET /wait-for-hangup HTTP/1.1\r\n\r\n");
  streaming.read_until("started");
  Client slow(f->server.port());
  slow.send("GET /echo HTTP/1.1\r\nX-Slow: a");  // a head that never ends
  Client body(f->server.port());
  body.send("POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc");  // a body that never ends
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = Clock::now();
  f->server.stop(std::chrono::milliseconds(300));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(f->saw_gone.load());  // the stream's handler saw its client gone and returned
  EXPECT_TRUE(slow.peer_closed());
}

}  // namespace
}  // namespace moeserve::serve
