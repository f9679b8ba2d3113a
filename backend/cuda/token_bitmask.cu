// Structured output on the device logits (ops::TokenBitmaskParams): each disallowed id's logit
// becomes -inf in place, inside the step's graph, before the sampler reduces the rows. Grid:
// (column blocks, rows); each thread owns one 32-id word of the mask, so a row whose mask is
// all ones (unconstrained) costs one word read per 32 ids and no write.
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "cuda_common/common.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;

// logits [rows, vocab] (this part), bitmask [rows, words] over the whole vocabulary.
__global__ void token_bitmask_kernel(float* logits, const int32_t* bitmask, int64_t vocab, int64_t words,
                                     int64_t id_offset) {
  pdl_enter();
  const int64_t row = blockIdx.y;
  // Local column range of this thread: the ids of mask word `w` that fall inside the part.
  const int64_t first_word = id_offset / 32, last_word = (id_offset + vocab - 1) / 32;
  const int64_t w = first_word + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w > last_word || w >= words) return;
  const uint32_t mask = static_cast<uint32_t>(bitmask[row * words + w]);
  if (mask == 0xffffffffu) return;
  float* out = logits + row * vocab;
  const int64_t begin = w * 32 > id_offset ? w * 32 : id_offset;
  const int64_t end = (w + 1) * 32 < id_offset + vocab ? (w + 1) * 32 : id_offset + vocab;
  for (int64_t id = begin; id < end; ++id)
    if (!((mask >> (id - w * 32)) & 1u)) out[id - id_offset] = -INFINITY;
}

}  // namespace

void launch_apply_token_bitmask(const ops::TokenBitmaskParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.vocab == 0) return;
  const int64_t spanned = (p.id_offset + p.vocab - 1) / 32 - p.id_offset / 32 + 1;  // mask words over the part
  const dim3 grid(blocks_for(spanned, kThreads), static_cast<unsigned>(p.rows));
  launch_pdl(token_bitmask_kernel, grid, kThreads, 0, stream, p.logits, p.bitmask, p.vocab, p.words, p.id_offset);
}

}  // namespace moeserve::cuda
