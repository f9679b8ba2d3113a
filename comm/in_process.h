// An in-process world: each rank is a thread of this process and a group's ranks meet in a
// shared slot table. Every collective runs in two phases separated by a barrier: (1) each
// rank publishes its buffers and counts, then (2) reads what it needs from the others into
// private scratch, waits until everyone has read, and only then writes its output. Sums
// are taken in rank order, so results are bitwise the same whatever the thread timing.
// send/recv go through per-(sender, receiver) FIFO mailboxes that copy the message, so a
// sender may run ahead of its receiver by up to `send_capacity` messages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/world.h"

namespace moeserve::comm {

struct InProcessState;  // shared by the world's communicators (in_process.cc)

struct InProcessOptions {
  // Messages a sender may have queued to one receiver before send() blocks (0: no limit).
  size_t send_capacity = 0;
};

class InProcessWorld final : public World {
 public:
  explicit InProcessWorld(int size, InProcessOptions options = {});
  ~InProcessWorld();
  InProcessWorld(const InProcessWorld&) = delete;
  InProcessWorld& operator=(const InProcessWorld&) = delete;

  int size() const override;

  // The communicator of world rank `rank` in the group `members` (world ranks, listed in
  // group-rank order; `rank` must be one of them). Every member asks with the same `name`
  // and `members` and gets a handle on the same group (like MPI_Comm_split). The world must
  // outlive its communicators.
  std::unique_ptr<Communicator> communicator(int rank, const std::string& name,
                                             const std::vector<int>& members) override;

  // Wakes every rank blocked in a call of this world; they, and every later call, throw an
  // Error carrying `reason`. Used when one rank fails so that its peers do not wait forever.
  void abort(const std::string& reason) override;
  bool aborted() const override;

 private:
  std::shared_ptr<InProcessState> state_;
};

}  // namespace moeserve::comm
