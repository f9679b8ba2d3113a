// All-reduce of small messages between the GPUs of one process, in one kernel per call.
//
// NCCL's all-reduce of a decode step's 28 KB message between two H200s takes ~7.5 us in its
// ring-LL kernel, and as an ordinary stream dependency it also leaves a ~5 us launch gap
// before it and keeps the next kernel from being scheduled early (the backend's kernels use
// programmatic dependent launch): ~18 us per call, 13 calls per 6-layer step. Here each rank's
// kernel is launched like the backend's kernels (messages up to 4 MB: a decode step of up to
// 146 rows of 7168 fp32) and
//   1. pushes its message into every peer's receive buffer with peer-to-peer stores (NVLink),
//      one 4 KB chunk per 256-thread block and pass;
//   2. raises, per block, a flag in every peer's memory (release, system scope);
//   3. waits for every peer's flag of the same block in its own memory (acquire);
//   4. sums the chunks in rank order ((d0 + d1) + d2 ..., fp32; bf16 messages are summed in fp32
//      and rounded once) into the message in place.
// The fused form (all_reduce_add_rms_norm) does the same per row and goes on with the residual
// add and RMSNorm that follow the all-reduce of a decode step's branch, in registers: the norm
// kernel, its launch and the wait between the two go away.
// Flags hold a per-block call counter kept in device memory, so captured graphs replay it;
// receive buffers alternate between two halves by the counter's parity, which is enough: a
// rank that starts call k + 2 has seen every peer start call k + 1, so the peers have finished
// reading call k's half.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/fused_all_reduce_norm.h"
#include "comm/peer_all_reduce_kernel.h"
#include "core/dtype.h"

typedef struct CUstream_st* cudaStream_t;

namespace moeserve::comm {

class PeerAllReduce {
 public:
  static constexpr int kMaxRanks = peer::kMaxRanks;
  static constexpr size_t kMaxBytes = peer::kMaxBytes;  // a message of at most 146 rows x 7168 fp32

  // The group of `devices` (group rank order); nullptr when a pair of them cannot access each
  // other's memory (or peer access cannot be enabled): the communicators then use NCCL for
  // every all-reduce. Enables peer access between them.
  static std::shared_ptr<PeerAllReduce> create(const std::vector<int>& devices);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_[rank]; }
  // fp32 or bf16, whole 16-byte chunks, at most kMaxBytes, 16-byte aligned.
  bool fits(const void* data, size_t count, DType dtype) const;
  // In place on `rank`'s stream (its device current); every rank calls it with the same count.
  void all_reduce_sum(int rank, void* data, size_t count, DType dtype, cudaStream_t stream);

  // The all-reduce of a fp32 [rows, dim] branch fused with the residual add and RMSNorm that
  // follow it (FusedAllReduceNorm::all_reduce_add_rms_norm): one block per row pushes the row, sums
  // it in rank order (written back to `branch` too) and normalises it in registers. For at
  // most kMaxBlocks rows of at most 8192 elements (dim % 8 == 0), 16-byte aligned.
  bool fits_rows(const float* branch, const ResidualNorm& norm) const;
  void all_reduce_add_rms_norm(int rank, float* branch, const ResidualNorm& norm, cudaStream_t stream);

 private:
  explicit PeerAllReduce(std::vector<int> devices);
  peer::Args arguments(int rank, void* data, int64_t bytes, bool bf16) const;
  struct RankMemory {
    char* receive = nullptr;    // [2 halves][ranks][kMaxBytes]: what each rank sent this rank
    uint32_t* flags = nullptr;  // [ranks][kMaxBlocks]: the call counter each rank last raised here
    uint32_t* calls = nullptr;  // [kMaxBlocks]: this rank's call counter per block
  };
  std::vector<int> devices_;
  std::vector<RankMemory> memory_;
};

}  // namespace moeserve::comm
