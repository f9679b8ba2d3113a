// The processes of one server: node 0 (the leader) runs the HTTP server and the scheduler,
// every other node (a follower) runs its ranks on the steps the leader sends. join() is the
// rendezvous (SGLang's --dist-init-addr: the leader listens there, followers connect):
//   1. each follower sends a hello (its node rank, its fingerprint: binary version, model,
//      plan, engine options; the port of its data-plane listener);
//   2. the leader compares every fingerprint with its own and refuses a joiner that differs,
//      saying which fields differ (the joiner's join() throws that message; the leader goes on
//      waiting for a right one until the join timeout);
//   3. the leader sends everyone the table of data-plane addresses and the processes connect
//      pairwise: the data plane (dist/mesh_world.h) the ranks' collectives run over.
// The control plane (leader <-> each follower, on the rendezvous connection) then carries
// frames of the runtime's types (kUserFrame and up) and heartbeats: a node silent for
// heartbeat_timeout_s, or whose connection closes, is lost; the world is aborted (every rank
// blocked in a collective fails) and the loss, naming the node and its ranks, is reported.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/world.h"
#include "dist/connection.h"

namespace moeserve::dist {

// What must be equal on every node: (field, value) pairs.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

// "" when equal, else "field: 'a' here, 'b' on node N; ..." for every differing field.
std::string fingerprint_difference(const Fingerprint& here, const Fingerprint& there, int node);

// The binary's version as the handshake compares it (the wire protocol and the commit built).
std::string binary_version();

struct ClusterOptions {
  int nnodes = 1;
  int node_rank = 0;
  std::string host = "127.0.0.1";  // --dist-init-addr: where the leader listens
  int port = 0;
  int world = 1;  // ranks of the plan; node n runs ranks [n * world / nnodes, (n + 1) * world / nnodes)
  Fingerprint fingerprint;
  double join_timeout_s = 120.0;
  double heartbeat_interval_s = 0.5;
  double heartbeat_timeout_s = 5.0;
};

constexpr uint32_t kUserFrame = 100;   // the first frame type the runtime may use
constexpr uint32_t kGoodbyeFrame = 2;  // next_command(): the leader closed the cluster

class Cluster {
 public:
  // Blocks until every node has joined (or throws: timeout, refused, unreachable).
  static std::unique_ptr<Cluster> join(const ClusterOptions& options);
  ~Cluster();

  bool leader() const { return options_.node_rank == 0; }
  int nnodes() const { return options_.nnodes; }
  int node_rank() const { return options_.node_rank; }
  int node_of_rank(int rank) const;
  std::vector<int> local_ranks() const;
  // "node 1 (ranks 2-3)".
  std::string describe(int node) const;
  comm::World& world();

  // Leader: sends a frame to every follower.
  void broadcast(uint32_t type, const std::vector<std::byte>& payload);
  // Leader: the next frame follower `node` sent (heartbeats aside); throws once it is lost.
  Frame receive_from(int node);
  // Follower: the next frame from the leader (kGoodbyeFrame: the end); throws once the leader is lost.
  Frame next_command();
  // Follower: a frame to the leader.
  void reply(uint32_t type, const std::vector<std::byte>& payload);

  // The first loss ("node 1 (ranks 2-3) lost: ..."), "" while every node is there.
  std::string lost() const;
  // Called once, from a cluster thread, when a node is lost.
  void on_lost(std::function<void(const std::string&)> callback);

  struct State;  // cluster.cc

 private:
  explicit Cluster(const ClusterOptions& options);
  ClusterOptions options_;
  std::shared_ptr<State> state_;
};

}  // namespace moeserve::dist
