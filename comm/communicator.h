// Communicator: collectives over one group of ranks (like an NCCL communicator or an MPI
// communicator). A rank holds one Communicator per group it belongs to (its attention-TP
// group, its stage's MoE group, its pipeline neighbours, the world). Every call is made by
// all ranks of the group in the same order. Counts are elements of `dtype`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moeserve::comm {

enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAllV, SendRecv, Broadcast, Barrier };
const char* collective_name(Collective c);

// Calls and payload bytes per collective, as seen by this rank.
struct CommStats {
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;
  };
  std::map<Collective, Entry> by_collective;
  void record(Collective c, int64_t bytes) {
    auto& e = by_collective[c];
    ++e.calls;
    e.bytes += bytes;
  }
  void merge(const CommStats& other) {
    for (const auto& [c, e] : other.by_collective) {
      by_collective[c].calls += e.calls;
      by_collective[c].bytes += e.bytes;
    }
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // within the group
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // In place: data[i] = sum over ranks of data[i] (summed in rank order: deterministic).
  virtual void all_reduce_sum(void* data, size_t count, DType dtype) = 0;
  // recv = concat over ranks of send (each `count` elements).
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // recv (count elements) = rank's block of the elementwise sum of every rank's send
  // (size() * count elements).
  virtual void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype) = 0;
  // send holds send_counts[r] elements for each rank r in rank order; recv receives
  // recv_counts[r] elements from each rank r in rank order.
  virtual void all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                            const std::vector<size_t>& recv_counts, DType dtype) = 0;
  virtual void send(const void* data, size_t count, DType dtype, int peer) = 0;
  virtual void recv(void* data, size_t count, DType dtype, int peer) = 0;
  virtual void broadcast(void* data, size_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

 protected:
  CommStats stats_;
};

// A group of one: every collective is the identity and nothing is counted.
std::unique_ptr<Communicator> make_solo_communicator(std::string name);

}  // namespace moeserve::comm
