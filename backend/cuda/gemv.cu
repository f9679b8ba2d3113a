// Dense projections of a decode-sized batch (at most kTokensPerPass rows): y[T, N] (+)=
// x[T, K] W[N, K]^T with warps over pairs of weight rows (and chunks of K), each row streamed
// once with 16-byte loads and multiplied with every input row. cuBLAS's GEMV-shaped kernels reach
// about half the HBM rate on the 8-60 MB attention and shared-expert matrices of a decode
// step; this is the same streaming loop as the grouped experts' (row_dot.cuh).
#include "backend/cuda/kernels.h"
#include "backend/cuda/row_dot.cuh"

namespace moeserve::cuda {

namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvRowsPerWarp = 2;
constexpr int kGemvMaxSplits = kGemvWarps;

// A block's warps are (kGemvWarps / k_splits) pairs of weight rows x k_splits chunks of the
// input dimension: narrow matrices (kv_a_proj's 576 rows, q_a_proj's 1536) and long rows
// (o_proj, down_proj) get enough warps, each with enough bytes in flight, to stream at HBM
// rate. The chunks' partial sums are added in chunk order through shared memory.
__global__ void __launch_bounds__(kGemvWarps * 32)
small_linear_kernel(const bf16* x, const bf16* weight, void* y, int tokens, int in, int out, int64_t x_stride,
                    int64_t y_stride, bool accumulate, bool y_f32, int k_splits, int64_t x_batch, int64_t w_batch,
                    int64_t y_batch) {
  // Batch blockIdx.y: its own input columns, weight matrix and output columns (MLA's per-head
  // value up-projection); one batch for a plain projection.
  x += blockIdx.y * x_batch;
  weight += blockIdx.y * w_batch;
  y = static_cast<char*>(y) + blockIdx.y * y_batch * (y_f32 ? 4 : 2);
  __shared__ float partial[kGemvWarps][kGemvRowsPerWarp][kTokensPerPass];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int pair = warp / k_splits, split = warp % k_splits;
  const int n0 = (blockIdx.x * (kGemvWarps / k_splits) + pair) * kGemvRowsPerWarp;
  const int chunk = (in / 8 + k_splits - 1) / k_splits * 8;  // multiple of 8: 16-byte aligned chunks
  const int k0 = min(in, split * chunk), k1 = min(in, k0 + chunk);
  float acc[kGemvRowsPerWarp][kTokensPerPass] = {};
  const bf16* rows[kGemvRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) {
    rows[r] = weight + static_cast<int64_t>(min(n0 + r, out - 1)) * in + k0;
    // The first pass's bytes of each row (rows_dot_tokens loads 2 KB per row per pass).
    if (n0 + r < out) warp_prefetch_l2(rows[r], min(int64_t{2048}, int64_t{k1 - k0} * 2));
  }
  pdl_enter();
  if (n0 < out) {
    const bf16* x_rows[kTokensPerPass];
#pragma unroll
    for (int j = 0; j < kTokensPerPass; ++j) x_rows[j] = x + static_cast<int64_t>(min(j, tokens - 1)) * x_stride + k0;
    rows_dot_tokens<kGemvRowsPerWarp>(rows, x_rows, tokens, k1 - k0, acc);
  }
  if (k_splits > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kGemvRowsPerWarp; ++r)
#pragma unroll
        for (int j = 0; j < kTokensPerPass; ++j) partial[warp][r][j] = acc[r][j];
    __syncthreads();
    if (split != 0) return;
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r)
#pragma unroll
      for (int j = 0; j < kTokensPerPass; ++j) {
        float sum = 0.0f;
        for (int c = 0; c < k_splits; ++c) sum += partial[warp + c][r][j];
        acc[r][j] = sum;
      }
  }
  if (lane != 0 || n0 >= out) return;
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
        static_cast<bf16*>(y)[o] = to_bf(acc[r][j]);  // accumulation is into fp32 outputs only (ops.h)
      }
    }
  }
}

// Chunks per row: double while the launch has fewer than ~8192 warps (two waves on an H200)
// and each chunk keeps at least 1024 elements (2 KB per row per warp).
int k_splits_for(int64_t in, int64_t out) {
  const int64_t pairs = (out + kGemvRowsPerWarp - 1) / kGemvRowsPerWarp;
  int k = 1;
  while (k < kGemvMaxSplits && pairs * k < 8192 && in / (2 * k) >= 1024) k *= 2;
  return k;
}

}  // namespace

bool small_linear_supported(int64_t rows, int64_t in, const void* x, const void* weight, int64_t x_stride) {
  return rows >= 1 && rows <= kTokensPerPass && in % 8 == 0 && x_stride % 8 == 0 && aligned16({x, weight});
}

void launch_small_linear(const void* x, const void* weight, void* y, int64_t rows, int64_t in, int64_t out,
                         int64_t x_stride, int64_t y_stride, bool accumulate, bool y_f32, cudaStream_t stream) {
  launch_small_linear_batched(x, weight, y, rows, in, out, x_stride, y_stride, 1, 0, 0, 0, accumulate, y_f32, stream);
}

void launch_small_linear_batched(const void* x, const void* weight, void* y, int64_t rows, int64_t in, int64_t out,
                                 int64_t x_stride, int64_t y_stride, int64_t batches, int64_t x_batch,
                                 int64_t w_batch, int64_t y_batch, bool accumulate, bool y_f32, cudaStream_t stream) {
  const int k_splits = k_splits_for(in, out * batches);
  const int64_t rows_per_block = (kGemvWarps / k_splits) * kGemvRowsPerWarp;
  launch_pdl(small_linear_kernel,
             dim3(static_cast<unsigned>((out + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(batches)),
             kGemvWarps * 32, 0, stream, static_cast<const bf16*>(x), static_cast<const bf16*>(weight), y,
             static_cast<int>(rows), static_cast<int>(in), static_cast<int>(out), x_stride, y_stride, accumulate,
             y_f32, k_splits, x_batch, w_batch, y_batch);
}

}  // namespace moeserve::cuda
