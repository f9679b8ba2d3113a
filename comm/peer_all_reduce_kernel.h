// The peer all-reduce kernel's arguments and launcher (peer_all_reduce.h says what it does).
// Plain C++, shared by the host code (C++20) and the kernel's translation unit (nvcc, C++17).
#pragma once

#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace moeserve::comm::peer {

constexpr int kMaxRanks = 8;
constexpr int64_t kMaxBytes = int64_t{4} << 20;  // per message: batch 128 x 7168 fp32 is 3.7 MB
constexpr int kThreads = 256;
constexpr int64_t kChunkBytes = kThreads * 16;  // one 16-byte vector per thread and pass
constexpr int kMaxBlocks = 128;                 // chunks beyond it: more passes per block

struct Args {
  int rank, size;
  char* receive[kMaxRanks];    // every rank's receive buffer: [2 halves][ranks][kMaxBytes]
  uint32_t* flags[kMaxRanks];  // every rank's flags: [ranks][kMaxBlocks]
  uint32_t* calls;             // this rank's call counter per block: [kMaxBlocks]
  char* data;                  // the message, in place
  int64_t bytes;
  bool bf16;
  // launch_add_rms_norm only: data is a fp32 [rows, dim] branch; the residual add and norm.
  void* hidden;        // [rows, dim] bf16
  const void* weight;  // [dim] bf16
  void* normed;        // [rows, dim] bf16
  int64_t rows, dim;
  float eps;
};

// ceil(bytes / kChunkBytes) blocks (at most kMaxBlocks), programmatic dependent launch.
void launch(const Args& args, cudaStream_t stream);
// One block per row (rows <= kMaxBlocks, dim <= kMaxRowElements, dim % 8 == 0).
constexpr int64_t kMaxRowElements = 8192;
void launch_add_rms_norm(const Args& args, cudaStream_t stream);

}  // namespace moeserve::comm::peer
