// MLA attention in the absorbed form over the paged latent cache.
//
// One warp per (token, head); a block holds kHeadsPerBlock heads of one token so that the
// cache rows they share are read once from HBM and then hit L1. Each lane owns latent
// elements lane, lane + 32, ... (at most kMaxLatent / 32 of them) and rope elements likewise;
// the softmax is computed online (running max and denominator), so any context length works
// with constant registers.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

#include <stdexcept>
#include <string>

namespace moeserve::cuda {

namespace {

constexpr int kHeadsPerBlock = 8;
constexpr int kMaxLatent = 512;
constexpr int kMaxRope = 128;
constexpr int kLatentPerLane = kMaxLatent / 32;
constexpr int kRopePerLane = kMaxRope / 32;

__global__ void __launch_bounds__(kHeadsPerBlock * 32)
mla_attention_kernel(const bf16* q_latent, const bf16* q_rope, const bf16* cache, const int32_t* block_tables,
                     const int32_t* seq_of_token, const int32_t* positions, bf16* out, int heads, int latent,
                     int rope, int64_t q_head_stride, int64_t rope_offset, int page_size, int64_t max_pages_per_seq,
                     float scale) {
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.y * kHeadsPerBlock + (threadIdx.x >> 5);
  if (h >= heads) return;
  const int width = latent + rope;

  float q_lat[kLatentPerLane], q_r[kRopePerLane], acc[kLatentPerLane];
  const bf16* ql = q_latent + (static_cast<int64_t>(t) * heads + h) * latent;
  const bf16* qr = q_rope + (static_cast<int64_t>(t) * heads + h) * q_head_stride + rope_offset;
#pragma unroll
  for (int j = 0; j < kLatentPerLane; ++j) {
    const int i = lane + 32 * j;
    q_lat[j] = i < latent ? to_f(ql[i]) * scale : 0.0f;
    acc[j] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kRopePerLane; ++j) {
    const int i = lane + 32 * j;
    q_r[j] = i < rope ? to_f(qr[i]) * scale : 0.0f;
  }

  const int32_t* table = block_tables + static_cast<int64_t>(seq_of_token[t]) * max_pages_per_seq;
  const int length = positions[t] + 1;
  float running_max = -INFINITY, denom = 0.0f;
  for (int pos = 0; pos < length; ++pos) {
    const bf16* entry = cache + (static_cast<int64_t>(table[pos / page_size]) * page_size + pos % page_size) * width;
    float partial = 0.0f;
#pragma unroll
    for (int j = 0; j < kLatentPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < latent) partial += q_lat[j] * to_f(entry[i]);
    }
#pragma unroll
    for (int j = 0; j < kRopePerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < rope) partial += q_r[j] * to_f(entry[latent + i]);
    }
    const float score = warp_sum(partial);
    const float new_max = fmaxf(running_max, score);
    const float correction = __expf(running_max - new_max);
    const float p = __expf(score - new_max);
    denom = denom * correction + p;
#pragma unroll
    for (int j = 0; j < kLatentPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < latent) acc[j] = acc[j] * correction + p * to_f(entry[i]);
    }
    running_max = new_max;
  }
  bf16* o = out + (static_cast<int64_t>(t) * heads + h) * latent;
  const float inv = 1.0f / denom;
#pragma unroll
  for (int j = 0; j < kLatentPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < latent) o[i] = to_bf(acc[j] * inv);
  }
}

}  // namespace

void launch_mla_attention(const void* q_latent, const void* q_rope, const void* cache, const int32_t* block_tables,
                          const int32_t* seq_of_token, const int32_t* positions, void* out, int64_t tokens,
                          int64_t heads, int64_t latent, int64_t rope, int64_t q_head_stride, int64_t rope_offset,
                          int64_t page_size, int64_t max_pages_per_seq, float scale, cudaStream_t stream) {
  if (latent > kMaxLatent || rope > kMaxRope)
    throw std::invalid_argument("mla_attention: unsupported kv_lora_rank " + std::to_string(latent) +
                                " / qk_rope_head_dim " + std::to_string(rope) + " (max 512 / 128)");
  if (tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((heads + kHeadsPerBlock - 1) / kHeadsPerBlock));
  mla_attention_kernel<<<grid, kHeadsPerBlock * 32, 0, stream>>>(
      static_cast<const bf16*>(q_latent), static_cast<const bf16*>(q_rope), static_cast<const bf16*>(cache),
      block_tables, seq_of_token, positions, static_cast<bf16*>(out), static_cast<int>(heads),
      static_cast<int>(latent), static_cast<int>(rope), q_head_stride, rope_offset, static_cast<int>(page_size),
      max_pages_per_seq, scale);
}

}  // namespace moeserve::cuda
