// Logit adjustments in place (ops::LogitAdjustParams): one thread per entry, the entry count
// read from device memory so that a captured graph replays any step's entries. Entries name
// distinct (row, token) pairs, so no two threads write the same logit.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "cuda_common/common.cuh"

namespace moeserve::cuda {

namespace {

constexpr int kAdjustThreads = 256;
constexpr int64_t kMaxAdjustBlocks = 64;  // grid-stride beyond 16K entries

__global__ void logit_adjust_kernel(ops::LogitAdjustParams p) {
  pdl_enter();
  const int64_t count = min(static_cast<int64_t>(*p.count), p.capacity), local = p.parts * p.vocab_part;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    const ops::LogitAdjustEntry e = p.entries[i];
    const int64_t id = e.token - p.vocab_begin;
    if (e.row < 0 || e.row >= p.rows || id < 0 || id >= local) continue;  // another rank's slice
    float* logit = p.logits + ((id / p.vocab_part) * p.rows + e.row) * p.vocab_part + id % p.vocab_part;
    *logit = ops::adjusted_logit(*logit, e);
  }
}

}  // namespace

void launch_logit_adjust(const ops::LogitAdjustParams& p, cudaStream_t stream) {
  if (p.capacity <= 0 || p.rows <= 0) return;
  const int64_t blocks = std::min<int64_t>((p.capacity + kAdjustThreads - 1) / kAdjustThreads, kMaxAdjustBlocks);
  launch_pdl(logit_adjust_kernel, static_cast<unsigned>(blocks), kAdjustThreads, 0, stream, p);
}

}  // namespace moeserve::cuda
