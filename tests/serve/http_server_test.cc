// The HTTP layer over real sockets: keep-alive, chunked bodies, limits, streaming, and
// noticing a client that hung up.
#include "serve/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

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
  explicit Fixture(size_t max_body = 1024)
      : server(
            [&] {
              HttpServerOptions o;
              o.host = "127.0.0.1";
              o.port = 0;
              o.max_body_bytes = max_body;
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
      for (int i = 0; i < 500 && !ex.client_gone(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      saw_gone = ex.client_gone();
    } else if (r.path == "/throw") {
      throw std::runtime_error("boom");
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

}  // namespace
}  // namespace moeserve::serve
