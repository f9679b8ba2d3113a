#include "dist/cluster.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "dist/mesh_world.h"
#include "dist/wire.h"

#ifndef MOESERVE_GIT_COMMIT
#define MOESERVE_GIT_COMMIT "unknown"
#endif

namespace moeserve::dist {

namespace {

using Clock = std::chrono::steady_clock;

enum ControlFrame : uint32_t { kHello = 10, kRefused = 11, kTable = 12, kHeartbeat = 13, kDataHello = 14 };
constexpr int kProtocolVersion = 1;

struct Hello {
  int node = 0;
  int data_port = 0;
  Fingerprint fingerprint;
};

std::vector<std::byte> encode_hello(const Hello& hello) {
  ByteWriter w;
  w.put<int32_t>(hello.node);
  w.put<int32_t>(hello.data_port);
  w.put<uint64_t>(hello.fingerprint.size());
  for (const auto& [key, value] : hello.fingerprint) {
    w.put_string(key);
    w.put_string(value);
  }
  return std::move(w.bytes());
}

Hello decode_hello(const Frame& frame) {
  MS_CHECK(frame.type == kHello, "rendezvous: expected a hello frame, got type {}", frame.type);
  ByteReader r(frame.payload, "a joiner's hello");
  Hello hello;
  hello.node = r.get<int32_t>("node_rank");
  hello.data_port = r.get<int32_t>("data_port");
  const uint64_t n = r.get<uint64_t>("fingerprint size");
  for (uint64_t i = 0; i < n; ++i) {
    std::string key = r.get_string("fingerprint key");
    hello.fingerprint.emplace_back(std::move(key), r.get_string("fingerprint value"));
  }
  r.expect_end();
  return hello;
}

std::string text_of(const Frame& frame) {
  return {reinterpret_cast<const char*>(frame.payload.data()), frame.payload.size()};
}

}  // namespace

std::string fingerprint_difference(const Fingerprint& here, const Fingerprint& there, int node) {
  std::string out;
  auto value_in = [](const Fingerprint& fp, const std::string& key) -> std::string {
    for (const auto& [k, v] : fp)
      if (k == key) return v;
    return "(missing)";
  };
  Fingerprint keys = here;
  for (const auto& entry : there)
    if (value_in(here, entry.first) == "(missing)") keys.push_back(entry);
  for (const auto& [key, unused] : keys) {
    const std::string a = value_in(here, key), b = value_in(there, key);
    if (a == b) continue;
    if (!out.empty()) out += "; ";
    out += fmt::format("{}: '{}' on the leader, '{}' on node {}", key, a, b, node);
  }
  return out;
}

std::string binary_version() {
  return fmt::format("moeserve protocol {} commit {}", kProtocolVersion, MOESERVE_GIT_COMMIT);
}

struct Cluster::State {
  ClusterOptions options;
  std::function<std::string(int)> describe;
  std::vector<std::unique_ptr<Connection>> control;  // leader: [node] (0 null); follower: [0] the leader
  std::unique_ptr<MeshWorld> world;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::deque<Frame>> queues;     // [node]
  std::vector<Clock::time_point> last_seen;  // [node]
  std::string lost;
  std::function<void(const std::string&)> callback;
  std::atomic<bool> stopping{false};
  std::vector<std::thread> threads;

  void lose(int node, const std::string& reason) {
    std::function<void(const std::string&)> notify;
    std::string message;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!lost.empty() || stopping) return;
      lost = message = fmt::format("{} lost: {}", describe(node), reason);
      notify = callback;
    }
    changed.notify_all();
    if (world) world->abort(message);
    if (notify) notify(message);
  }

  void read_control(int node) {
    try {
      for (;;) {
        Frame frame = control[node]->recv();
        {
          std::lock_guard<std::mutex> lock(mutex);
          last_seen[node] = Clock::now();
          if (frame.type != kHeartbeat) queues[node].push_back(frame);
        }
        changed.notify_all();
        if (frame.type == kGoodbyeFrame) return;  // the leader closes the cluster
      }
    } catch (const std::exception& e) {
      if (!stopping) lose(node, e.what());
    }
  }

  void heartbeat() {
    const auto interval = std::chrono::duration<double>(options.heartbeat_interval_s);
    std::unique_lock<std::mutex> lock(mutex);
    while (!stopping) {
      changed.wait_for(lock, interval, [&] { return stopping.load(); });
      if (stopping) return;
      for (int node = 0; node < static_cast<int>(control.size()); ++node) {
        if (!control[node]) continue;
        const double silent = std::chrono::duration<double>(Clock::now() - last_seen[node]).count();
        lock.unlock();
        try {
          control[node]->send(kHeartbeat, nullptr, 0);
        } catch (const Error& e) {
          lose(node, e.what());
        }
        if (silent > options.heartbeat_timeout_s) lose(node, fmt::format("no heartbeat for {:.1f} s", silent));
        lock.lock();
      }
    }
  }
};

Cluster::Cluster(const ClusterOptions& options) : options_(options), state_(std::make_shared<State>()) {
  MS_CHECK(options.nnodes >= 1, "--nnodes must be at least 1, got {}", options.nnodes);
  MS_CHECK(options.node_rank >= 0 && options.node_rank < options.nnodes, "--node-rank {} outside [0, {})",
           options.node_rank, options.nnodes);
  MS_CHECK(options.world % options.nnodes == 0, "the plan's {} ranks do not split evenly over --nnodes {}",
           options.world, options.nnodes);
  state_->options = options;
  state_->describe = [this](int node) { return describe(node); };
  state_->queues.resize(options.nnodes);
  state_->last_seen.assign(options.nnodes, Clock::now());
  state_->control.resize(options.nnodes);
}

int Cluster::node_of_rank(int rank) const { return rank / (options_.world / options_.nnodes); }

std::vector<int> Cluster::local_ranks() const {
  const int per_node = options_.world / options_.nnodes;
  std::vector<int> ranks;
  for (int r = 0; r < per_node; ++r) ranks.push_back(options_.node_rank * per_node + r);
  return ranks;
}

std::string Cluster::describe(int node) const {
  const int per_node = options_.world / options_.nnodes;
  if (per_node == 1) return fmt::format("node {} (rank {})", node, node);
  return fmt::format("node {} (ranks {}-{})", node, node * per_node, (node + 1) * per_node - 1);
}

comm::World& Cluster::world() { return *state_->world; }

namespace {

struct Address {
  std::string host;
  int port = 0;
};

// The leader's side of the rendezvous: every follower's control connection and data address.
std::vector<Address> admit_followers(const ClusterOptions& o, Listener& data,
                                     std::vector<std::unique_ptr<Connection>>& control) {
  Listener listener(o.host, o.port);
  std::vector<Address> table(o.nnodes);
  table[0] = {o.host, data.port()};
  const auto deadline = Clock::now() + std::chrono::duration<double>(o.join_timeout_s);
  for (int joined = 1; joined < o.nnodes;) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    std::unique_ptr<Connection> conn;
    try {
      MS_CHECK(left > 0, "the time is up");
      conn = listener.accept(left, "joining node");
    } catch (const Error& e) {
      fail("only {} of {} nodes joined at {}:{} within {} s ({})", joined, o.nnodes, o.host, o.port, o.join_timeout_s,
           e.what());
    }
    const Hello hello = decode_hello(conn->recv());
    std::string refusal;
    if (hello.node < 1 || hello.node >= o.nnodes)
      refusal = fmt::format("--node-rank {} outside [1, {}) (--nnodes {})", hello.node, o.nnodes, o.nnodes);
    else if (control[hello.node])
      refusal = fmt::format("node {} has joined already", hello.node);
    else
      refusal = fingerprint_difference(o.fingerprint, hello.fingerprint, hello.node);
    if (!refusal.empty()) {
      std::fprintf(stderr, "moeserve: refused a joiner: %s\n", refusal.c_str());
      conn->send(kRefused, refusal.data(), refusal.size());
      continue;
    }
    table[hello.node] = {conn->remote_host(), hello.data_port};
    control[hello.node] = std::move(conn);
    ++joined;
  }
  ByteWriter w;
  for (const Address& a : table) {
    w.put_string(a.host);
    w.put<int32_t>(a.port);
  }
  for (int node = 1; node < o.nnodes; ++node) control[node]->send(kTable, w.bytes());
  return table;
}

// A follower's side: its hello, and the table (or the leader's refusal, thrown).
std::vector<Address> join_leader(const ClusterOptions& o, Listener& data,
                                 std::vector<std::unique_ptr<Connection>>& control) {
  control[0] = connect_to(o.host, o.port, o.join_timeout_s, "the leader (node 0)");
  control[0]->send(kHello, encode_hello({o.node_rank, data.port(), o.fingerprint}));
  const Frame answer = control[0]->recv();
  if (answer.type == kRefused) fail("node {}: the leader refused to admit it: {}", o.node_rank, text_of(answer));
  MS_CHECK(answer.type == kTable, "node {}: expected the address table from the leader, got frame type {}", o.node_rank,
           answer.type);
  ByteReader r(answer.payload, "the leader's address table");
  std::vector<Address> table(o.nnodes);
  for (Address& a : table) {
    a.host = r.get_string("host");
    a.port = r.get<int32_t>("port");
  }
  r.expect_end();
  return table;
}

// Pairwise data-plane connections: a node connects to every lower node and accepts the higher.
std::vector<std::unique_ptr<Connection>> connect_data_plane(const ClusterOptions& o, Listener& data,
                                                            const std::vector<Address>& table) {
  std::vector<std::unique_ptr<Connection>> peers(o.nnodes);
  for (int node = 0; node < o.node_rank; ++node) {
    peers[node] = connect_to(table[node].host, table[node].port, o.join_timeout_s, fmt::format("node {}", node));
    const int32_t me = o.node_rank;
    peers[node]->send(kDataHello, &me, sizeof me);
  }
  for (int node = o.node_rank + 1; node < o.nnodes; ++node) {
    std::unique_ptr<Connection> conn = data.accept(o.join_timeout_s, "a node's data-plane connection");
    const Frame hello = conn->recv();
    ByteReader r(hello.payload, "a data-plane hello");
    const int32_t from = r.get<int32_t>("node");
    MS_CHECK(hello.type == kDataHello && from > o.node_rank && from < o.nnodes && !peers[from],
             "node {}: an unexpected data-plane connection (frame type {}, node {})", o.node_rank, hello.type, from);
    peers[from] = std::move(conn);
  }
  return peers;
}

}  // namespace

std::unique_ptr<Cluster> Cluster::join(const ClusterOptions& options) {
  std::unique_ptr<Cluster> cluster(new Cluster(options));
  State& s = *cluster->state_;
  Listener data("0.0.0.0", 0);
  const std::vector<Address> table =
      cluster->leader() ? admit_followers(options, data, s.control) : join_leader(options, data, s.control);
  std::vector<int> process_of_rank(options.world);
  for (int r = 0; r < options.world; ++r) process_of_rank[r] = cluster->node_of_rank(r);
  s.world = std::make_unique<MeshWorld>(MeshOptions{process_of_rank, options.node_rank, s.describe},
                                        connect_data_plane(options, data, table));
  s.last_seen.assign(options.nnodes, Clock::now());
  for (int node = 0; node < options.nnodes; ++node)
    if (s.control[node]) s.threads.emplace_back([&s, node] { s.read_control(node); });
  s.threads.emplace_back([&s] { s.heartbeat(); });
  return cluster;
}

Cluster::~Cluster() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->changed.notify_all();
  for (auto& conn : state_->control)
    if (conn) {
      try {
        if (leader()) conn->send(kGoodbyeFrame, nullptr, 0);
      } catch (const Error&) {  // already gone
      }
      conn->close();
    }
  for (auto& t : state_->threads) t.join();
  state_->world.reset();
}

void Cluster::broadcast(uint32_t type, const std::vector<std::byte>& payload) {
  for (int node = 1; node < nnodes(); ++node) {
    try {
      state_->control[node]->send(type, payload);
    } catch (const Error& e) {
      state_->lose(node, e.what());
      fail("{}", lost());
    }
  }
}

Frame Cluster::receive_from(int node) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  auto& queue = state_->queues[node];
  state_->changed.wait(lock, [&] { return !queue.empty() || !state_->lost.empty(); });
  if (queue.empty()) fail("{}", state_->lost);
  Frame frame = std::move(queue.front());
  queue.pop_front();
  return frame;
}

Frame Cluster::next_command() { return receive_from(0); }

void Cluster::reply(uint32_t type, const std::vector<std::byte>& payload) {
  try {
    state_->control[0]->send(type, payload);
  } catch (const Error& e) {
    state_->lose(0, e.what());
    fail("{}", lost());
  }
}

std::string Cluster::lost() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->lost;
}

void Cluster::on_lost(std::function<void(const std::string&)> callback) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->callback = std::move(callback);
}

}  // namespace moeserve::dist
