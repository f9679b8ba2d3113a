// Dense projections of a decode-sized batch (at most kTokensPerPass rows): y[T, N] (+)=
// x[T, K] W[N, K]^T with warps over pairs of weight rows (and chunks of K), each row streamed
// once with 16-byte loads and multiplied with every input row. More rows run as groups of
// kTokensPerPass, each group's blocks next to the other groups' blocks of the same weight rows
// in launch order (so that they can share those rows through L2): every row gets the
// arithmetic of a run of its own, the batch-invariant mode's projection of narrow matrices.
// cuBLAS's GEMV-shaped kernels reach about half the HBM rate on the 8-60 MB attention and
// shared-expert matrices of a decode step; this is the same streaming loop as the grouped
// experts' (row_dot.cuh).
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"
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
    streaming_linear_kernel(const StreamingLinearParams p, int k_splits, int token_groups) {
  const bf16* x = static_cast<const bf16*>(p.linear.x);
  const bf16* weight = static_cast<const bf16*>(p.linear.weight);
  void* y = p.linear.y;
  int tokens = static_cast<int>(p.linear.rows);
  const int in = static_cast<int>(p.linear.in_features), out = static_cast<int>(p.linear.out_features);
  const int64_t x_stride = p.linear.x_stride, y_stride = p.linear.y_stride;
  const bool accumulate = p.linear.accumulate, y_f32 = p.linear.y_f32;
  const int64_t x_batch = p.x_batch, w_batch = p.w_batch, y_batch = p.y_batch;
  // Batch blockIdx.y: its own input columns, weight matrix and output columns (MLA's per-head
  // value up-projection); one batch for a plain projection. blockIdx.x: the group of input
  // rows (fastest) and the block of weight rows.
  const int group = blockIdx.x % token_groups, row_block = blockIdx.x / token_groups;
  tokens = min(kTokensPerPass, tokens - group * kTokensPerPass);
  x += blockIdx.y * x_batch + static_cast<int64_t>(group) * kTokensPerPass * x_stride;
  weight += blockIdx.y * w_batch;
  const int64_t y_offset = blockIdx.y * y_batch + static_cast<int64_t>(group) * kTokensPerPass * y_stride;
  y = static_cast<char*>(y) + y_offset * (y_f32 ? 4 : 2);
  __shared__ float partial[kGemvWarps][kGemvRowsPerWarp][kTokensPerPass];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int pair = warp / k_splits, split = warp % k_splits;
  const int n0 = (row_block * (kGemvWarps / k_splits) + pair) * kGemvRowsPerWarp;
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

// The batch-invariant mode's projection of wide matrices on tensor cores ("swap AB", as the
// grouped experts' expert_mma_kernel in moe.cu): a block takes 16 weight rows and every input
// row in passes of 32 (four MMA tiles of 8); its warps split K into fixed contiguous ranges of
// 32-element chunks (lane quad owns elements 8 quad .. 8 quad + 7 of a chunk, the same
// permutation of k for weights and inputs), and their fp32 partial sums are added in warp
// order. A row's arithmetic depends on K and the warp count only, never on how many rows run.
constexpr int kLinearMmaWarps = 8;
constexpr int kLinearMmaTileRows = 8;  // the MMA's N
constexpr int kLinearMmaTiles = 4;     // input-row tiles per pass over the weights
constexpr int kLinearMmaChunk = 32;    // K elements per lane-quad step
// Chunks per warp in flight: with every tile's input fragments loaded ahead of the MMAs, 2 was
// faster than 4 (K2.6 x3 on one H200, batch 1 / 128: 1.867 / 25.3 against 1.919 / 26.6 ms).
constexpr int kLinearMmaUnroll = 2;

__global__ void __launch_bounds__(kLinearMmaWarps * 32) linear_mma_kernel(const ops::LinearParams p) {
  const bf16* const x = static_cast<const bf16*>(p.x);
  const bf16* const weight = static_cast<const bf16*>(p.weight);
  void* const y = p.y;
  const int tokens = static_cast<int>(p.rows), in = static_cast<int>(p.in_features);
  const int out = static_cast<int>(p.out_features);
  const int64_t x_stride = p.x_stride, y_stride = p.y_stride;
  const bool accumulate = p.accumulate, y_f32 = p.y_f32;
  __shared__ float partial[kLinearMmaWarps][kLinearMmaTiles][4][32];  // 16 KB
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, quad = lane & 3;
  const int n0 = blockIdx.x * 16;
  const bf16* rows[2];
  bool row_ok[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int n = n0 + group + 8 * half;
    row_ok[half] = n < out;
    rows[half] = weight + static_cast<int64_t>(row_ok[half] ? n : 0) * in + 8 * quad;
  }
  const int chunks = in / kLinearMmaChunk;
  const int per_warp = (chunks + kLinearMmaWarps - 1) / kLinearMmaWarps;
  const int chunk_begin = min(chunks, warp * per_warp), chunk_end = min(chunks, chunk_begin + per_warp);
  pdl_enter();
  for (int first = 0; first < tokens; first += kLinearMmaTileRows * kLinearMmaTiles) {
    const int tiles = min(kLinearMmaTiles, (tokens - first + kLinearMmaTileRows - 1) / kLinearMmaTileRows);
    const bf16* token_row[kLinearMmaTiles];  // this lane's input row of each tile (null past the last)
#pragma unroll
    for (int tile = 0; tile < kLinearMmaTiles; ++tile) {
      const int t = first + tile * kLinearMmaTileRows + group;
      token_row[tile] = tile < tiles && t < tokens ? x + static_cast<int64_t>(t) * x_stride + 8 * quad : nullptr;
    }
    float acc[kLinearMmaTiles][4] = {};
    for (int c0 = chunk_begin; c0 < chunk_end; c0 += kLinearMmaUnroll) {
      uint4 w[kLinearMmaUnroll][2];
#pragma unroll
      for (int u = 0; u < kLinearMmaUnroll; ++u)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          w[u][half] = c0 + u < chunk_end && row_ok[half]
                           ? *reinterpret_cast<const uint4*>(rows[half] + (c0 + u) * kLinearMmaChunk)
                           : make_uint4(0, 0, 0, 0);
      // Every tile's input fragments of these chunks in flight before the first MMA.
      uint4 b[kLinearMmaTiles][kLinearMmaUnroll];
#pragma unroll
      for (int tile = 0; tile < kLinearMmaTiles; ++tile)
#pragma unroll
        for (int u = 0; u < kLinearMmaUnroll; ++u)
          b[tile][u] = token_row[tile] != nullptr && c0 + u < chunk_end
                           ? *reinterpret_cast<const uint4*>(token_row[tile] + (c0 + u) * kLinearMmaChunk)
                           : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int tile = 0; tile < kLinearMmaTiles; ++tile) {
        if (tile >= tiles) break;
#pragma unroll
        for (int u = 0; u < kLinearMmaUnroll; ++u) {
          if (c0 + u >= chunk_end) break;
          const uint32_t a0[4] = {w[u][0].x, w[u][1].x, w[u][0].y, w[u][1].y};
          const uint32_t a1[4] = {w[u][0].z, w[u][1].z, w[u][0].w, w[u][1].w};
          mma_16x8x16(acc[tile], a0, b[tile][u].x, b[tile][u].y);
          mma_16x8x16(acc[tile], a1, b[tile][u].z, b[tile][u].w);
        }
      }
    }
#pragma unroll
    for (int tile = 0; tile < kLinearMmaTiles; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][tile][i][lane] = acc[tile][i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int tile = 0; tile < kLinearMmaTiles; ++tile) {
        if (tile >= tiles) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = n0 + group + 8 * (i >> 1);
          const int t = first + tile * kLinearMmaTileRows + 2 * quad + (i & 1);
          float sum = 0.0f;
          for (int wp = 0; wp < kLinearMmaWarps; ++wp) sum += partial[wp][tile][i][lane];
          if (n >= out || t >= tokens) continue;
          const int64_t o = static_cast<int64_t>(t) * y_stride + n;
          if (y_f32) {
            float* y32 = static_cast<float*>(y);
            y32[o] = accumulate ? y32[o] + sum : sum;
          } else {
            static_cast<bf16*>(y)[o] = to_bf(sum);  // accumulation is into fp32 outputs only (ops.h)
          }
        }
      }
    }
    __syncthreads();  // partial[] is rewritten by the next pass
  }
}

}  // namespace

bool linear_mma_supported(const ops::LinearParams& p, int64_t min_out_features) {
  return p.in_features % kLinearMmaChunk == 0 && p.out_features >= min_out_features && p.x_stride % 8 == 0 &&
         aligned16({p.x, p.weight});
}

void launch_linear_mma(const ops::LinearParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  launch_pdl(linear_mma_kernel, static_cast<unsigned>((p.out_features + 15) / 16), kLinearMmaWarps * 32, 0, stream, p);
}

bool streaming_linear_supported(const ops::LinearParams& p) {
  return p.in_features % 8 == 0 && p.x_stride % 8 == 0 && aligned16({p.x, p.weight});
}

bool small_linear_supported(const ops::LinearParams& p) {
  return p.rows >= 1 && p.rows <= kTokensPerPass && streaming_linear_supported(p);
}

void launch_streaming_linear(const StreamingLinearParams& p, cudaStream_t stream) {
  const int64_t rows = p.linear.rows, out = p.linear.out_features;
  if (rows == 0) return;
  const int k_splits = k_splits_for(p.linear.in_features, out * p.batches);  // never depends on rows
  const int64_t rows_per_block = (kGemvWarps / k_splits) * kGemvRowsPerWarp;
  const int64_t token_groups = (rows + kTokensPerPass - 1) / kTokensPerPass;
  launch_pdl(streaming_linear_kernel,
             dim3(static_cast<unsigned>((out + rows_per_block - 1) / rows_per_block * token_groups),
                  static_cast<unsigned>(p.batches)),
             kGemvWarps * 32, 0, stream, p, k_splits, static_cast<int>(token_groups));
}

}  // namespace moeserve::cuda
