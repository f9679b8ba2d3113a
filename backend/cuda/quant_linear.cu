// Dense projections with packed quantized weights (ops/quant_layout.h) on tensor cores at
// every row count (quant_mma.cuh): y[t, n] (+)= sum_k x[t, k] * w[n, k]. A block takes 16
// weight rows and up to 32 input rows per pass (grid.y spreads the passes of many rows over
// blocks); its warps split K, so each weight byte is read once per 32 input rows, and at decode
// sizes once per call. int4 weights whose rows hold whole stages stream through shared memory
// (quant_stream.cuh); the others load their fragments straight from global memory.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_mma.cuh"
#include "backend/cuda/quant_stream.cuh"

namespace moeserve::cuda {

namespace {

constexpr int64_t kMaxPassBlocks = 65535;  // grid.y limit

// Warp 0's block sums of one pass (fragment layout of mma_16x8x16's d) to y.
template <int kTiles>
__device__ __forceinline__ void store_outputs(const ops::LinearParams& p, const float (&acc)[kTiles][1][4], int tiles,
                                              int64_t first, int64_t n0, int lane) {
  const int group = lane >> 2, quad = lane & 3;
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    if (tile >= tiles) break;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + group + 8 * (i >> 1), t = first + tile * kQuantTileTokens + 2 * quad + (i & 1);
      if (n >= p.out_features || t >= p.rows) continue;
      const int64_t o = t * p.y_stride + n;
      if (p.y_f32) {
        float* y = static_cast<float*>(p.y);
        y[o] = p.accumulate ? y[o] + acc[tile][0][i] : acc[tile][0][i];
      } else {
        static_cast<bf16*>(p.y)[o] = to_bf(acc[tile][0][i]);
      }
    }
  }
}

// This lane's input row of each token tile of the pass at row `first` (null past the rows).
template <int kTiles>
__device__ __forceinline__ void pass_rows(const ops::LinearParams& p, int64_t first, int tiles, int group,
                                          const bf16* (&x_rows)[kTiles]) {
  const auto* x = static_cast<const bf16*>(p.x);
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    const int64_t t = first + tile * kQuantTileTokens + group;
    x_rows[tile] = tile < tiles && t < p.rows ? x + t * p.x_stride : nullptr;
  }
}

// Steps whose loads a lane keeps in flight: fp8 at decode sizes (few accumulators) takes 4,
// twice quant_mma.cuh's default, since a projection's grid is too small to hide the latency
// with more warps.
__host__ __device__ constexpr int linear_unroll(QuantKind q, int tiles) {
  return q == QuantKind::fp8 && tiles == 1
             ? 4
             : (q == QuantKind::fp8 ? QuantStep<QuantKind::fp8>::kUnroll : QuantStep<QuantKind::int4>::kUnroll);
}

template <QuantKind kQ, int kTiles>
__global__ void __launch_bounds__(kQuantLinearWarps * 32)
    quant_linear_kernel(const ops::LinearParams p, int64_t scales_offset, int scale_shift) {
  __shared__ float partial[kQuantLinearWarps][kTiles][1][4][32];  // 4-16 KB
  pdl_enter();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, quad = lane & 3;
  const QuantMatrix m{p.weight, p.out_features, p.in_features, p.weight_quant, scales_offset, scale_shift};
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16;
  QuantRow<kQ> rows[1][2];
  bool row_ok[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t n = n0 + group + 8 * half;
    row_ok[half] = n < p.out_features;
    rows[0][half] = quant_row<kQ>(m, row_ok[half] ? n : 0, quad);
  }
  int step_begin, step_end;
  warp_steps(static_cast<int>(p.in_features / QuantStep<kQ>::kElems), warp, kQuantLinearWarps, step_begin, step_end);
  for (int64_t first = static_cast<int64_t>(blockIdx.y) * (kQuantTileTokens * kTiles); first < p.rows;
       first += static_cast<int64_t>(gridDim.y) * (kQuantTileTokens * kTiles)) {
    const int tiles = static_cast<int>(min(static_cast<int64_t>(kTiles), (p.rows - first + 7) / kQuantTileTokens));
    const bf16* x_rows[kTiles];
    pass_rows<kTiles>(p, first, tiles, group, x_rows);
    float acc[kTiles][1][4] = {};
    quant_rows_dot<kQ, 1, kTiles, linear_unroll(kQ, kTiles)>(rows, row_ok, p.weight_quant, x_rows, tiles, step_begin,
                                                             step_end, quad, acc);
    quant_block_reduce<kQuantLinearWarps, 1, kTiles>(acc, tiles, partial);
    if (warp == 0) store_outputs<kTiles>(p, acc, tiles, first, n0, lane);
    __syncthreads();  // partial[] is rewritten by the next pass
  }
}

// int4, streamed (quant_stream.cuh): the same blocks and passes as quant_linear_kernel.
template <int kTiles>
__global__ void __launch_bounds__(kQuantLinearWarps * 32)
    int4_stream_linear_kernel(const ops::LinearParams p, int64_t scales_offset, int scale_shift) {
  extern __shared__ __align__(16) char smem[];  // the warps' stages, then quant_block_reduce's partial sums
  pdl_enter();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16, last = min(n0 + 15, p.out_features - 1);
  const auto* base = static_cast<const char*>(p.weight);
  const StreamRows rows{
      base,     base + scales_offset, p.in_features / 2, p.in_features / p.weight_quant.group_size * 2,
      {n0, n0}, {last, last},         scale_shift};
  int step_begin, step_end;
  stream_warp_steps(static_cast<int>(p.in_features / 32), warp, kQuantLinearWarps, step_begin, step_end);
  char* warp_smem = smem + warp * Int4Stream<1>::kWarpBytes;
  auto* partial = reinterpret_cast<float(*)[kTiles][1][4][32]>(smem);
  for (int64_t first = static_cast<int64_t>(blockIdx.y) * (kQuantTileTokens * kTiles); first < p.rows;
       first += static_cast<int64_t>(gridDim.y) * (kQuantTileTokens * kTiles)) {
    const int tiles = static_cast<int>(min(static_cast<int64_t>(kTiles), (p.rows - first + 7) / kQuantTileTokens));
    const bf16* x_rows[kTiles];
    pass_rows<kTiles>(p, first, tiles, lane >> 2, x_rows);
    float acc[kTiles][1][4] = {};
    int4_stream_dot<1, kTiles>(rows, warp_smem, step_begin, step_end, x_rows, tiles, lane, acc);
    __syncthreads();  // every warp is done with its stages: partial[] reuses them
    quant_block_reduce<kQuantLinearWarps, 1, kTiles>(acc, tiles, partial);
    if (warp == 0) store_outputs<kTiles>(p, acc, tiles, first, n0, lane);
    __syncthreads();  // partial[] is rewritten by the next pass
  }
}

template <int kTiles>
void launch_int4_stream_linear(const ops::LinearParams& p, dim3 grid, int64_t scales_offset, int scale_shift,
                               cudaStream_t stream) {
  constexpr int stages = kQuantLinearWarps * Int4Stream<1>::kWarpBytes,
                partial = kQuantLinearWarps * kTiles * 4 * 32 * 4;
  constexpr int bytes = stages > partial ? stages : partial;
  auto* kernel = int4_stream_linear_kernel<kTiles>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);  // above 48 KB
  launch_pdl(kernel, grid, kQuantLinearWarps * 32, bytes, stream, p, scales_offset, scale_shift);
}

}  // namespace

void check_quant_kernel_shape(const char* what, int64_t n, int64_t k, const ops::QuantLayout& l) {
  auto fail = [&](const std::string& why) { throw std::invalid_argument(std::string(what) + ": " + why); };
  if (n <= 0 || k <= 0) fail("empty quantized weight [" + std::to_string(n) + ", " + std::to_string(k) + "]");
  if (l.quant == ops::WeightQuant::int4_group) {
    if (l.group_size != 32 && l.group_size != 64 && l.group_size != 128)
      fail("int4 group_size " + std::to_string(l.group_size) + " is not 32, 64 or 128 (the CUDA kernels' steps)");
    if (k % l.group_size != 0)
      fail("in_features " + std::to_string(k) + " is not a multiple of the int4 group_size " +
           std::to_string(l.group_size));
  } else if (l.quant == ops::WeightQuant::fp8_block) {
    if (l.block_n <= 0 || l.block_k <= 0 || l.block_k % 64 != 0 || (l.block_k & (l.block_k - 1)) != 0)
      fail("fp8 block [" + std::to_string(l.block_n) + ", " + std::to_string(l.block_k) +
           "]: block_k must be a power of two, a multiple of 64 (the CUDA kernels' step)");
    if (k % 64 != 0) fail("in_features " + std::to_string(k) + " is not a multiple of 64 (fp8 kernels)");
  } else {
    fail("the weight is not quantized");
  }
}

void launch_quant_linear(const ops::LinearParams& p, cudaStream_t stream) {
  check_quant_kernel_shape("linear weight", p.out_features, p.in_features, p.weight_quant);
  if (p.x_stride % 8 != 0 || !aligned16({p.x, p.weight}))
    throw std::invalid_argument("linear (quantized weight): x rows must be 16-byte aligned (x_stride " +
                                std::to_string(p.x_stride) + ")");
  if (p.rows == 0) return;
  const int64_t scales_offset = ops::quant_scales_offset(p.out_features, p.in_features, p.weight_quant);
  const bool int4 = p.weight_quant.quant == ops::WeightQuant::int4_group;
  // The tile count depends on the row count only, so a row's arithmetic does not depend on the
  // other rows of its call beyond that choice (passes of 8 rows: every row alike).
  const bool many = p.rows > kQuantRowsForManyTiles;
  const int64_t rows_per_pass = kQuantTileTokens * (many ? kQuantMaxTiles : 1);
  const dim3 grid(
      static_cast<unsigned>((p.out_features + 15) / 16),
      static_cast<unsigned>(std::min<int64_t>(kMaxPassBlocks, (p.rows + rows_per_pass - 1) / rows_per_pass)));
  if (int4 && int4_stream_supported(p.in_features, p.weight_quant)) {
    const int shift = quant_scale_shift(p.weight_quant);
    return many ? launch_int4_stream_linear<kQuantMaxTiles>(p, grid, scales_offset, shift, stream)
                : launch_int4_stream_linear<1>(p, grid, scales_offset, shift, stream);
  }
  auto* kernel =
      int4 ? (many ? quant_linear_kernel<QuantKind::int4, kQuantMaxTiles> : quant_linear_kernel<QuantKind::int4, 1>)
           : (many ? quant_linear_kernel<QuantKind::fp8, kQuantMaxTiles> : quant_linear_kernel<QuantKind::fp8, 1>);
  launch_pdl(kernel, grid, kQuantLinearWarps * 32, 0, stream, p, scales_offset, quant_scale_shift(p.weight_quant));
}

}  // namespace moeserve::cuda
