// The peer all-reduce kernel's arguments and launcher (peer_all_reduce.h says what it does).
// Plain C++, shared by the host code (C++20) and the kernel's translation unit (nvcc, C++17).
#pragma once

#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace moeserve::comm::peer {

constexpr int kMaxRanks = 8;
constexpr int64_t kMaxBytes = int64_t{256} << 10;  // per message
constexpr int kThreads = 256;
constexpr int64_t kChunkBytes = kThreads * 16;  // one 16-byte vector per thread and pass
constexpr int kMaxBlocks = 64;                  // kMaxBytes / kChunkBytes

struct Args {
  int rank, size;
  char* receive[kMaxRanks];    // every rank's receive buffer: [2 halves][ranks][kMaxBytes]
  uint32_t* flags[kMaxRanks];  // every rank's flags: [ranks][kMaxBlocks]
  uint32_t* calls;             // this rank's call counter per block: [kMaxBlocks]
  char* data;                  // the message, in place
  int64_t bytes;
  bool bf16;
};

// ceil(bytes / kChunkBytes) blocks (at most kMaxBlocks), programmatic dependent launch.
void launch(const Args& args, cudaStream_t stream);

}  // namespace moeserve::comm::peer
