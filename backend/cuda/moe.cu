// MoE on the device: the DeepSeek-V3 router and the grouped expert computation.
//
// Grouped experts, all device-side (no host synchronisation, CUDA-graph capturable):
//   1-2. sort_pairs_kernel (one block): count the (token, k) pairs routed to each local
//      expert, scan to offsets, scatter pair ids into expert order (slot_of[t * top_k + k] =
//      position or -1),
//   3. gate/up: one warp per weight row pair streams the row once and multiplies it with
//      every token routed to that expert; writes act = silu(gate) * up,
//   4. down: the same over w2 rows; fp32 partial rows per pair,
//   5. combine: out[t] = sum over k (in k order) of weight[t, k] * partial[slot], so the
//      result does not depend on the order pairs were scattered in.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/moe_workspace.cuh"
#include "backend/cuda/row_dot.cuh"
#include "cuda_common/common.cuh"

namespace moeserve::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;
// Weight rows per warp: 4 when many experts are active (fewer, longer-lived warps); 1 for a
// handful of experts (decode at small batch), where 4 leaves ~1.3 waves of warps and the
// last, part-empty wave dominates.
constexpr int kRowsPerWarpMany = 4;
constexpr int kRowsPerWarpFew = 1;
constexpr int64_t kFewActiveExperts = 16;

// Lexicographic "better": larger score, then smaller index (the CPU reference's order).
__device__ __forceinline__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// Warp-wide argmax over values[0..n) skipping taken[]; returns the index (or -1).
__device__ int warp_argmax(const float* values, const bool* taken, int n) {
  const int lane = threadIdx.x & 31;
  float best = -INFINITY;
  int best_i = -1;
  for (int i = lane; i < n; i += 32)
    if (!taken[i] && (best_i < 0 || better(values[i], i, best, best_i))) {
      best = values[i];
      best_i = i;
    }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int other_i = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (other_i >= 0 && (best_i < 0 || better(other, other_i, best, best_i))) {
      best = other;
      best_i = other_i;
    }
  }
  return best_i;
}

// Router logits [T, E] = x [T, H] @ W [E, H]^T in fp32: one block per expert and up to
// kRouteTokens tokens; the block's warps split the hidden dimension (so that at batch 1 the
// 11 MB fp32 router weight of 384 experts has enough loads in flight to stream at HBM rate)
// and add their partial sums in shared memory, in warp order.
constexpr int kRouteTokens = 8;
constexpr int kRouteWarps = 4;

__global__ void __launch_bounds__(kRouteWarps * 32)
    router_logits_kernel(const bf16* x, const float* weight, float* logits, int tokens, int hidden, int experts) {
  __shared__ float partial[kRouteWarps][kRouteTokens];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int e = blockIdx.x;
  const int t0 = blockIdx.y * kRouteTokens;
  const int count = min(kRouteTokens, tokens - t0);
  const float* w = weight + static_cast<int64_t>(e) * hidden;
  // The expert's whole row (28 KB at hidden 7168; all 384 blocks are resident at once), each
  // warp a quarter, asked of L2 while the previous kernel finishes.
  {
    const int64_t row_bytes = static_cast<int64_t>(hidden) * 4, share = (row_bytes / kRouteWarps + 127) / 128 * 128;
    const int64_t begin = min(row_bytes, warp * share);
    if (blockIdx.y == 0) warp_prefetch_l2(reinterpret_cast<const char*>(w) + begin, min(share, row_bytes - begin));
  }
  pdl_enter();
  float acc[kRouteTokens];
#pragma unroll
  for (int j = 0; j < kRouteTokens; ++j) acc[j] = 0.0f;
  // Four consecutive weights per thread per load (16 bytes; hidden % 4 == 0 is checked), two
  // loads in flight per thread before they are used.
  constexpr int kUnroll = 2;
  constexpr int kStride = kRouteWarps * 32 * 4;
  for (int base = threadIdx.x * 4; base < hidden; base += kStride * kUnroll) {
    float4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kStride;
      wv[u] = i < hidden ? *reinterpret_cast<const float4*>(w + i) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kStride;
      if (i >= hidden) break;
#pragma unroll
      for (int j = 0; j < kRouteTokens; ++j) {
        if (j >= count) break;
        const bf16* xr = x + static_cast<int64_t>(t0 + j) * hidden + i;
        acc[j] += wv[u].x * to_f(xr[0]) + wv[u].y * to_f(xr[1]) + wv[u].z * to_f(xr[2]) + wv[u].w * to_f(xr[3]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRouteTokens; ++j) {
    const float total = warp_sum(acc[j]);
    if (lane == 0) partial[warp][j] = total;
  }
  __syncthreads();
  if (threadIdx.x < count) {
    float total = 0.0f;
#pragma unroll
    for (int w2 = 0; w2 < kRouteWarps; ++w2) total += partial[w2][threadIdx.x];
    logits[static_cast<int64_t>(t0 + threadIdx.x) * experts + e] = total;
  }
}

// Selection, one warp per token: sigmoid scores, biased choice scores, group-limited top-k.
__global__ void route_select_kernel(const float* logits, const ops::MoeRouteParams p) {
  const float* const bias = p.bias;
  int32_t* const topk_ids = p.topk_ids;
  float* const topk_weights = p.topk_weights;
  const int experts = static_cast<int>(p.experts), n_group = static_cast<int>(p.n_group);
  const int topk_group = static_cast<int>(p.topk_group), top_k = static_cast<int>(p.top_k);
  const bool norm_topk_prob = p.norm_topk_prob;
  const float scaling = p.routed_scaling_factor;
  pdl_enter();
  extern __shared__ float shared[];
  float* scores = shared;                                         // [experts]
  float* choice = scores + experts;                               // [experts]
  float* group_scores = choice + experts;                         // [n_group]
  bool* taken = reinterpret_cast<bool*>(group_scores + n_group);  // [max(experts, n_group)]
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  for (int e = lane; e < experts; e += 32) {
    scores[e] = 1.0f / (1.0f + expf(-logits[static_cast<int64_t>(t) * experts + e]));
    choice[e] = scores[e] + bias[e];
  }
  __syncwarp();
  const int group_size = experts / n_group;
  if (topk_group < n_group) {  // group-limited: only the topk_group best groups compete
    // Group score: the sum of the group's two best biased scores.
    for (int g = lane; g < n_group; g += 32) {
      float best = -INFINITY, second = -INFINITY;
      for (int e = g * group_size; e < (g + 1) * group_size; ++e) {
        if (choice[e] > best) {
          second = best;
          best = choice[e];
        } else if (choice[e] > second) {
          second = choice[e];
        }
      }
      group_scores[g] = best + second;
    }
    for (int g = lane; g < n_group; g += 32) taken[g] = false;
    __syncwarp();
    // Keep topk_group groups: mark the kept ones in `keep` bits (n_group <= 64).
    unsigned long long keep = 0;
    for (int i = 0; i < topk_group; ++i) {
      const int g = warp_argmax(group_scores, taken, n_group);
      __syncwarp();
      if (lane == 0) taken[g] = true;
      keep |= 1ull << g;
      __syncwarp();
    }
    for (int e = lane; e < experts; e += 32)
      if (!((keep >> (e / group_size)) & 1ull)) choice[e] = -INFINITY;
    __syncwarp();
  }
  for (int e = lane; e < experts; e += 32) taken[e] = false;
  __syncwarp();
  float sum = 0.0f;
  for (int k = 0; k < top_k; ++k) {
    const int e = warp_argmax(choice, taken, experts);
    __syncwarp();
    if (lane == 0) {
      taken[e] = true;
      topk_ids[static_cast<int64_t>(t) * top_k + k] = e;
      topk_weights[static_cast<int64_t>(t) * top_k + k] = scores[e];
    }
    sum += scores[e];
    __syncwarp();
  }
  if (lane == 0) {
    const float denom = sum + 1e-20f;
    for (int k = 0; k < top_k; ++k) {
      float w = topk_weights[static_cast<int64_t>(t) * top_k + k];
      if (norm_topk_prob) w /= denom;
      topk_weights[static_cast<int64_t>(t) * top_k + k] = w * scaling;
    }
  }
}

// The same selection without group limits (topk_group == n_group, as Kimi K2's single group),
// from registers, one block of kThreads per token: thread i holds experts i, i + kThreads, ...
// (kPerThread of them); each of the top_k rounds takes the block's best (larger choice score,
// then smaller id: the reference's order) -- a warp reduction, then the warps' bests through
// shared memory -- and retires it. Same scores, order and sum whatever the block size. One warp
// per token serves many tokens; at decode sizes a single warp walking 12 experts per lane
// through top_k rounds is a serial chain (~10 us on an H200 for 384 experts, top 8), so a
// token gets four warps there. The general kernel above keeps the scores in shared memory and
// rescans them every round.
struct Pick {
  float choice;  // -inf: retired or missing
  int id;        // -1: none
  float score;
};

__device__ __forceinline__ void keep_better(Pick& best, const Pick& other) {
  if (other.id >= 0 && (best.id < 0 || better(other.choice, other.id, best.choice, best.id))) best = other;
}

template <int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads)
    route_select_register_kernel(const float* logits, const float* bias, int32_t* topk_ids, float* topk_weights,
                                 int experts, int top_k, bool norm_topk_prob, float scaling) {
  pdl_enter();
  constexpr int kWarps = kThreads / 32;
  __shared__ Pick warp_best[kWarps];
  __shared__ float picked[32];
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float score[kPerThread], choice[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int e = threadIdx.x + kThreads * j;
    score[j] = e < experts ? 1.0f / (1.0f + expf(-logits[static_cast<int64_t>(t) * experts + e])) : 0.0f;
    choice[j] = e < experts ? score[j] + bias[e] : -INFINITY;
  }
  float sum = 0.0f;
  for (int k = 0; k < top_k; ++k) {
    Pick best{-INFINITY, -1, 0.0f};
#pragma unroll
    for (int j = 0; j < kPerThread; ++j)  // ids grow with j: '>' keeps the smallest on ties
      if (choice[j] > best.choice) best = Pick{choice[j], static_cast<int>(threadIdx.x) + kThreads * j, score[j]};
    for (int offset = 16; offset > 0; offset >>= 1)
      keep_better(best,
                  Pick{__shfl_xor_sync(0xffffffffu, best.choice, offset), __shfl_xor_sync(0xffffffffu, best.id, offset),
                       __shfl_xor_sync(0xffffffffu, best.score, offset)});
    if (kWarps > 1) {
      if (lane == 0) warp_best[warp] = best;
      __syncthreads();
      best = warp_best[0];
      for (int w = 1; w < kWarps; ++w) keep_better(best, warp_best[w]);
      __syncthreads();  // the next round rewrites the warps' bests
    }
#pragma unroll
    for (int j = 0; j < kPerThread; ++j)
      if (static_cast<int>(threadIdx.x) + kThreads * j == best.id) choice[j] = -INFINITY;
    if (threadIdx.x == 0) {
      topk_ids[static_cast<int64_t>(t) * top_k + k] = best.id;
      picked[k] = best.score;
    }
    sum += best.score;
  }
  __syncthreads();  // picked[] of the last round
  if (threadIdx.x < top_k) {
    const float weight = norm_topk_prob ? picked[threadIdx.x] / (sum + 1e-20f) : picked[threadIdx.x];
    topk_weights[static_cast<int64_t>(t) * top_k + threadIdx.x] = weight * scaling;
  }
}

constexpr int kSelectPerLane = 16;         // one warp per token: experts <= 512
constexpr int kSelectThreads = 128;        // decode sizes: four warps per token,
constexpr int kSelectPerThread = 8;        //   experts <= 1024
constexpr int64_t kBlockSelectTokens = 8;  // tokens up to which a token gets four warps

// Sorts the (token, k) pairs by local expert in one block (one launch: at decode sizes the
// step is latency-bound, and the former memset / count / scan / scatter chain cost four):
//   1. counts[e] in shared memory (atomics),
//   2. exclusive scan of the counts and of the active flags: each thread owns a contiguous
//      run of experts, a warp-shuffle scan and a scan of the warp totals combine them,
//   3. offsets, the active list (in expert order) and the number of active experts,
//   4. scatter: slot_of_pair / pair_of_slot through per-expert cursors in shared memory.
// The order of pairs within an expert depends on atomics, but no result does: each slot is
// computed alone and combine_kernel adds a token's pairs in k order.
constexpr int kSortThreads = 1024;

__device__ __forceinline__ int warp_inclusive_scan(int v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

__global__ void __launch_bounds__(kSortThreads)
    sort_pairs_kernel(const int32_t* ids, int pairs, int expert_begin, int expert_end, MoeWorkspace ws) {
  pdl_enter();
  extern __shared__ int32_t cursor[];  // [local]: counts, then the next free slot per expert
  __shared__ int32_t warp_rows[kSortThreads / 32], warp_active[kSortThreads / 32];
  const int local = expert_end - expert_begin;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < local; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int i = tid; i < pairs; i += blockDim.x) {
    const int e = ids[i];
    if (e >= expert_begin && e < expert_end) atomicAdd(&cursor[e - expert_begin], 1);
  }
  __syncthreads();
  const int per_thread = (local + blockDim.x - 1) / blockDim.x;
  const int lo = min(local, tid * per_thread), hi = min(local, lo + per_thread);
  int rows = 0, active = 0;
  for (int e = lo; e < hi; ++e) {
    rows += cursor[e];
    active += cursor[e] > 0;
  }
  const int rows_incl = warp_inclusive_scan(rows), active_incl = warp_inclusive_scan(active);
  if (lane == 31) {
    warp_rows[warp] = rows_incl;
    warp_active[warp] = active_incl;
  }
  __syncthreads();
  if (warp == 0) {
    const int n = lane < static_cast<int>(blockDim.x >> 5) ? warp_rows[lane] : 0;
    const int a = lane < static_cast<int>(blockDim.x >> 5) ? warp_active[lane] : 0;
    const int n_incl = warp_inclusive_scan(n), a_incl = warp_inclusive_scan(a);
    if (lane < static_cast<int>(blockDim.x >> 5)) {
      warp_rows[lane] = n_incl - n;  // exclusive prefix of the warps before
      warp_active[lane] = a_incl - a;
    }
    if (lane == 31) {
      ws.offsets[local] = n_incl;
      *ws.num_active = a_incl;
    }
  }
  __syncthreads();
  int row = warp_rows[warp] + rows_incl - rows, slot = warp_active[warp] + active_incl - active;
  for (int e = lo; e < hi; ++e) {
    const int count = cursor[e];
    ws.offsets[e] = row;
    if (count > 0) ws.active[slot++] = e;
    cursor[e] = row;
    row += count;
  }
  __syncthreads();
  for (int i = tid; i < pairs; i += blockDim.x) {
    const int e = ids[i];
    if (e >= expert_begin && e < expert_end) {
      const int32_t at = atomicAdd(&cursor[e - expert_begin], 1);
      ws.pair_of_slot[at] = i;
      ws.slot_of_pair[i] = at;
    } else {
      ws.slot_of_pair[i] = -1;
    }
  }
}

// grid (max active experts, ceil(inter / (kWarpsPerBlock * rows_per_warp))): block x serves the
// x-th active expert, so a decode step launches blocks for the experts it routes to only.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gate_up_kernel(const bf16* x, const void* const* w13, MoeWorkspace ws, int top_k, int hidden, int inter,
                   int rows_per_warp) {
  pdl_enter();
  if (static_cast<int>(blockIdx.x) >= *ws.num_active) return;
  const int e = ws.active[blockIdx.x];
  const int begin = ws.offsets[e], end = ws.offsets[e + 1];
  if (begin == end) return;
  const bf16* weights = static_cast<const bf16*>(w13[e]);  // [2 * inter, hidden]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int rr = 0; rr < rows_per_warp; ++rr) {
    const int n = (blockIdx.y * kWarpsPerBlock + warp) * rows_per_warp + rr;
    if (n >= inter) return;
    const bf16* const rows[2] = {weights + static_cast<int64_t>(n) * hidden,
                                 weights + static_cast<int64_t>(inter + n) * hidden};
    for (int first = begin; first < end; first += kTokensPerPass) {
      const int count = min(kTokensPerPass, end - first);
      const bf16* x_rows[kTokensPerPass];
#pragma unroll
      for (int j = 0; j < kTokensPerPass; ++j)
        x_rows[j] = x + static_cast<int64_t>(ws.pair_of_slot[first + min(j, count - 1)] / top_k) * hidden;
      float acc[2][kTokensPerPass];
      rows_dot_tokens<2>(rows, x_rows, count, hidden, acc);
      if (lane == 0)
        for (int j = 0; j < count; ++j) {
          // transformers (bf16): gate and up are bf16 linear outputs; silu(gate) is rounded too.
          const float g = to_f(to_bf(acc[0][j])), u = to_f(to_bf(acc[1][j]));
          ws.act[static_cast<int64_t>(first + j) * inter + n] = to_bf(to_f(to_bf(g / (1.0f + __expf(-g)))) * u);
        }
    }
  }
}

// grid (max active experts, ceil(hidden / (kWarpsPerBlock * rows_per_warp)))
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    down_kernel(const void* const* w2, MoeWorkspace ws, int hidden, int inter, int rows_per_warp) {
  pdl_enter();
  if (static_cast<int>(blockIdx.x) >= *ws.num_active) return;
  const int e = ws.active[blockIdx.x];
  const int begin = ws.offsets[e], end = ws.offsets[e + 1];
  if (begin == end) return;
  const bf16* weights = static_cast<const bf16*>(w2[e]);  // [hidden, inter]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int rr = 0; rr < rows_per_warp; ++rr) {
    const int n = (blockIdx.y * kWarpsPerBlock + warp) * rows_per_warp + rr;
    if (n >= hidden) return;
    const bf16* const rows[1] = {weights + static_cast<int64_t>(n) * inter};
    for (int first = begin; first < end; first += kTokensPerPass) {
      const int count = min(kTokensPerPass, end - first);
      const bf16* act_rows[kTokensPerPass];
#pragma unroll
      for (int j = 0; j < kTokensPerPass; ++j)
        act_rows[j] = ws.act + static_cast<int64_t>(first + min(j, count - 1)) * inter;
      float acc[1][kTokensPerPass];
      rows_dot_tokens<1>(rows, act_rows, count, inter, acc);
      if (lane == 0)
        for (int j = 0; j < count; ++j)
          ws.partial[static_cast<int64_t>(first + j) * hidden + n] = to_f(to_bf(acc[0][j]));
    }
  }
}

// The same two phases on tensor cores ("swap AB": the weights are the MMA's M side, 16 rows per
// block, the expert's tokens its N side, 8 per tile), for K a multiple of 32. A block of
// kExpertMmaWarps warps takes 16 output rows of one active expert (gate_up: gate rows n0.. and
// the matching up rows, so silu(gate) * up is formed in registers; down: w2 rows n0..); its
// warps split K into contiguous ranges, each streams its range of the rows once with 16-byte
// loads and multiplies it with every token tile, and the warps' fp32 partial sums are added in
// warp order in shared memory. The CUDA-core kernels above spend ~3 instructions per
// multiply-add; with ~6 tokens per expert (Moonlight at batch 64) they were 4x slower than
// their weight bytes. The products are summed over the K of a 32-column chunk in a permuted
// order (any order of k is the same dot product, as long as weights and tokens use the same):
// lane quad owns the chunk's elements 8 quad .. 8 quad + 7, one 16-byte load per row and per
// token; elements 8 quad + 4 s + {0, 1} are the MMA's k = 2 quad + {0, 1} of k-step s, and
// + {2, 3} its k = 2 quad + 8 + {0, 1}.
constexpr int kExpertMmaWarps = 4;
constexpr int kExpertMmaTileTokens = 8;  // the MMA's N
constexpr int kExpertMmaMaxTiles = 4;    // token tiles per pass over the weights (32 tokens)
constexpr int kExpertMmaChunk = 32;      // K elements per lane-quad step

// kRowTiles = 2 (gate_up: gate and up rows) or 1 (down). Inputs: gate_up reads x rows
// (token of the pair at each slot), down reads act rows (slot order).
template <int kRowTiles, int kUnroll>
__global__ void __launch_bounds__(kExpertMmaWarps * 32)
    expert_mma_kernel(const bf16* x, const void* const* weights_of, MoeWorkspace ws, int top_k, int k_dim, int out_rows,
                      int inter) {
  __shared__ float partial[kExpertMmaWarps][kExpertMmaMaxTiles][kRowTiles][4][32];  // 4-16 KB
  pdl_enter();
  if (static_cast<int>(blockIdx.x) >= *ws.num_active) return;
  const int e = ws.active[blockIdx.x];
  const int begin = ws.offsets[e], end = ws.offsets[e + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, quad = lane & 3;
  const int n0 = blockIdx.y * 16;
  const bf16* weights = static_cast<const bf16*>(weights_of[e]);
  // Rows group and group + 8 of each row tile (gate_up's second tile: the up rows).
  const bf16* rows[kRowTiles][2];
  bool row_ok[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int n = n0 + group + 8 * half;
    row_ok[half] = n < out_rows;
#pragma unroll
    for (int rt = 0; rt < kRowTiles; ++rt)
      rows[rt][half] = weights + static_cast<int64_t>(rt * inter + (row_ok[half] ? n : 0)) * k_dim + 8 * quad;
  }
  const int chunks = k_dim / kExpertMmaChunk;
  const int per_warp = (chunks + kExpertMmaWarps - 1) / kExpertMmaWarps;
  const int chunk_begin = min(chunks, warp * per_warp), chunk_end = min(chunks, chunk_begin + per_warp);

  for (int first = begin; first < end; first += kExpertMmaTileTokens * kExpertMmaMaxTiles) {
    const int tiles = min(kExpertMmaMaxTiles, (end - first + kExpertMmaTileTokens - 1) / kExpertMmaTileTokens);
    // This lane's token (column group) of each tile; null past the expert's rows.
    const bf16* token_row[kExpertMmaMaxTiles];
#pragma unroll
    for (int tile = 0; tile < kExpertMmaMaxTiles; ++tile) {
      const int slot = first + tile * kExpertMmaTileTokens + group;
      token_row[tile] = nullptr;
      if (tile < tiles && slot < end)
        token_row[tile] = (kRowTiles == 2 ? x + static_cast<int64_t>(ws.pair_of_slot[slot] / top_k) * k_dim
                                          : ws.act + static_cast<int64_t>(slot) * k_dim) +
                          8 * quad;
    }
    float acc[kExpertMmaMaxTiles][kRowTiles][4] = {};
    for (int c0 = chunk_begin; c0 < chunk_end; c0 += kUnroll) {
      uint4 w[kUnroll][kRowTiles][2];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            w[u][rt][half] = c0 + u < chunk_end && row_ok[half]
                                 ? *reinterpret_cast<const uint4*>(rows[rt][half] + (c0 + u) * kExpertMmaChunk)
                                 : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int tile = 0; tile < kExpertMmaMaxTiles; ++tile) {
        if (tile >= tiles) break;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (c0 + u >= chunk_end) break;
          const uint4 b = token_row[tile] != nullptr
                              ? *reinterpret_cast<const uint4*>(token_row[tile] + (c0 + u) * kExpertMmaChunk)
                              : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int rt = 0; rt < kRowTiles; ++rt) {
            const uint32_t a0[4] = {w[u][rt][0].x, w[u][rt][1].x, w[u][rt][0].y, w[u][rt][1].y};
            const uint32_t a1[4] = {w[u][rt][0].z, w[u][rt][1].z, w[u][rt][0].w, w[u][rt][1].w};
            mma_16x8x16(acc[tile][rt], a0, b.x, b.y);
            mma_16x8x16(acc[tile][rt], a1, b.z, b.w);
          }
        }
      }
    }
    // The warps' partial sums, added in warp order by warp 0's lanes (same fragment layout).
#pragma unroll
    for (int tile = 0; tile < kExpertMmaMaxTiles; ++tile)
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[warp][tile][rt][i][lane] = acc[tile][rt][i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int tile = 0; tile < kExpertMmaMaxTiles; ++tile) {
        if (tile >= tiles) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = n0 + group + 8 * (i >> 1);
          const int slot = first + tile * kExpertMmaTileTokens + 2 * quad + (i & 1);
          float sum[kRowTiles];
#pragma unroll
          for (int rt = 0; rt < kRowTiles; ++rt) {
            sum[rt] = 0.0f;
            for (int w = 0; w < kExpertMmaWarps; ++w) sum[rt] += partial[w][tile][rt][i][lane];
          }
          if (n >= out_rows || slot >= end) continue;
          if constexpr (kRowTiles == 2) {
            // transformers (bf16): gate and up are bf16 linear outputs; silu(gate) is rounded too.
            const float g = to_f(to_bf(sum[0])), u = to_f(to_bf(sum[1]));
            ws.act[static_cast<int64_t>(slot) * inter + n] = to_bf(to_f(to_bf(g / (1.0f + __expf(-g)))) * u);
          } else {
            ws.partial[static_cast<int64_t>(slot) * out_rows + n] = to_f(to_bf(sum[0]));
          }
        }
      }
    }
    __syncthreads();  // partial[] is rewritten by the next pass
  }
}

// x_sorted[s] = x[token of the pair at sorted position s], for s < offsets[local_experts].
__global__ void gather_sorted_kernel(const bf16* x, MoeWorkspace ws, int local_experts, int top_k, int hidden) {
  pdl_enter();
  const int s = blockIdx.x;
  if (s >= ws.offsets[local_experts]) return;
  const bf16* src = x + static_cast<int64_t>(ws.pair_of_slot[s] / top_k) * hidden;
  bf16* dst = ws.x_sorted + static_cast<int64_t>(s) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// grid (tokens, ceil(hidden / 256)): one output element per thread. The token's slots and
// weights are loaded first (independent loads), then its partial rows, so a decode-sized
// call waits on memory twice rather than once per (k, element) step.
constexpr int kMaxTopK = 32;

__global__ void combine_kernel(const float* topk_weights, MoeWorkspace ws, void* out, bool out_f32, int top_k,
                               int hidden, bool accumulate) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int n = blockIdx.y * blockDim.x + threadIdx.x;
  if (n >= hidden) return;
  int32_t slots[kMaxTopK];
  float weights[kMaxTopK];
#pragma unroll
  for (int k = 0; k < kMaxTopK; ++k) {
    if (k >= top_k) break;
    slots[k] = ws.slot_of_pair[t * top_k + k];
    weights[k] = topk_weights[t * top_k + k];
  }
  auto* out32 = static_cast<float*>(out);
  auto* out16 = static_cast<bf16*>(out);
  const int64_t o = t * hidden + n;
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxTopK; ++k) {
    if (k >= top_k) break;
    if (slots[k] >= 0) sum += weights[k] * ws.partial[static_cast<int64_t>(slots[k]) * hidden + n];
  }
  if (accumulate) sum = (out_f32 ? out32[o] : to_f(out16[o])) + sum;  // one addition, as the CPU's
  if (out_f32) {
    out32[o] = sum;
  } else {
    out16[o] = to_bf(sum);
  }
}

}  // namespace

int64_t route_workspace_bytes(const ops::MoeRouteParams& p) { return align256(4 * p.tokens * p.experts); }

void launch_moe_route(const ops::MoeRouteParams& p, bool batch_invariant, void* workspace, cudaStream_t stream) {
  const int64_t tokens = p.tokens, experts = p.experts, n_group = p.n_group, topk_group = p.topk_group;
  const int64_t top_k = p.top_k;
  if (n_group > 64) throw std::invalid_argument("moe_route: n_group " + std::to_string(n_group) + " > 64");
  if (p.hidden % 4 != 0)
    throw std::invalid_argument("moe_route: hidden " + std::to_string(p.hidden) + " is not a multiple of 4");
  if (tokens == 0) return;
  float* logits = static_cast<float*>(workspace);  // [tokens, experts]
  const dim3 grid(static_cast<unsigned>(experts), static_cast<unsigned>((tokens + kRouteTokens - 1) / kRouteTokens));
  launch_pdl(router_logits_kernel, grid, kRouteWarps * 32, 0, stream, static_cast<const bf16*>(p.x), p.weight, logits,
             static_cast<int>(tokens), static_cast<int>(p.hidden), static_cast<int>(experts));
  // Up to kBlockSelectTokens tokens, a block per token (not in batch-invariant mode: the warp
  // kernel below sums a token's chosen scores in another order).
  if (!batch_invariant && topk_group >= n_group && tokens <= kBlockSelectTokens &&
      experts <= kSelectThreads * kSelectPerThread && top_k <= 32) {
    launch_pdl(route_select_register_kernel<kSelectThreads, kSelectPerThread>, tokens, kSelectThreads, 0, stream,
               logits, p.bias, p.topk_ids, p.topk_weights, static_cast<int>(experts), static_cast<int>(top_k),
               p.norm_topk_prob, p.routed_scaling_factor);
    return;
  }
  if (topk_group >= n_group && experts <= 32 * kSelectPerLane && top_k <= 32) {
    launch_pdl(route_select_register_kernel<32, kSelectPerLane>, tokens, 32, 0, stream, logits, p.bias, p.topk_ids,
               p.topk_weights, static_cast<int>(experts), static_cast<int>(top_k), p.norm_topk_prob,
               p.routed_scaling_factor);
    return;
  }
  const size_t shared = sizeof(float) * (2 * experts + n_group) + (experts > n_group ? experts : n_group);
  launch_pdl(route_select_kernel, tokens, 32, shared, stream, logits, p);
}

int64_t moe_workspace_bytes(const ops::MoeExpertsParams& p) {
  const int64_t pairs = p.tokens * p.top_k, local_experts = p.expert_end - p.expert_begin;
  const int64_t hidden = p.hidden, inter = p.inter;
  return align256(4 * local_experts) * 2 + align256(4) + align256(4 * (local_experts + 1)) + 2 * align256(4 * pairs) +
         align256(2 * pairs * inter) + align256(4 * pairs * hidden) + align256(2 * pairs * hidden) +
         align256(4 * pairs * inter);
}

void launch_moe_sort(const MoeExpertsLaunch& m, cudaStream_t stream) {
  const int64_t local = m.local_experts;
  MoeWorkspace ws = carve(m);
  if (local * 4 > 48 * 1024)
    throw std::invalid_argument("moe: " + std::to_string(local) + " local experts (at most 12288 per rank)");
  launch_pdl(sort_pairs_kernel, 1, kSortThreads, local * 4, stream, m.op.topk_ids, static_cast<int>(m.pairs),
             static_cast<int>(m.op.expert_begin), static_cast<int>(m.op.expert_end), ws);
}

MoeGemmBuffers moe_gemm_buffers(const MoeExpertsLaunch& m) {
  const MoeWorkspace ws = carve(m);
  return {ws.offsets, ws.x_sorted, ws.gate_up, ws.act, ws.partial};
}

void launch_moe_gather_sorted(const MoeExpertsLaunch& m, cudaStream_t stream) {
  const MoeWorkspace ws = carve(m);
  launch_pdl(gather_sorted_kernel, m.pairs, 256, 0, stream, static_cast<const bf16*>(m.op.x), ws,
             static_cast<int>(m.local_experts), static_cast<int>(m.op.top_k), static_cast<int>(m.op.hidden));
}

void launch_moe_expert_kernels(const MoeExpertsLaunch& m, const KernelPolicy& policy, cudaStream_t stream) {
  const MoeWorkspace ws = carve(m);
  const void* const x = m.op.x;
  const void* const* const w13 = m.op.w13;
  const void* const* const w2 = m.op.w2;
  const int64_t local_experts = m.local_experts, top_k = m.op.top_k, hidden = m.op.hidden, inter = m.op.inter;
  const int64_t max_active = std::min(local_experts, m.pairs);
  // Tensor cores from one row per local expert on average (weight rows are 16-byte
  // aligned: K % 32 == 0, allocations aligned). Below that most active experts have one row
  // and the CUDA-core kernels stream faster (more rows in flight per warp): one H200, K2.6
  // with 384 experts, batch 8 / 32 3.58 / 8.60 ms against 3.80-3.93 / 9.22-9.29 on tensor
  // cores; from batch 64 (1.33 rows per expert) the tensor cores are as fast or faster
  // (batch 128 17.25 against 22.5 ms; docs/benchmarks.md).
  const bool mma_shapes = hidden % kExpertMmaChunk == 0 && inter % kExpertMmaChunk == 0 && aligned16({x});
  if (mma_shapes && (policy.batch_invariant || m.local_pairs >= local_experts) && policy.moe_tensor_cores) {
    launch_pdl(expert_mma_kernel<2, 2>,
               dim3(static_cast<unsigned>(max_active), static_cast<unsigned>((inter + 15) / 16)), kExpertMmaWarps * 32,
               0, stream, static_cast<const bf16*>(x), w13, ws, static_cast<int>(top_k), static_cast<int>(hidden),
               static_cast<int>(inter), static_cast<int>(inter));
    launch_pdl(expert_mma_kernel<1, 4>,
               dim3(static_cast<unsigned>(max_active), static_cast<unsigned>((hidden + 15) / 16)), kExpertMmaWarps * 32,
               0, stream, static_cast<const bf16*>(nullptr), w2, ws, static_cast<int>(top_k), static_cast<int>(inter),
               static_cast<int>(hidden), static_cast<int>(inter));
    return;
  }
  const int rows_per_warp = max_active <= kFewActiveExperts ? kRowsPerWarpFew : kRowsPerWarpMany;
  const int rows_per_block = kWarpsPerBlock * rows_per_warp;
  const dim3 gate_grid(static_cast<unsigned>(max_active),
                       static_cast<unsigned>((inter + rows_per_block - 1) / rows_per_block));
  launch_pdl(gate_up_kernel, gate_grid, kWarpsPerBlock * 32, 0, stream, static_cast<const bf16*>(x), w13, ws,
             static_cast<int>(top_k), static_cast<int>(hidden), static_cast<int>(inter), rows_per_warp);
  const dim3 down_grid(static_cast<unsigned>(max_active),
                       static_cast<unsigned>((hidden + rows_per_block - 1) / rows_per_block));
  launch_pdl(down_kernel, down_grid, kWarpsPerBlock * 32, 0, stream, w2, ws, static_cast<int>(hidden),
             static_cast<int>(inter), rows_per_warp);
}

void launch_moe_combine(const MoeExpertsLaunch& m, cudaStream_t stream) {
  const int64_t tokens = m.op.tokens, top_k = m.op.top_k, hidden = m.op.hidden;
  if (tokens == 0) return;
  const MoeWorkspace ws = carve(m);
  if (top_k > kMaxTopK) throw std::invalid_argument("moe: top_k " + std::to_string(top_k) + " > 32");
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((hidden + 255) / 256));
  launch_pdl(combine_kernel, grid, 256, 0, stream, m.op.topk_weights, ws, m.op.out, m.op.out_f32,
             static_cast<int>(top_k), static_cast<int>(hidden), m.op.accumulate);
}

}  // namespace moeserve::cuda
