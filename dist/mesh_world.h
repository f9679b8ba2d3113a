// A world of ranks spread over processes (one per node, or one per GPU): the communicators of
// comm::World over per-(group, sender, receiver) mailboxes. A message to a rank of this process
// is queued in memory, one to a rank of another process goes over the one TCP connection
// between the two processes, whose reader thread queues it there. So sends never wait for a
// receiver and two ranks exchanging large buffers cannot deadlock. Collectives are built from
// those messages: every rank sends what each peer needs and sums what it received in rank
// order (comm/rank_order_sum.h), so a world split over processes gives the same bits as the
// same ranks as threads of one process (comm/in_process.h).
//
// Faults: a connection that closes without a goodbye frame aborts the world with "<node> lost"
// (`describe` names the process: its node and ranks); an abort here (a rank failed) is sent to
// every other process, so that no rank anywhere waits for a peer that will not come.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/world.h"
#include "dist/connection.h"

namespace moeserve::dist {

struct MeshState;  // mesh_world.cc

struct MeshOptions {
  std::vector<int> process_of_rank;                  // [world size]: the process each world rank lives in
  int process = 0;                                   // this process
  std::function<std::string(int process)> describe;  // "node 1 (ranks 2-3)"
};

class MeshWorld final : public comm::World {
 public:
  // peers[p]: the connection to process p (null for this process). Starts a reader per peer.
  MeshWorld(MeshOptions options, std::vector<std::unique_ptr<Connection>> peers);
  // Says goodbye to every peer (their readers stop without an abort) and joins the readers.
  ~MeshWorld() override;
  MeshWorld(const MeshWorld&) = delete;
  MeshWorld& operator=(const MeshWorld&) = delete;

  int size() const override;
  std::unique_ptr<comm::Communicator> communicator(int rank, const std::string& name,
                                                   const std::vector<int>& members) override;
  void abort(const std::string& reason) override;
  bool aborted() const override;
  // The abort's reason ("" while not aborted).
  std::string abort_reason() const;

 private:
  std::shared_ptr<MeshState> state_;
};

}  // namespace moeserve::dist
