// Grouped experts with packed quantized weights (ops/quant_layout.h), between moe.cu's sort
// and combine phases: the same two phases as moe.cu's tensor-core expert kernels, reading
// int4 / fp8 weights through quant_mma.cuh. grid (active experts, 16-row tiles): block x serves
// the x-th active expert and reads its 16 (gate_up: 16 gate + 16 up) weight rows once per 32
// routed rows, so a decode step reads each routed expert's weights once for all its tokens;
// no host synchronisation (CUDA-graph capturable) at any batch size.
//   gate_up: act[slot] = silu(gate) * up, gate = x[token of slot] @ W13[gate rows]^T (bf16
//     rounding points as moe.cu's kernels: gate, up, silu(gate), the product),
//   down: partial[slot] = act[slot] @ W2^T, rounded to a bf16 value in fp32 storage.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_workspace.cuh"
#include "backend/cuda/quant_mma.cuh"

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
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
      const int slot = first + tile * kQuantTileTokens + group;
      x_rows[tile] = nullptr;
      if (tile < tiles && slot < end)
        x_rows[tile] = kRowTiles == 2 ? a.x + static_cast<int64_t>(ws.pair_of_slot[slot] / a.top_k) * a.k_dim
                                      : ws.act + static_cast<int64_t>(slot) * a.k_dim;
    }
    float acc[kTiles][kRowTiles][4] = {};
    quant_rows_dot<kQ, kRowTiles, kTiles>(rows, row_ok, a.layout, x_rows, tiles, step_begin, step_end, quad, acc);
    quant_block_reduce<kQuantWarps, kRowTiles, kTiles>(acc, tiles, partial);
    if (warp == 0) store_outputs<kRowTiles, kTiles>(a, acc, tiles, first, end, n0, lane);
    __syncthreads();  // partial[] is rewritten by the next pass
  }
}

template <QuantKind kQ, int kTiles>
void launch_quant_experts(const MoeExpertsLaunch& m, const MoeWorkspace& ws, cudaStream_t stream) {
  const ops::MoeExpertsParams& p = m.op;
  const unsigned active = static_cast<unsigned>(std::min(m.local_experts, m.pairs));
  const int top_k = static_cast<int>(p.top_k), hidden = static_cast<int>(p.hidden), inter = static_cast<int>(p.inter);
  const QuantExpertArgs gate_up{static_cast<const bf16*>(p.x),
                                p.w13,
                                p.expert_quant,
                                ops::quant_scales_offset(2 * p.inter, p.hidden, p.expert_quant),
                                quant_scale_shift(p.expert_quant),
                                ws,
                                top_k,
                                hidden,
                                inter,
                                inter};
  launch_pdl(quant_expert_kernel<kQ, 2, kTiles>, dim3(active, static_cast<unsigned>((inter + 15) / 16)),
             kQuantWarps * 32, 0, stream, gate_up);
  const QuantExpertArgs down{nullptr,
                             p.w2,
                             p.expert_quant,
                             ops::quant_scales_offset(p.hidden, p.inter, p.expert_quant),
                             quant_scale_shift(p.expert_quant),
                             ws,
                             top_k,
                             inter,
                             hidden,
                             inter};
  launch_pdl(quant_expert_kernel<kQ, 1, kTiles>, dim3(active, static_cast<unsigned>((hidden + 15) / 16)),
             kQuantWarps * 32, 0, stream, down);
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
