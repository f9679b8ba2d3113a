// Warp-level dot products of weight rows with a few input rows: the inner loop of the
// streaming (decode-sized) kernels, shared by the grouped experts (moe.cu) and the small
// dense projections (gemv.cu). Each warp streams its weight rows once with 16-byte loads.
#pragma once

#include "cuda_common/common.cuh"

namespace moeserve::cuda {

constexpr int kTokensPerPass = 4;  // input rows multiplied with each weight row per pass

// Dot products of kRows weight rows with up to kTokensPerPass input rows, warp-reduced
// (every lane gets the sums). 16-byte loads when inner % 8 == 0 (rows then 16-byte aligned),
// element by element otherwise.
template <int kRows>
__device__ __forceinline__ void rows_dot_tokens(const bf16* const (&w)[kRows], const bf16* const* x_rows,
                                                int num_tokens, int inner, float (&acc)[kRows][kTokensPerPass]) {
  // kUnroll 16-byte chunks per row are loaded before any is used: enough bytes in flight per
  // warp to stream weights near HBM speed even when only a few experts are active.
  constexpr int kUnroll = 4;
  constexpr int kStride = 32 * 8;  // elements per chunk across the warp
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokensPerPass; ++j) acc[r][j] = 0.0f;
  if (inner % 8 != 0) {
    // Rows not 16-byte aligned (a small MoE-TP slice): element by element.
    for (int i = lane; i < inner; i += 32)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float wv = to_f(w[r][i]);
#pragma unroll
        for (int j = 0; j < kTokensPerPass; ++j)
          if (j < num_tokens) acc[r][j] += wv * to_f(x_rows[j][i]);
      }
  }
  for (int base = lane * 8; inner % 8 == 0 && base < inner; base += kStride * kUnroll) {
    uint4 wp[kRows][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        wp[r][u] = base + u * kStride < inner ? *reinterpret_cast<const uint4*>(w[r] + base + u * kStride)
                                              : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < kTokensPerPass; ++j) {
      if (j >= num_tokens) break;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (base + u * kStride >= inner) break;
        const uint4 xp = *reinterpret_cast<const uint4*>(x_rows[j] + base + u * kStride);
        const bf16* xv = reinterpret_cast<const bf16*>(&xp);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const bf16* wv = reinterpret_cast<const bf16*>(&wp[r][u]);
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[r][j] += to_f(wv[q]) * to_f(xv[q]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokensPerPass; ++j) acc[r][j] = warp_sum(acc[r][j]);
}

}  // namespace moeserve::cuda
