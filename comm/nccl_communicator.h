// NCCL communicators: one process, one thread per GPU. `make_nccl_world` creates the world
// communicators of all local GPUs; each rank thread then splits its own world communicator
// into groups (attention TP, stage, pipeline) with NcclCommunicator::split, which every
// member of the world must call together. Collectives are stream-ordered on the rank's
// backend stream; payload pointers are device pointers. NCCL_NVLS_ENABLE=0 is honoured
// (set here when absent): NVLink multicast stays off.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/fused_all_reduce_norm.h"
#include "comm/peer_all_reduce.h"

typedef struct CUstream_st* cudaStream_t;
typedef struct ncclComm* ncclComm_t;

namespace moeserve::comm {

// The fused all-reduce + residual add + RMSNorm (FusedAllReduceNorm) runs on the peer
// all-reduce group, when one is set.
class NcclCommunicator final : public Communicator, public FusedAllReduceNorm {
 public:
  // Takes ownership of `comm`.
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, std::string name);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void all_reduce_sum(void* data, size_t count, DType dtype) override;
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype) override;
  void all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                    const std::vector<size_t>& recv_counts, DType dtype) override;
  void send(const void* data, size_t count, DType dtype, int peer) override;
  void recv(void* data, size_t count, DType dtype, int peer) override;
  void broadcast(void* data, size_t count, DType dtype, int root) override;
  void barrier() override;

  // Small fp32 / bf16 all-reduces go through `group` (this communicator's ranks, in its rank
  // order) instead of NCCL; see peer_all_reduce.h. nullptr: NCCL only.
  void use_peer_all_reduce(std::shared_ptr<PeerAllReduce> group);

  bool all_reduce_add_rms_norm(float* branch, const ResidualNorm& norm) override;
  bool fused_all_reduce_norm_available() const override { return peer_ != nullptr; }

  // Time every call with CUDA events on the stream (for benchmarks; off by default).
  // collect_timing() waits for the recorded calls and returns milliseconds per collective.
  void set_timing(bool enabled) { timing_ = enabled; }
  std::map<Collective, double> collect_timing();

  // Collective over this communicator: members with the same color form a group, ordered
  // by key. Returns this rank's communicator of its group.
  std::unique_ptr<NcclCommunicator> split(int color, int key, std::string name);

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  void* barrier_scratch_ = nullptr;
  std::shared_ptr<PeerAllReduce> peer_;
  bool timing_ = false;
  struct Timed {
    Collective collective;
    void* start;
    void* stop;
  };
  std::vector<Timed> timed_;
  void* record_event();
  template <typename Fn>
  void maybe_timed(Collective c, Fn&& fn);
};

// The id that names one NCCL world across processes (ncclGetUniqueId), as bytes: one process
// makes it, the others receive it (dist/cluster.h's control plane) before make_nccl_world_part.
std::vector<std::byte> nccl_unique_id();

// This process's part of a world of `world_size` ranks over several processes: world rank
// ranks[i] on GPU i, bound to streams[i] (ncclCommInitRank for every local rank in one group);
// every process calls it with the same `id`. Index = i.
std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_world_part(const std::vector<std::byte>& id, int world_size,
                                                                    const std::vector<int>& ranks,
                                                                    const std::vector<cudaStream_t>& streams);

// World communicators for GPUs 0..num_gpus-1 (index = rank), each bound to streams[rank].
// Called from one thread.
std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_world(const std::vector<cudaStream_t>& streams);

}  // namespace moeserve::comm
