// Communicator: collectives over one group of ranks (like an NCCL communicator or an MPI
// communicator). A rank holds one Communicator per group it belongs to (its attention-TP
// group, its stage's MoE group, its pipeline neighbours, the world). Every collective is
// called by all ranks of the group in the same order; send/recv pair up per (sender,
// receiver) in FIFO order. Counts are elements of `dtype`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace moeserve::comm {

enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAllV, Send, Recv, Broadcast, Barrier };
const char* collective_name(Collective c);

// Calls and payload bytes per collective, as seen by this rank. Bytes are what this rank
// contributes to the call:
//   all_reduce_sum      count * elem                  (its buffer)
//   all_gather          count * elem                  (its block)
//   reduce_scatter_sum  size() * count * elem         (its full input)
//   all_to_all_v        sum(send_counts) * elem       (everything it sends, own block included)
//   send / recv         count * elem                  (the message)
//   broadcast           count * elem on every rank
//   barrier             0
// Each call is also filed under the current `site` (a label the caller sets, e.g.
// "attention" or "moe_dispatch"), so that a report can say which layer part communicates.
struct CommStats {
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;
    bool operator==(const Entry&) const = default;
  };
  std::map<Collective, Entry> by_collective;
  std::map<std::pair<std::string, Collective>, Entry> by_site;
  std::string site = "unlabelled";

  void record(Collective c, int64_t bytes) {
    auto& e = by_collective[c];
    ++e.calls;
    e.bytes += bytes;
    auto& s = by_site[{site, c}];
    ++s.calls;
    s.bytes += bytes;
  }
  void merge(const CommStats& other) {
    for (const auto& [c, e] : other.by_collective) {
      by_collective[c].calls += e.calls;
      by_collective[c].bytes += e.bytes;
    }
    for (const auto& [key, e] : other.by_site) {
      by_site[key].calls += e.calls;
      by_site[key].bytes += e.bytes;
    }
  }
  // The entry of (site, collective); zero when never called.
  Entry at(const std::string& at_site, Collective c) const {
    const auto it = by_site.find({at_site, c});
    return it == by_site.end() ? Entry{} : it->second;
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // within the group
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // In place: data[i] = sum over ranks of data[i], summed in rank order ((d0 + d1) + d2)...,
  // so every rank gets the same bits whatever the thread timing.
  virtual void all_reduce_sum(void* data, size_t count, DType dtype) = 0;
  // recv = concat over ranks of send (each `count` elements).
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // recv (count elements) = rank's block of the elementwise sum of every rank's send
  // (size() * count elements), summed in rank order.
  virtual void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype) = 0;
  // send holds send_counts[r] elements for each rank r in rank order; recv receives
  // recv_counts[r] elements from each rank r in rank order. Zero counts are allowed.
  virtual void all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                            const std::vector<size_t>& recv_counts, DType dtype) = 0;
  // Point to point. send may return before the matching recv (buffered); recv blocks.
  virtual void send(const void* data, size_t count, DType dtype, int peer) = 0;
  virtual void recv(void* data, size_t count, DType dtype, int peer) = 0;
  virtual void broadcast(void* data, size_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }
  // Files the following calls under `site` in stats().by_site.
  void set_site(std::string site) { stats_.site = std::move(site); }

 protected:
  CommStats stats_;
};

// A group of one: every collective is the identity and nothing is counted.
std::unique_ptr<Communicator> make_solo_communicator(std::string name);

}  // namespace moeserve::comm
