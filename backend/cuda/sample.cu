// Greedy sampling on the device: argmax per row and its value (ties: the smallest id, as on
// the CPU), ids offset by the first id of the rank's vocab slice.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace moeserve::cuda {

namespace {

__global__ void argmax_kernel(const float* logits, int32_t* tokens, float* values, int64_t vocab, int64_t id_offset) {
  pdl_enter();
  __shared__ float best_values[32];
  __shared__ int best_ids[32];
  const float* row = logits + blockIdx.x * vocab;
  float best = -INFINITY;
  int best_id = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (row[i] > best) {  // first occurrence within this thread's stride
      best = row[i];
      best_id = static_cast<int>(i);
    }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int id = __shfl_xor_sync(0xffffffffu, best_id, offset);
    if (v > best || (v == best && id < best_id)) {
      best = v;
      best_id = id;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    best_values[warp] = best;
    best_ids[warp] = best_id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
      if (best_values[w] > best || (best_values[w] == best && best_ids[w] < best_id)) {
        best = best_values[w];
        best_id = best_ids[w];
      }
    tokens[blockIdx.x] = static_cast<int32_t>(best_id + id_offset);
    if (values) values[blockIdx.x] = best;
  }
}

}  // namespace

void launch_argmax_rows(const float* logits, int32_t* tokens, float* values, int64_t rows, int64_t vocab,
                        int64_t id_offset, cudaStream_t stream) {
  if (rows == 0) return;
  launch_pdl(argmax_kernel, rows, 1024, 0, stream, logits, tokens, values, vocab, id_offset);
}

}  // namespace moeserve::cuda
