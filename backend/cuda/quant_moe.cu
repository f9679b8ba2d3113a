// Grouped experts with packed quantized weights (ops/quant_layout.h), between moe.cu's sort
// and combine phases: the same two phases as moe.cu's tensor-core expert kernels, reading
// int4 / fp8 weights through quant_mma.cuh. grid (active experts, 16-row tiles): block x serves
// the x-th active expert and reads its 16 (gate_up: 16 gate + 16 up) weight rows once per 32
// routed rows, so a decode step reads each routed expert's weights once for all its tokens;
// no host synchronisation (CUDA-graph capturable) at any batch size.
//   gate_up: act[slot] = silu(gate) * up, gate = x[token of slot] @ W13[gate rows]^T (bf16
//     rounding points as moe.cu's kernels: gate, up, silu(gate), the product),
//   down: partial[slot] = act[slot] @ W2^T, rounded to a bf16 value in fp32 storage.
// int4 weights whose rows hold whole stages (int4_stream_supported) are streamed through
// shared memory (quant_stream.cuh) by a grid-stride loop over the work list of (active expert,
// 16-row tile) items, up to 32 routed rows per pass; other shapes and fp8 load the fragments
// straight from global memory, one block per item.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_workspace.cuh"
#include "backend/cuda/quant_mma.cuh"
#include "backend/cuda/quant_stream.cuh"

namespace moeserve::cuda {

namespace {

struct QuantExpertArgs {
  const bf16* x;                  // [tokens, hidden] (gate_up)
  const void* const* weights_of;  // [local experts] packed w13 or w2 (device table)
  ops::QuantLayout layout;
  int64_t scales_offset;  // the same in every expert's buffer (one shape)
  int scale_shift;
  MoeWorkspace ws;
  int top_k, k_dim, out_rows, inter;  // out_rows: inter (gate_up) or hidden (down)
  // Streamed kernels: the experts with routed rows in (rows_above, rows_upto] (the split
  // between the one-tile and the four-tile kernel); the others are skipped.
  int rows_above = 0, rows_upto = 1 << 30;
};

// Warp 0's block sums of one pass (fragment layout of mma_16x8x16's d) to act (gate_up) or
// partial (down) at slots [first, end).
template <int kRowTiles, int kTiles>
__device__ __forceinline__ void store_outputs(const QuantExpertArgs& a, const float (&acc)[kTiles][kRowTiles][4],
                                              int tiles, int first, int end, int n0, int lane) {
  const int group = lane >> 2, quad = lane & 3;
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    if (tile >= tiles) break;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = n0 + group + 8 * (i >> 1), slot = first + tile * kQuantTileTokens + 2 * quad + (i & 1);
      if (n >= a.out_rows || slot >= end) continue;
      if constexpr (kRowTiles == 2) {
        // transformers (bf16): gate and up are bf16 linear outputs; silu(gate) is rounded too.
        const float g = to_f(to_bf(acc[tile][0][i])), u = to_f(to_bf(acc[tile][1][i]));
        a.ws.act[static_cast<int64_t>(slot) * a.inter + n] = to_bf(to_f(to_bf(g / (1.0f + __expf(-g)))) * u);
      } else {
        a.ws.partial[static_cast<int64_t>(slot) * a.out_rows + n] = to_f(to_bf(acc[tile][0][i]));
      }
    }
  }
}

// This lane's input row of each token tile of the pass at slot `first` (null past the rows):
// gate_up the token's x row, down the slot's act row.
template <int kRowTiles, int kTiles>
__device__ __forceinline__ void input_rows(const QuantExpertArgs& a, int first, int end, int tiles, int group,
                                           const bf16* (&x_rows)[kTiles]) {
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    const int slot = first + tile * kQuantTileTokens + group;
    x_rows[tile] = nullptr;
    if (tile < tiles && slot < end)
      x_rows[tile] = kRowTiles == 2 ? a.x + static_cast<int64_t>(a.ws.pair_of_slot[slot] / a.top_k) * a.k_dim
                                    : a.ws.act + static_cast<int64_t>(slot) * a.k_dim;
  }
}

// kRowTiles = 2: gate_up (tile 0 the gate rows n, tile 1 the up rows inter + n); 1: down.
template <QuantKind kQ, int kRowTiles, int kTiles>
__global__ void __launch_bounds__(kQuantWarps * 32, kTiles == 1 ? 4 : 1) quant_expert_kernel(const QuantExpertArgs a) {
  __shared__ float partial[kQuantWarps][kTiles][kRowTiles][4][32];  // 8-16 KB
  pdl_enter();
  const MoeWorkspace& ws = a.ws;
  if (static_cast<int>(blockIdx.x) >= *ws.num_active) return;
  const int e = ws.active[blockIdx.x];
  const int begin = ws.offsets[e], end = ws.offsets[e + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, quad = lane & 3;
  const int n0 = blockIdx.y * 16;
  const QuantMatrix m{a.weights_of[e], kRowTiles * static_cast<int64_t>(a.out_rows), a.k_dim, a.layout, a.scales_offset,
                      a.scale_shift};
  QuantRow<kQ> rows[kRowTiles][2];
  bool row_ok[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int n = n0 + group + 8 * half;
    row_ok[half] = n < a.out_rows;
#pragma unroll
    for (int rt = 0; rt < kRowTiles; ++rt)
      rows[rt][half] = quant_row<kQ>(m, rt * a.inter + (row_ok[half] ? n : 0), quad);
  }
  int step_begin, step_end;
  warp_steps(a.k_dim / QuantStep<kQ>::kElems, warp, kQuantWarps, step_begin, step_end);
  for (int first = begin; first < end; first += (kQuantTileTokens * kTiles)) {
    const int tiles = min(kTiles, (end - first + kQuantTileTokens - 1) / kQuantTileTokens);
    const bf16* x_rows[kTiles];
    input_rows<kRowTiles, kTiles>(a, first, end, tiles, group, x_rows);
    float acc[kTiles][kRowTiles][4] = {};
    quant_rows_dot<kQ, kRowTiles, kTiles>(rows, row_ok, a.layout, x_rows, tiles, step_begin, step_end, quad, acc);
    quant_block_reduce<kQuantWarps, kRowTiles, kTiles>(acc, tiles, partial);
    if (warp == 0) store_outputs<kRowTiles, kTiles>(a, acc, tiles, first, end, n0, lane);
    __syncthreads();  // partial[] is rewritten by the next pass
  }
}

// The tile's weight rows (quant_stream.cuh): gate_up rows n0 .. and inter + n0 .., down n0 ...
template <int kRowTiles>
__device__ __forceinline__ StreamRows stream_rows(const QuantExpertArgs& a, const void* weights, int n0) {
  const auto* base = static_cast<const char*>(weights);
  StreamRows m{base, base + a.scales_offset, a.k_dim / 2, a.k_dim / a.layout.group_size * 2, {}, {}, a.scale_shift};
#pragma unroll
  for (int rt = 0; rt < 2; ++rt) {
    m.first[rt] = static_cast<int64_t>(rt) * a.inter + n0;
    m.last[rt] = static_cast<int64_t>(rt) * a.inter + min(n0 + 15, a.out_rows - 1);
  }
  return m;
}

// Token tiles per pass of the streamed kernel: 4 (32 routed rows per read of the weights) for
// many rows per expert, 1 at decode sizes (fewer registers, inputs loaded a stage ahead:
// measured 20% faster at one token per expert).
constexpr int kStreamMaxTiles = 4;

template <int kRowTiles>
constexpr int int4_stream_smem_bytes() {
  constexpr int stages = kQuantWarps * Int4Stream<kRowTiles>::kWarpBytes;
  constexpr int partial = kQuantWarps * kStreamMaxTiles * kRowTiles * 4 * 32 * 4;  // quant_block_reduce's
  return stages > partial ? stages : partial;
}

// int4, streamed: blocks loop over the items (active expert, 16-row tile) of the work list;
// per item, passes of up to kTiles token tiles, each streaming the tile's weights.
template <int kRowTiles, int kTiles>
__global__ void __launch_bounds__(kQuantWarps * 32, 4) int4_stream_expert_kernel(const QuantExpertArgs a) {
  extern __shared__ __align__(16) char smem[];  // the warps' stages, then quant_block_reduce's partial sums
  pdl_enter();
  const MoeWorkspace& ws = a.ws;
  const int row_tiles = (a.out_rows + 15) / 16, items = *ws.num_active * row_tiles;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int step_begin, step_end;
  stream_warp_steps(a.k_dim / 32, warp, kQuantWarps, step_begin, step_end);
  char* warp_smem = smem + warp * Int4Stream<kRowTiles>::kWarpBytes;
  auto* partial = reinterpret_cast<float(*)[kTiles][kRowTiles][4][32]>(smem);
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int e = ws.active[item / row_tiles], n0 = (item % row_tiles) * 16;
    const int begin = ws.offsets[e], end = ws.offsets[e + 1];
    if (end - begin <= a.rows_above || end - begin > a.rows_upto) continue;  // the other kernel's expert
    const StreamRows rows = stream_rows<kRowTiles>(a, a.weights_of[e], n0);
    for (int first = begin; first < end; first += kQuantTileTokens * kTiles) {
      const int tiles = min(kTiles, (end - first + kQuantTileTokens - 1) / kQuantTileTokens);
      const bf16* x_rows[kTiles];
      input_rows<kRowTiles, kTiles>(a, first, end, tiles, lane >> 2, x_rows);
      float acc[kTiles][kRowTiles][4] = {};
      int4_stream_dot<kRowTiles, kTiles>(rows, warp_smem, step_begin, step_end, x_rows, tiles, lane, acc);
      __syncthreads();  // every warp is done with its stages: partial[] reuses them
      quant_block_reduce<kQuantWarps, kRowTiles, kTiles>(acc, tiles, partial);
      if (warp == 0) store_outputs<kRowTiles, kTiles>(a, acc, tiles, first, end, n0, lane);
      __syncthreads();  // partial[] is rewritten by the next pass
    }
  }
}

// Resident blocks per SM times this: enough blocks that the GPU stays full, few enough that a
// step whose routing hits few experts does not launch hundreds of empty blocks per SM.
constexpr int kStreamBlocksPerSm = 16;

template <int kRowTiles, int kTiles>
void launch_int4_stream(const QuantExpertArgs& args, int64_t active, cudaStream_t stream) {
  constexpr int bytes = int4_stream_smem_bytes<kRowTiles>();
  auto* kernel = int4_stream_expert_kernel<kRowTiles, kTiles>;
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // Above the 48 KB default: set on every launch (per device, cheap, allowed while capturing).
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  const int64_t items = active * ((args.out_rows + 15) / 16);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(items, int64_t{kStreamBlocksPerSm} * std::max(1, sms)));
  launch_pdl(kernel, dim3(blocks), kQuantWarps * 32, bytes, stream, args);
}

// The two launches' arguments: w13 (gate_up) and w2 (down).
QuantExpertArgs expert_args(const MoeExpertsLaunch& m, const MoeWorkspace& ws, bool gate_up) {
  const ops::MoeExpertsParams& p = m.op;
  const int top_k = static_cast<int>(p.top_k), hidden = static_cast<int>(p.hidden), inter = static_cast<int>(p.inter);
  if (gate_up)
    return {static_cast<const bf16*>(p.x),
            p.w13,
            p.expert_quant,
            ops::quant_scales_offset(2 * p.inter, p.hidden, p.expert_quant),
            quant_scale_shift(p.expert_quant),
            ws,
            top_k,
            hidden,
            inter,
            inter};
  return {nullptr,
          p.w2,
          p.expert_quant,
          ops::quant_scales_offset(p.hidden, p.inter, p.expert_quant),
          quant_scale_shift(p.expert_quant),
          ws,
          top_k,
          inter,
          hidden,
          inter};
}

template <QuantKind kQ, int kTiles, int kRowTiles>
void launch_direct(const QuantExpertArgs& args, unsigned active, cudaStream_t stream) {
  launch_pdl(quant_expert_kernel<kQ, kRowTiles, kTiles>, dim3(active, static_cast<unsigned>((args.out_rows + 15) / 16)),
             kQuantWarps * 32, 0, stream, args);
}

// int4, streamed: the one-tile kernel takes the experts with at most 8 routed rows; with more
// tokens than that, the four-tile kernel follows for the others (decided on the device: the
// synthetic and real routings concentrate some layers on few experts, where one tile per pass
// would re-read the weights up to 8 times). A row's arithmetic is the same in both.
template <int kRowTiles>
void launch_int4_streams(QuantExpertArgs args, const MoeExpertsLaunch& m, int64_t active, cudaStream_t stream) {
  if (m.op.tokens <= kQuantTileTokens) return launch_int4_stream<kRowTiles, 1>(args, active, stream);
  args.rows_upto = kQuantTileTokens;
  launch_int4_stream<kRowTiles, 1>(args, active, stream);
  args.rows_above = kQuantTileTokens;
  args.rows_upto = 1 << 30;
  launch_int4_stream<kRowTiles, kStreamMaxTiles>(args, active, stream);
}

template <QuantKind kQ, int kTiles>
void launch_quant_experts(const MoeExpertsLaunch& m, const MoeWorkspace& ws, cudaStream_t stream) {
  const ops::MoeExpertsParams& p = m.op;
  const unsigned active = static_cast<unsigned>(std::min(m.local_experts, m.pairs));
  const QuantExpertArgs gate_up = expert_args(m, ws, true), down = expert_args(m, ws, false);
  if (kQ == QuantKind::int4 && int4_stream_supported(p.hidden, p.expert_quant)) {
    launch_int4_streams<2>(gate_up, m, active, stream);
  } else {
    launch_direct<kQ, kTiles, 2>(gate_up, active, stream);
  }
  if (kQ == QuantKind::int4 && int4_stream_supported(p.inter, p.expert_quant)) {
    launch_int4_streams<1>(down, m, active, stream);
  } else {
    launch_direct<kQ, kTiles, 1>(down, active, stream);
  }
}

}  // namespace

void launch_moe_quant_expert_kernels(const MoeExpertsLaunch& m, cudaStream_t stream) {
  const ops::MoeExpertsParams& p = m.op;
  check_quant_kernel_shape("moe_experts w13", 2 * p.inter, p.hidden, p.expert_quant);
  check_quant_kernel_shape("moe_experts w2", p.hidden, p.inter, p.expert_quant);
  if (!aligned16({p.x})) throw std::invalid_argument("moe_experts (quantized weights): x must be 16-byte aligned");
  if (m.pairs == 0 || m.local_experts == 0) return;
  const MoeWorkspace ws = carve(m.workspace, m.pairs, m.local_experts, p.hidden, p.inter);
  // Expected rows per active expert (from the routing's expectation, known on the host):
  // one token tile per pass at decode sizes, four above.
  const int64_t active = std::max<int64_t>(1, std::min(m.local_experts, m.local_pairs));
  const bool many = m.local_pairs > kQuantRowsForManyTiles * active;
  const bool int4 = p.expert_quant.quant == ops::WeightQuant::int4_group;
  if (int4) {
    many ? launch_quant_experts<QuantKind::int4, kQuantMaxTiles>(m, ws, stream)
         : launch_quant_experts<QuantKind::int4, 1>(m, ws, stream);
  } else {
    many ? launch_quant_experts<QuantKind::fp8, kQuantMaxTiles>(m, ws, stream)
         : launch_quant_experts<QuantKind::fp8, 1>(m, ws, stream);
  }
}

}  // namespace moeserve::cuda
