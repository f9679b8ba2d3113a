// Dense projections of a decode-sized batch (at most kTokensPerPass rows): y[T, N] (+)=
// x[T, K] W[N, K]^T with one warp per pair of weight rows, each row streamed once with
// 16-byte loads and multiplied with every input row. cuBLAS's GEMV-shaped kernels reach
// about half the HBM rate on the 8-60 MB attention and shared-expert matrices of a decode
// step; this is the same streaming loop as the grouped experts' (row_dot.cuh).
#include "backend/cuda/kernels.h"
#include "backend/cuda/row_dot.cuh"

namespace moeserve::cuda {

namespace {

constexpr int kGemvWarps = 4;
constexpr int kGemvRowsPerWarp = 2;

__global__ void __launch_bounds__(kGemvWarps * 32)
small_linear_kernel(const bf16* x, const bf16* weight, void* y, int tokens, int in, int out, int64_t x_stride,
                    int64_t y_stride, bool accumulate, bool y_f32) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = (blockIdx.x * kGemvWarps + warp) * kGemvRowsPerWarp;
  if (n0 >= out) return;
  const bf16* rows[kGemvRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) rows[r] = weight + static_cast<int64_t>(min(n0 + r, out - 1)) * in;
  const bf16* x_rows[kTokensPerPass];
#pragma unroll
  for (int j = 0; j < kTokensPerPass; ++j) x_rows[j] = x + static_cast<int64_t>(min(j, tokens - 1)) * x_stride;
  float acc[kGemvRowsPerWarp][kTokensPerPass];
  rows_dot_tokens<kGemvRowsPerWarp>(rows, x_rows, tokens, in, acc);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) {
    const int n = n0 + r;
    if (n >= out) break;
#pragma unroll
    for (int j = 0; j < kTokensPerPass; ++j) {
      if (j >= tokens) break;
      const int64_t o = j * y_stride + n;
      if (y_f32) {
        float* y32 = static_cast<float*>(y);
        y32[o] = accumulate ? y32[o] + acc[r][j] : acc[r][j];
      } else {
        bf16* y16 = static_cast<bf16*>(y);
        y16[o] = to_bf(accumulate ? to_f(y16[o]) + acc[r][j] : acc[r][j]);
      }
    }
  }
}

}  // namespace

bool small_linear_supported(int64_t rows, int64_t in, const void* x, const void* weight, int64_t x_stride) {
  return rows >= 1 && rows <= kTokensPerPass && in % 8 == 0 && x_stride % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0;
}

void launch_small_linear(const void* x, const void* weight, void* y, int64_t rows, int64_t in, int64_t out,
                         int64_t x_stride, int64_t y_stride, bool accumulate, bool y_f32, cudaStream_t stream) {
  const int64_t rows_per_block = kGemvWarps * kGemvRowsPerWarp;
  small_linear_kernel<<<static_cast<unsigned>((out + rows_per_block - 1) / rows_per_block), kGemvWarps * 32, 0,
                        stream>>>(static_cast<const bf16*>(x), static_cast<const bf16*>(weight), y,
                                  static_cast<int>(rows), static_cast<int>(in), static_cast<int>(out), x_stride,
                                  y_stride, accumulate, y_f32);
}

}  // namespace moeserve::cuda
