// Tensor-core dot products of packed quantized weight rows (ops/quant_layout.h) with a few
// bf16 input rows, shared by the quantized linear (quant_linear.cu) and the quantized grouped
// experts (quant_moe.cu). Exact scheme: int4 q in [-8, 7] and e4m3 values are exact in bf16,
// so the MMA runs on the raw q (or e4m3 value) of one scale group at a time, in fp32, and the
// group's scale multiplies the fp32 partial sum (no rounded bf16 weight is ever formed).
//
// "Swap AB" as the bf16 expert kernel (moe.cu): the weights are the MMA's M side (16 rows per
// tile: rows group and group + 8 of the fragment), the input rows its N side (8 per tile). A
// warp takes a contiguous range of K steps; per step each lane loads its part of each weight
// row once (int4: one 32-bit word = 8 values; fp8: 16 bytes = 16 values) and multiplies it
// with every token tile. Within a step the K order is permuted (the same permutation for
// weights and inputs, so the dot product is unchanged):
//   int4 step = 32 elements (one group-of-32 column of words): lane quad q owns elements
//     8q .. 8q + 7 (word q of the group); bf16x2 pair j of a word is (element j, element j + 4),
//     k-step 0 takes pairs 0, 1 and k-step 1 pairs 2, 3;
//   fp8 step = 64 elements: lane quad q owns elements 16q .. 16q + 15, k-step s its elements
//     4s .. 4s + 3 in order.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/mma.cuh"
#include "cuda_common/common.cuh"
#include "ops/quant_layout.h"

namespace moeserve::cuda {

constexpr int kQuantWarps = 4;        // warps per block, splitting K (grouped experts)
constexpr int kQuantLinearWarps = 8;  // the same for a projection: more loads in flight per row tile
constexpr int kQuantTileTokens = 8;   // the MMA's N
// Token tiles per pass over the weights: 4 (32 input rows) for many rows; 1 at decode sizes
// (a quarter of the accumulators: more warps resident, more weight bytes in flight).
constexpr int kQuantMaxTiles = 4;
constexpr int kQuantRowsForManyTiles = 8;  // rows per weight tile above which 4 tiles are used

enum class QuantKind { int4, fp8 };

// Elements of K per step and the unrolled steps loaded before use (bytes in flight).
template <QuantKind kQ>
struct QuantStep;
template <>
struct QuantStep<QuantKind::int4> {
  static constexpr int kElems = 32;
  static constexpr int kUnroll = 8;
  using Word = uint32_t;
};
template <>
struct QuantStep<QuantKind::fp8> {
  static constexpr int kElems = 64;
  static constexpr int kUnroll = 2;
  using Word = uint4;
};

// One packed weight [n, k] as the kernels read it.
struct QuantMatrix {
  const void* packed;  // values, then scales at scales_offset
  int64_t n, k;
  ops::QuantLayout layout;
  int64_t scales_offset;  // ops::quant_scales_offset(n, k, layout), computed on the host
  int scale_shift;        // log2(steps per scale): group / 32 (int4), block_k / 64 (fp8)
};

// log2 of the K steps that share a scale (a power of two: check_quant_kernel_shape).
inline int quant_scale_shift(const ops::QuantLayout& l) {
  const int64_t steps = l.quant == ops::WeightQuant::int4_group ? l.group_size / 32 : l.block_k / 64;
  int shift = 0;
  while ((int64_t{1} << shift) < steps) ++shift;
  return shift;
}

// Where row `row` of a packed matrix and its scales lie, for one lane.
template <QuantKind kQ>
struct QuantRow {
  const typename QuantStep<kQ>::Word* values;  // this lane's first word (step 0)
  int scale_shift;                             // step >> scale_shift: the step's scale (no division per step)
  const void* scales;                          // the row's scales (int4: bf16 [k / group]; fp8: fp32 row of blocks)
};

template <QuantKind kQ>
__device__ __forceinline__ QuantRow<kQ> quant_row(const QuantMatrix& m, int64_t row, int quad) {
  const char* base = static_cast<const char*>(m.packed);
  const int64_t scales_offset = m.scales_offset;
  if constexpr (kQ == QuantKind::int4) {
    const auto* words = reinterpret_cast<const uint32_t*>(base) + row * (m.k / 8) + quad;
    const auto* scales = reinterpret_cast<const bf16*>(base + scales_offset) + row * (m.k / m.layout.group_size);
    return {words, m.scale_shift, scales};
  } else {
    const auto* values = reinterpret_cast<const uint4*>(base + row * m.k) + quad;
    const int64_t block_cols = (m.k + m.layout.block_k - 1) / m.layout.block_k;
    const auto* scales = reinterpret_cast<const float*>(base + scales_offset) + (row / m.layout.block_n) * block_cols;
    return {values, m.scale_shift, scales};
  }
}

// The step's weight word of this lane (int4: word 4 * step + quad; fp8: uint4 4 * step + quad).
template <QuantKind kQ>
__device__ __forceinline__ typename QuantStep<kQ>::Word load_step(const QuantRow<kQ>& r, int step) {
  if constexpr (kQ == QuantKind::int4) {
    return __ldg(r.values + 4 * step);
  } else {
    return __ldg(r.values + 4 * step);
  }
}

// The scale of the step's elements (the step lies inside one group / block).
template <QuantKind kQ>
__device__ __forceinline__ float step_scale(const QuantRow<kQ>& r, int step) {
  if constexpr (kQ == QuantKind::int4) {
    return to_f(static_cast<const bf16*>(r.scales)[step >> r.scale_shift]);
  } else {
    return __ldg(static_cast<const float*>(r.scales) + (step >> r.scale_shift));
  }
}

// int4 word -> bf16x2 pairs (element j, element j + 4) of q = nibble - 8, exactly: the nibble
// is placed in the mantissa of bf16 128 (0x4300 | n = 128 + n), then 136 is subtracted.
__device__ __forceinline__ void int4_pairs(uint32_t word, uint32_t (&pair)[4]) {
  const __nv_bfloat162 bias = __floats2bfloat162_rn(136.0f, 136.0f);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t v = ((word >> (4 * j)) & 0x000f000fu) | 0x43004300u;
    __nv_bfloat162 b = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&v), bias);
    pair[j] = *reinterpret_cast<uint32_t*>(&b);
  }
}

// Two e4m3 bytes (low, high half of `bits`) -> bf16x2, exactly (through fp16, which holds
// every e4m3 value as a normal number, and fp32).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t bits) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(bits, __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<uint32_t*>(&b);
}

// The input fragment of one token for one step, in the weights' K permutation: b[s][0..1] the
// MMA's b0, b1 of k-step s. `x` points at the token's row; null: zeros (past the rows).
template <QuantKind kQ>
struct InputFragment {
  static constexpr int kSteps = kQ == QuantKind::int4 ? 2 : 4;
  uint32_t b[kSteps][2];
};

template <QuantKind kQ>
__device__ __forceinline__ void load_input(const bf16* x, int step, int quad, InputFragment<kQ>& f) {
  if constexpr (kQ == QuantKind::int4) {
    const uint4 v = x ? *reinterpret_cast<const uint4*>(x + step * 32 + 8 * quad) : make_uint4(0, 0, 0, 0);
    // v = (x0 x1, x2 x3, x4 x5, x6 x7): pairs (x0, x4), (x1, x5), (x2, x6), (x3, x7).
    f.b[0][0] = __byte_perm(v.x, v.z, 0x5410);
    f.b[0][1] = __byte_perm(v.x, v.z, 0x7632);
    f.b[1][0] = __byte_perm(v.y, v.w, 0x5410);
    f.b[1][1] = __byte_perm(v.y, v.w, 0x7632);
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(x + step * 64 + 16 * quad);
    const uint4 lo = x ? p[0] : make_uint4(0, 0, 0, 0), hi = x ? p[1] : make_uint4(0, 0, 0, 0);
    f.b[0][0] = lo.x, f.b[0][1] = lo.y, f.b[1][0] = lo.z, f.b[1][1] = lo.w;
    f.b[2][0] = hi.x, f.b[2][1] = hi.y, f.b[3][0] = hi.z, f.b[3][1] = hi.w;
  }
}

// The A fragments of one step from the words of rows group (w0) and group + 8 (w1).
template <QuantKind kQ>
struct WeightFragment {
  static constexpr int kSteps = InputFragment<kQ>::kSteps;
  uint32_t a[kSteps][4];
};

template <QuantKind kQ>
__device__ __forceinline__ void decode_weights(const typename QuantStep<kQ>::Word& w0,
                                               const typename QuantStep<kQ>::Word& w1, WeightFragment<kQ>& f) {
  if constexpr (kQ == QuantKind::int4) {
    uint32_t p0[4], p1[4];
    int4_pairs(w0, p0);
    int4_pairs(w1, p1);
    f.a[0][0] = p0[0], f.a[0][1] = p1[0], f.a[0][2] = p0[1], f.a[0][3] = p1[1];
    f.a[1][0] = p0[2], f.a[1][1] = p1[2], f.a[1][2] = p0[3], f.a[1][3] = p1[3];
  } else {
    const uint32_t r0[4] = {w0.x, w0.y, w0.z, w0.w}, r1[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int s = 0; s < 4; ++s) {  // k-step s: bytes 4s .. 4s + 3 of each row
      f.a[s][0] = fp8x2_to_bf16x2(static_cast<uint16_t>(r0[s] & 0xffffu));
      f.a[s][1] = fp8x2_to_bf16x2(static_cast<uint16_t>(r1[s] & 0xffffu));
      f.a[s][2] = fp8x2_to_bf16x2(static_cast<uint16_t>(r0[s] >> 16));
      f.a[s][3] = fp8x2_to_bf16x2(static_cast<uint16_t>(r1[s] >> 16));
    }
  }
}

// scale[u][rt][half]: the scales of steps s0 + u (0 past step_end or past the matrix).
// int4 group 32: the unroll's 8 scales of a row are one 16-byte load where aligned.
template <QuantKind kQ, int kRowTiles, int kUnroll>
__device__ __forceinline__ void load_scales(const QuantRow<kQ> (&rows)[kRowTiles][2], const bool (&row_ok)[2],
                                            const ops::QuantLayout& layout, int s0, int step_end,
                                            float (&scale)[kUnroll][kRowTiles][2]) {
  const bool whole = s0 + kUnroll <= step_end;
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if constexpr (kQ == QuantKind::int4 && kUnroll == 8) {
        const bf16* s = static_cast<const bf16*>(rows[rt][half].scales) + s0;
        if (whole && row_ok[half] && layout.group_size == 32 && reinterpret_cast<uintptr_t>(s) % 16 == 0) {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(s));
          const bf16* b = reinterpret_cast<const bf16*>(&v);
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) scale[u][rt][half] = to_f(b[u]);
          continue;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        scale[u][rt][half] = s0 + u < step_end && row_ok[half] ? step_scale<kQ>(rows[rt][half], s0 + u) : 0.0f;
    }
}

// acc[rt][i] += one K step's dot products of row tile rt's decoded weights a[rt] (scale[rt]
// [half]: the scales of rows group and group + 8) with one tile's input fragment b. Fragment
// layout of acc as mma_16x8x16's d.
template <QuantKind kQ, int kRowTiles>
__device__ __forceinline__ void tile_step_mma(const WeightFragment<kQ> (&a)[kRowTiles],
                                              const float (&scale)[kRowTiles][2], const InputFragment<kQ>& b,
                                              float (&acc)[kRowTiles][4]) {
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) {
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < InputFragment<kQ>::kSteps; ++s) mma_16x8x16(part, a[rt].a[s], b.b[s][0], b.b[s][1]);
    // d0, d1: row group; d2, d3: row group + 8.
    acc[rt][0] += scale[rt][0] * part[0];
    acc[rt][1] += scale[rt][0] * part[1];
    acc[rt][2] += scale[rt][1] * part[2];
    acc[rt][3] += scale[rt][1] * part[3];
  }
}

// acc[tile][rt][i] += one K step's dot products of row tile rt's rows (w[rt][half]: this
// lane's words of rows group (half 0) and group + 8 (half 1)) with the tiles' input fragments
// b[tile] (load_input).
template <QuantKind kQ, int kRowTiles, int kTiles>
__device__ __forceinline__ void quant_step_mma(const typename QuantStep<kQ>::Word (&w)[kRowTiles][2],
                                               const float (&scale)[kRowTiles][2], const InputFragment<kQ> (&b)[kTiles],
                                               int tiles, float (&acc)[kTiles][kRowTiles][4]) {
  WeightFragment<kQ> a[kRowTiles];
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) decode_weights<kQ>(w[rt][0], w[rt][1], a[rt]);
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    if (tile >= tiles) break;
    tile_step_mma<kQ, kRowTiles>(a, scale, b[tile], acc[tile]);
  }
}

// The same with the input rows x_rows[tile] (this lane's token of the tile, null past the
// rows) loaded here, at step `step`.
template <QuantKind kQ, int kRowTiles, int kTiles>
__device__ __forceinline__ void quant_step_dot(const typename QuantStep<kQ>::Word (&w)[kRowTiles][2],
                                               const float (&scale)[kRowTiles][2], const bf16* const (&x_rows)[kTiles],
                                               int tiles, int step, int quad, float (&acc)[kTiles][kRowTiles][4]) {
  InputFragment<kQ> b[kTiles];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
    if (tile < tiles) load_input<kQ>(x_rows[tile], step, quad, b[tile]);
  quant_step_mma<kQ, kRowTiles, kTiles>(w, scale, b, tiles, acc);
}

// acc[tile][rt][i] += the dot products over steps [step_begin, step_end) of row tile rt's rows
// (rows[rt][0]: row group, rows[rt][1]: row group + 8; row_ok: inside the matrix) with the
// tiles' input rows, the weights loaded straight from global memory (quant_stream.cuh stages
// them through shared memory instead), kUnroll steps' loads in flight per lane.
template <QuantKind kQ, int kRowTiles, int kTiles, int kUnroll = QuantStep<kQ>::kUnroll>
__device__ __forceinline__ void quant_rows_dot(const QuantRow<kQ> (&rows)[kRowTiles][2], const bool (&row_ok)[2],
                                               const ops::QuantLayout& layout, const bf16* const (&x_rows)[kTiles],
                                               int tiles, int step_begin, int step_end, int quad,
                                               float (&acc)[kTiles][kRowTiles][4]) {
  using Step = QuantStep<kQ>;
  using Word = typename Step::Word;
  for (int s0 = step_begin; s0 < step_end; s0 += kUnroll) {
    Word w[kUnroll][kRowTiles][2];
    float scale[kUnroll][kRowTiles][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const bool ok = s0 + u < step_end && row_ok[half];
          w[u][rt][half] = ok ? load_step<kQ>(rows[rt][half], s0 + u) : Word{};
        }
    load_scales<kQ, kRowTiles, kUnroll>(rows, row_ok, layout, s0, step_end, scale);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s0 + u >= step_end) break;
      // One tile's input fragment live at a time (not quant_step_dot's all tiles first, which
      // the streamed int4 kernel wants): fewer registers, as the fp8 kernel measured faster.
      WeightFragment<kQ> a[kRowTiles];
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt) decode_weights<kQ>(w[u][rt][0], w[u][rt][1], a[rt]);
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) {
        if (tile >= tiles) break;
        InputFragment<kQ> b;
        load_input<kQ>(x_rows[tile], s0 + u, quad, b);
        tile_step_mma<kQ, kRowTiles>(a, scale[u], b, acc[tile]);
      }
    }
  }
}

// The warps' partial sums added in warp order (every warp's lanes hold the same fragment
// layout); afterwards warp 0's acc holds the block's sums. Ends with the block synchronised.
template <int kWarps, int kRowTiles, int kTiles>
__device__ __forceinline__ void quant_block_reduce(float (&acc)[kTiles][kRowTiles][4], int tiles,
                                                   float (*partial)[kTiles][kRowTiles][4][32]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][tile][rt][i][lane] = acc[tile][rt][i];
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
      if (tile >= tiles) break;
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float sum = 0.0f;
          for (int w = 0; w < kWarps; ++w) sum += partial[w][tile][rt][i][lane];
          acc[tile][rt][i] = sum;
        }
    }
  }
}

// The K steps of warp `warp` (contiguous ranges; the last ones may be empty).
__device__ __forceinline__ void warp_steps(int steps, int warp, int warps, int& begin, int& end) {
  const int per_warp = (steps + warps - 1) / warps;
  begin = min(steps, warp * per_warp);
  end = min(steps, begin + per_warp);
}

}  // namespace moeserve::cuda
