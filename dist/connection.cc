#include "dist/connection.h"

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <thread>

#include "core/error.h"

namespace moeserve::dist {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct Connection::Socket {
  std::shared_ptr<asio::io_context> io;
  tcp::socket socket;
  explicit Socket(std::shared_ptr<asio::io_context> context) : io(std::move(context)), socket(*io) {}
};

namespace {

struct FrameHeader {
  uint32_t type;
  uint32_t zero;
  uint64_t bytes;
};

void set_nodelay(tcp::socket& socket) {
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
}

}  // namespace

Connection::Connection(std::unique_ptr<Socket> socket, std::string peer)
    : socket_(std::move(socket)), peer_(std::move(peer)) {
  set_nodelay(socket_->socket);
}

Connection::~Connection() { close(); }

void Connection::send(uint32_t type, const void* data, size_t bytes) {
  const FrameHeader header{type, 0, bytes};
  const std::array<asio::const_buffer, 2> buffers{asio::buffer(&header, sizeof header), asio::buffer(data, bytes)};
  std::lock_guard<std::mutex> lock(send_mutex_);
  boost::system::error_code ec;
  asio::write(socket_->socket, buffers, ec);
  if (ec) fail("connection to {}: send failed: {}", peer_, ec.message());
}

Frame Connection::recv() {
  FrameHeader header{};
  boost::system::error_code ec;
  asio::read(socket_->socket, asio::buffer(&header, sizeof header), ec);
  if (ec == asio::error::eof) fail("connection to {} closed", peer_);
  if (ec) fail("connection to {}: {}", peer_, ec.message());
  MS_CHECK(header.zero == 0, "connection to {}: a frame header is corrupt (reserved field {})", peer_, header.zero);
  Frame frame{header.type, std::vector<std::byte>(header.bytes)};
  asio::read(socket_->socket, asio::buffer(frame.payload), ec);
  if (ec) fail("connection to {} closed inside a frame of {} bytes: {}", peer_, header.bytes, ec.message());
  return frame;
}

void Connection::close() {
  boost::system::error_code ignored;
  socket_->socket.shutdown(tcp::socket::shutdown_both, ignored);
}

std::string Connection::remote_host() const {
  boost::system::error_code ec;
  const tcp::endpoint endpoint = socket_->socket.remote_endpoint(ec);
  return ec ? std::string() : endpoint.address().to_string();
}

std::unique_ptr<Connection> connect_to(const std::string& host, int port, double timeout_s, std::string peer) {
  auto io = std::make_shared<asio::io_context>();
  tcp::resolver resolver(*io);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last_error;
  while (std::chrono::steady_clock::now() < deadline) {
    boost::system::error_code ec;
    const auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (!ec) {
      auto socket = std::make_unique<Connection::Socket>(io);
      asio::connect(socket->socket, endpoints, ec);
      if (!ec) return std::make_unique<Connection>(std::move(socket), std::move(peer));
    }
    last_error = ec.message();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  fail("could not connect to {} at {}:{} within {} s: {}", peer, host, port, timeout_s, last_error);
}

struct Listener::State {
  std::shared_ptr<asio::io_context> io = std::make_shared<asio::io_context>();
  tcp::acceptor acceptor{*io};
};

Listener::Listener(const std::string& host, int port) : state_(std::make_unique<State>()) {
  boost::system::error_code ec;
  tcp::resolver resolver(*state_->io);
  const auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec || endpoints.empty()) fail("cannot resolve the address {}:{} to listen on: {}", host, port, ec.message());
  const tcp::endpoint endpoint = *endpoints.begin();
  state_->acceptor.open(endpoint.protocol());
  state_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  state_->acceptor.bind(endpoint, ec);
  if (ec) fail("cannot listen on {}:{}: {}", host, port, ec.message());
  state_->acceptor.listen();
}

Listener::~Listener() = default;

int Listener::port() const { return state_->acceptor.local_endpoint().port(); }

std::unique_ptr<Connection> Listener::accept(double timeout_s, std::string peer) {
  auto socket = std::make_unique<Connection::Socket>(state_->io);
  boost::system::error_code result = asio::error::timed_out;
  bool done = false;
  state_->acceptor.async_accept(socket->socket, [&](const boost::system::error_code& ec) {
    result = ec;
    done = true;
  });
  state_->io->restart();
  state_->io->run_for(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_s)));
  if (!done) {
    state_->acceptor.cancel();
    state_->io->restart();
    state_->io->run();  // the cancelled handler runs
    fail("no {} connected to port {} within {} s", peer, port(), timeout_s);
  }
  if (result) fail("accepting {} on port {}: {}", peer, port(), result.message());
  return std::make_unique<Connection>(std::move(socket), std::move(peer));
}

}  // namespace moeserve::dist
