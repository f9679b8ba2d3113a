// A world of ranks whose groups hand out communicators (like MPI_Comm_split): the in-process
// world of CPU-rank threads (comm/in_process.h) and the world that spans processes
// (dist/mesh_world.h) both are one, so that the runtime splits a plan's groups out of either.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace moeserve::comm {

class World {
 public:
  virtual ~World() = default;
  virtual int size() const = 0;
  // The communicator of world rank `rank` in the group `members` (world ranks in group-rank
  // order; `rank` must be one of them). Every member asks with the same `name` and `members`.
  virtual std::unique_ptr<Communicator> communicator(int rank, const std::string& name,
                                                     const std::vector<int>& members) = 0;
  // Wakes every rank blocked in a call of this world; they, and every later call, throw an
  // Error starting "communication aborted: " and carrying `reason`.
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const = 0;
};

}  // namespace moeserve::comm
