// Framed messages over one TCP connection (Boost.Asio's blocking sockets, TCP_NODELAY): each
// frame is a u32 type, a u32 zero and a u64 payload length, then the payload. send() may be
// called from several threads (a mutex keeps frames whole); one thread reads. A closed or
// failed connection throws an Error naming the peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace moeserve::dist {

struct Frame {
  uint32_t type = 0;
  std::vector<std::byte> payload;
};

class Connection {
 public:
  struct Socket;  // the Asio socket and its io_context (connection.cc)
  Connection(std::unique_ptr<Socket> socket, std::string peer);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const std::string& peer() const { return peer_; }
  void send(uint32_t type, const void* data, size_t bytes);
  void send(uint32_t type, const std::vector<std::byte>& payload) { send(type, payload.data(), payload.size()); }
  // Blocks until a whole frame has arrived.
  Frame recv();
  // Shuts the connection down both ways: a thread blocked in recv() wakes and throws.
  void close();
  // The peer's address as this side sees it (for the leader: where a joiner connected from).
  std::string remote_host() const;

 private:
  std::unique_ptr<Socket> socket_;
  std::string peer_;
  std::mutex send_mutex_;
};

// Connects to host:port, retrying refused connections (the other side may not listen yet)
// until `timeout_s` has passed.
std::unique_ptr<Connection> connect_to(const std::string& host, int port, double timeout_s, std::string peer);

class Listener {
 public:
  // port 0: an ephemeral port (port() says which).
  Listener(const std::string& host, int port);
  ~Listener();
  int port() const;
  // The next connection, or an Error after `timeout_s` without one.
  std::unique_ptr<Connection> accept(double timeout_s, std::string peer);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace moeserve::dist
