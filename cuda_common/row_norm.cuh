// RMSNorm of rows held in registers, shared by the backend's norm kernel (backend/cuda/elementwise.cu) and
// the all-reduce fused with the residual add and norm (comm/peer_all_reduce_kernel.cu). A block
// of kRowThreads threads owns a row; thread x holds chunks x, x + kRowThreads, ... of 8
// elements (16-byte loads, all issued before any is used: a decode-sized row then waits for
// memory once). Requires dim % 8 == 0, 16-byte aligned rows, dim <= kRowThreads * 8 * kRowChunks.
#pragma once

#include "cuda_common/common.cuh"

namespace moeserve::cuda {

constexpr int kRowThreads = 256;
constexpr int kRowChunks = 4;  // up to 8192 elements per row

struct Chunk {
  float v[8];
};

__device__ __forceinline__ int64_t row_chunk_offset(int c) {  // element offset of this thread's chunk c
  return (threadIdx.x + static_cast<int64_t>(c) * kRowThreads) * 8;
}

__device__ __forceinline__ Chunk load_bf16x8(const bf16* p) {
  const uint4 bits = *reinterpret_cast<const uint4*>(p);
  const bf16* h = reinterpret_cast<const bf16*>(&bits);
  Chunk c;
#pragma unroll
  for (int q = 0; q < 8; ++q) c.v[q] = to_f(h[q]);
  return c;
}

__device__ __forceinline__ void store_bf16x8(bf16* p, const float (&v)[8]) {
  uint4 bits;
  bf16* h = reinterpret_cast<bf16*>(&bits);
#pragma unroll
  for (int q = 0; q < 8; ++q) h[q] = to_bf(v[q]);
  *reinterpret_cast<uint4*>(p) = bits;
}

// The weight's chunks (load them before the kernel's pdl_enter: they do not depend on it).
__device__ __forceinline__ void load_row_weight(const bf16* weight, int64_t dim, Chunk (&w)[kRowChunks]) {
#pragma unroll
  for (int c = 0; c < kRowChunks; ++c)
    if (row_chunk_offset(c) < dim) w[c] = load_bf16x8(weight + row_chunk_offset(c));
}

// y_row = weight * bf16(v * rsqrt(mean(v^2) + eps)), transformers' order of roundings.
__device__ __forceinline__ void rms_norm_row(const Chunk (&v)[kRowChunks], const Chunk (&w)[kRowChunks], bf16* y_row,
                                             int64_t dim, float eps, float* scratch) {
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kRowChunks; ++c) {
    if (row_chunk_offset(c) >= dim) break;
#pragma unroll
    for (int q = 0; q < 8; ++q) sum_sq += v[c].v[q] * v[c].v[q];
  }
  const float inv = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(dim) + eps);
#pragma unroll
  for (int c = 0; c < kRowChunks; ++c) {
    if (row_chunk_offset(c) >= dim) break;
    float out[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) out[q] = w[c].v[q] * to_f(to_bf(v[c].v[q] * inv));
    store_bf16x8(y_row + row_chunk_offset(c), out);
  }
}

// The residual add before the norm: residual_row = bf16(residual_row + branch), then
// y_row = norm(residual_row). `branch` holds the fp32 branch rounded to bf16 (as a bf16
// branch would have been), `residual_row` is loaded here.
__device__ __forceinline__ void add_rms_norm_row(const Chunk (&branch)[kRowChunks], const Chunk (&w)[kRowChunks],
                                                 bf16* residual_row, bf16* y_row, int64_t dim, float eps,
                                                 float* scratch) {
  Chunk v[kRowChunks];
#pragma unroll
  for (int c = 0; c < kRowChunks; ++c)
    if (row_chunk_offset(c) < dim) v[c] = load_bf16x8(residual_row + row_chunk_offset(c));
#pragma unroll
  for (int c = 0; c < kRowChunks; ++c) {
    if (row_chunk_offset(c) >= dim) break;
#pragma unroll
    for (int q = 0; q < 8; ++q) v[c].v[q] = to_f(to_bf(v[c].v[q] + branch[c].v[q]));
    store_bf16x8(residual_row + row_chunk_offset(c), v[c].v);
  }
  rms_norm_row(v, w, y_row, dim, eps, scratch);
}

// 8 fp32 values rounded to bf16 precision (a fp32 branch enters the residual stream rounded).
__device__ __forceinline__ Chunk rounded_chunk(const float (&f)[8]) {
  Chunk c;
#pragma unroll
  for (int q = 0; q < 8; ++q) c.v[q] = to_f(to_bf(f[q]));
  return c;
}

__device__ __forceinline__ Chunk rounded_f32x8(const float* p) {
  const float4 lo = *reinterpret_cast<const float4*>(p);
  const float4 hi = *reinterpret_cast<const float4*>(p + 4);
  const float f[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  return rounded_chunk(f);
}

}  // namespace moeserve::cuda
