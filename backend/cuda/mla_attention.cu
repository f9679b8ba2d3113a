// MLA attention in the absorbed form over the paged latent cache, split over the context
// (flash-decoding style) so that a batch of one still spreads over many SMs.
//
// Kernel 1, grid (tokens, head groups, splits): one warp per head, kHeadsPerBlock heads of a
// token per block (the cache rows they share are read from HBM once and hit L1 for the
// others). A split covers a contiguous range of the token's context; its warp scores one
// cache row at a time, keeps an online
// softmax (running max m, denominator l) and the unnormalised output, and writes (m, l, acc)
// for the split. Each lane owns latent elements lane, lane + 32, ... and rope elements likewise
// (zero beyond latent / rope, so padded lanes add nothing). Scoring several rows per
// iteration was tried and was slower (register pressure); prefetching the next row is not.
// Kernel 2, grid (tokens, heads): merges the splits: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s,
// in split order.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mla_decode.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/smem_copy.cuh"
#include "cuda_common/common.cuh"

namespace moeserve::cuda {

namespace {

constexpr int kHeadsPerBlock = 8;
constexpr int kMaxLatent = 512;
constexpr int kMaxRope = 128;
constexpr int kLatentPerLane = kMaxLatent / 32;
constexpr int kRopePerLane = kMaxRope / 32;
constexpr int kMinSplitLength = 16;
// A warp walks its split one cache row at a time, and each row waits on a dependent load
// (block table, then the row): at decode sizes the kernel is latency-bound, so short splits
// (many blocks) matter more than the merge's extra partials.
constexpr int kMaxSplits = 64;
constexpr int kTargetBlocks = 2048;
// Batch-invariant mode: a token's context is split in runs of kInvariantSplitRows cache rows
// (doubled until at most kMaxSplits runs hold it), whatever the batch, so its partial states
// and their merge are the same arithmetic in any batch (a multiple of the tensor-core tile).
constexpr int kInvariantSplitRows = 256;

// Rows per split of a token with `context` positions: `split_length` when positive; 0 asks for
// the batch-invariant length, which depends on the token's own context only.
__host__ __device__ __forceinline__ int token_split_length(int split_length, int context) {
  if (split_length > 0) return split_length;
  int length = kInvariantSplitRows;
  while (static_cast<int64_t>(length) * kMaxSplits < context) length *= 2;
  return length;
}

// Splits of the context for a launch: enough blocks to fill the GPU, none shorter than
// kMinSplitLength positions.
int splits_for(int64_t tokens, int64_t heads, int64_t max_context) {
  const int64_t head_groups = (heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int64_t by_length = std::max<int64_t>(1, (max_context + kMinSplitLength - 1) / kMinSplitLength);
  const int64_t by_occupancy = std::max<int64_t>(1, kTargetBlocks / std::max<int64_t>(1, tokens * head_groups));
  return static_cast<int>(std::min<int64_t>({kMaxSplits, by_length, by_occupancy}));
}

struct Partials {
  float* m;    // [tokens, heads, splits]
  float* l;    // [tokens, heads, splits]
  float* acc;  // [tokens, heads, splits, latent]
};

// acc starts on a 16-byte boundary (the kernels store it four floats at a time).
int64_t acc_offset(int64_t partial_states) { return (2 * partial_states + 3) / 4 * 4; }

Partials carve(void* workspace, int64_t tokens, int64_t heads, int64_t splits, int64_t latent) {
  auto* f = static_cast<float*>(workspace);
  const int64_t n = tokens * heads * splits;
  return {f, f + n, f + acc_offset(n)};
}

// What a warp of a split kernel works on: token t, head h, context positions [begin, end)
// of split `split`, and where its partial state goes.
struct SplitTask {
  int t, h, lane, split, begin, end;
  int64_t slot;  // (t, h, split) in the partials
};

__device__ __forceinline__ SplitTask split_task(const int32_t* positions, int heads, int split_length) {
  SplitTask w;
  w.t = blockIdx.x;
  w.split = blockIdx.z;
  w.lane = threadIdx.x & 31;
  w.h = blockIdx.y * kHeadsPerBlock + (threadIdx.x >> 5);
  const int length = token_split_length(split_length, positions[w.t] + 1);
  w.begin = w.split * length;
  w.end = min(positions[w.t] + 1, w.begin + length);
  w.slot = (static_cast<int64_t>(w.t) * heads + w.h) * gridDim.z + w.split;
  return w;
}

// A split's running softmax: the largest score m and the denominator l so far. add() takes
// the next score and returns the factor that rescales the accumulator (x) and the new row's
// weight (y): acc = acc * x + y * row.
struct OnlineSoftmax {
  float running_max = -INFINITY, denom = 0.0f;
  __device__ __forceinline__ float2 add(float score) {
    const float new_max = fmaxf(running_max, score);
    const float correction = __expf(running_max - new_max);
    const float p = __expf(score - new_max);
    denom = denom * correction + p;
    running_max = new_max;
    return make_float2(correction, p);
  }
  __device__ __forceinline__ void store(const Partials& partials, const SplitTask& w) const {
    if (w.lane != 0) return;
    partials.m[w.slot] = running_max;  // -inf for an empty split
    partials.l[w.slot] = denom;
  }
};

// The split kernels' view of ops::MlaAttentionParams, in the types they compute with.
struct SplitInputs {
  const bf16* q_latent;  // [T, heads, latent]
  const bf16* q_rope;    // [T, heads, q_head_stride], rope at rope_offset
  const bf16* cache;     // [pages * page_size, latent + rope]
  const int32_t* block_tables;
  const int32_t* seq_of_token;
  const int32_t* positions;
  int heads, latent, rope;
  int64_t q_head_stride, rope_offset;
  int page_size;
  int64_t max_pages_per_seq;
  float scale;
  __device__ explicit SplitInputs(const ops::MlaAttentionParams& p)
      : q_latent(static_cast<const bf16*>(p.q_latent)),
        q_rope(static_cast<const bf16*>(p.q_rope)),
        cache(static_cast<const bf16*>(p.cache)),
        block_tables(p.block_tables),
        seq_of_token(p.seq_of_token),
        positions(p.positions),
        heads(static_cast<int>(p.heads)),
        latent(static_cast<int>(p.latent)),
        rope(static_cast<int>(p.rope)),
        q_head_stride(p.q_head_stride),
        rope_offset(p.rope_offset),
        page_size(static_cast<int>(p.page_size)),
        max_pages_per_seq(p.max_pages_per_seq),
        scale(p.scale) {}
};

__global__ void __launch_bounds__(kHeadsPerBlock * 32)
    mla_split_kernel(const ops::MlaAttentionParams p, Partials partials, int split_length) {
  const SplitInputs in(p);
  pdl_enter();
  const SplitTask w = split_task(in.positions, in.heads, split_length);
  if (w.h >= in.heads) return;
  const int t = w.t, h = w.h, lane = w.lane, begin = w.begin, end = w.end;
  const int width = in.latent + in.rope;

  float q_lat[kLatentPerLane], q_r[kRopePerLane], acc[kLatentPerLane];
  const bf16* ql = in.q_latent + (static_cast<int64_t>(t) * in.heads + h) * in.latent;
  const bf16* qr = in.q_rope + (static_cast<int64_t>(t) * in.heads + h) * in.q_head_stride + in.rope_offset;
#pragma unroll
  for (int j = 0; j < kLatentPerLane; ++j) {
    const int i = lane + 32 * j;
    q_lat[j] = i < in.latent ? to_f(ql[i]) * in.scale : 0.0f;
    acc[j] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kRopePerLane; ++j) {
    const int i = lane + 32 * j;
    q_r[j] = i < in.rope ? to_f(qr[i]) * in.scale : 0.0f;
  }
  const int32_t* table = in.block_tables + static_cast<int64_t>(in.seq_of_token[t]) * in.max_pages_per_seq;
  OnlineSoftmax softmax;
  // Software pipeline: the next row's values are loaded while the current row is scored, so
  // a warp always has a row's loads in flight.
  float cur_lat[kLatentPerLane], cur_rope[kRopePerLane], nxt_lat[kLatentPerLane], nxt_rope[kRopePerLane];
  auto load_row = [&](int pos, float(&lat)[kLatentPerLane], float(&rp)[kRopePerLane]) {
    const bf16* entry =
        in.cache + (static_cast<int64_t>(table[pos / in.page_size]) * in.page_size + pos % in.page_size) * width;
#pragma unroll
    for (int j = 0; j < kLatentPerLane; ++j) {
      const int i = lane + 32 * j;
      lat[j] = i < in.latent ? to_f(entry[i]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kRopePerLane; ++j) {
      const int i = lane + 32 * j;
      rp[j] = i < in.rope ? to_f(entry[in.latent + i]) : 0.0f;
    }
  };
  if (begin < end) load_row(begin, cur_lat, cur_rope);
  for (int pos = begin; pos < end; ++pos) {
    if (pos + 1 < end) load_row(pos + 1, nxt_lat, nxt_rope);
    float partial = 0.0f;
#pragma unroll
    for (int j = 0; j < kLatentPerLane; ++j) partial += q_lat[j] * cur_lat[j];
#pragma unroll
    for (int j = 0; j < kRopePerLane; ++j) partial += q_r[j] * cur_rope[j];
    const float2 step = softmax.add(warp_sum(partial));
#pragma unroll
    for (int j = 0; j < kLatentPerLane; ++j) acc[j] = acc[j] * step.x + step.y * cur_lat[j];
#pragma unroll
    for (int j = 0; j < kLatentPerLane; ++j) cur_lat[j] = nxt_lat[j];
#pragma unroll
    for (int j = 0; j < kRopePerLane; ++j) cur_rope[j] = nxt_rope[j];
  }
  softmax.store(partials, w);
  float* out = partials.acc + w.slot * in.latent;
#pragma unroll
  for (int j = 0; j < kLatentPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < in.latent) out[i] = acc[j];
  }
}

// The same split kernel with 16-byte loads, for the shapes of the DeepSeek family (latent %
// 8 == 0, rope even and <= 64, rows of latent + rope a multiple of 8 elements): lane l owns
// latent chunks l and l + 32 (8 elements each) and rope elements 2l, 2l + 1, so a cache row
// is 3 loads per lane instead of 20, and rows are loaded five ahead of their use (at batch 1 a
// row's loads otherwise wait on HBM latency; 124 registers, the same two blocks per SM as two
// ahead: batch 128 at context 1024 1.5% faster, batch 1 and 64 unchanged within noise).
constexpr int kVecChunks = kMaxLatent / 8 / 32;  // latent chunks of 8 per lane (2)
constexpr int kVecAhead = 5;                     // rows in flight beyond the current one

struct RawRow {
  uint4 lat[kVecChunks];
  uint32_t rope;
};

__global__ void __launch_bounds__(kHeadsPerBlock * 32)
    mla_split_vec_kernel(const ops::MlaAttentionParams p, Partials partials, int split_length) {
  const SplitInputs in(p);
  pdl_enter();
  const SplitTask w = split_task(in.positions, in.heads, split_length);
  if (w.h >= in.heads) return;
  const int t = w.t, h = w.h, lane = w.lane, begin = w.begin, end = w.end;
  const int width = in.latent + in.rope;
  const int chunks = in.latent / 8;
  const bool has_rope = 2 * lane < in.rope;

  float q_lat[kVecChunks][8], acc[kVecChunks][8], q_r[2];
  const bf16* ql = in.q_latent + (static_cast<int64_t>(t) * in.heads + h) * in.latent;
#pragma unroll
  for (int c = 0; c < kVecChunks; ++c) {
    const int chunk = lane + 32 * c;
    uint4 bits = chunk < chunks ? *reinterpret_cast<const uint4*>(ql + chunk * 8) : make_uint4(0, 0, 0, 0);
    const bf16* v = reinterpret_cast<const bf16*>(&bits);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      q_lat[c][q] = to_f(v[q]) * in.scale;
      acc[c][q] = 0.0f;
    }
  }
  {
    const bf16* qr = in.q_rope + (static_cast<int64_t>(t) * in.heads + h) * in.q_head_stride + in.rope_offset;
    q_r[0] = has_rope ? to_f(qr[2 * lane]) * in.scale : 0.0f;
    q_r[1] = has_rope ? to_f(qr[2 * lane + 1]) * in.scale : 0.0f;
  }
  const int32_t* table = in.block_tables + static_cast<int64_t>(in.seq_of_token[t]) * in.max_pages_per_seq;
  auto load_row = [&](int pos, RawRow& row) {
    const bf16* entry =
        in.cache + (static_cast<int64_t>(table[pos / in.page_size]) * in.page_size + pos % in.page_size) * width;
#pragma unroll
    for (int c = 0; c < kVecChunks; ++c) {
      const int chunk = lane + 32 * c;
      row.lat[c] = chunk < chunks ? *reinterpret_cast<const uint4*>(entry + chunk * 8) : make_uint4(0, 0, 0, 0);
    }
    row.rope = has_rope ? *reinterpret_cast<const uint32_t*>(entry + in.latent + 2 * lane) : 0u;
  };
  RawRow ring[kVecAhead + 1];
#pragma unroll
  for (int a = 0; a <= kVecAhead; ++a)
    if (begin + a < end) load_row(begin + a, ring[a]);
  OnlineSoftmax softmax;
  for (int pos = begin; pos < end; pos += kVecAhead + 1) {
#pragma unroll
    for (int a = 0; a <= kVecAhead; ++a) {
      if (pos + a >= end) break;
      float lat[kVecChunks][8];
      float partial = 0.0f;
#pragma unroll
      for (int c = 0; c < kVecChunks; ++c) {
        const bf16* v = reinterpret_cast<const bf16*>(&ring[a].lat[c]);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          lat[c][q] = to_f(v[q]);
          partial += q_lat[c][q] * lat[c][q];
        }
      }
      const bf16* r = reinterpret_cast<const bf16*>(&ring[a].rope);
      partial += q_r[0] * to_f(r[0]) + q_r[1] * to_f(r[1]);
      // The slot is free again: load the row kVecAhead + 1 in.positions on.
      if (pos + a + kVecAhead + 1 < end) load_row(pos + a + kVecAhead + 1, ring[a]);
      const float2 step = softmax.add(warp_sum(partial));
#pragma unroll
      for (int c = 0; c < kVecChunks; ++c)
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[c][q] = acc[c][q] * step.x + step.y * lat[c][q];
    }
  }
  softmax.store(partials, w);
  float* out = partials.acc + w.slot * in.latent;
#pragma unroll
  for (int c = 0; c < kVecChunks; ++c) {
    const int chunk = lane + 32 * c;
    if (chunk >= chunks) continue;
    reinterpret_cast<float4*>(out + chunk * 8)[0] = make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
    reinterpret_cast<float4*>(out + chunk * 8)[1] = make_float4(acc[c][4], acc[c][5], acc[c][6], acc[c][7]);
  }
}

// The split kernel on tensor cores, for DeepSeek-V3's shape (latent 512, rope 64, any head
// count): a block takes 16 heads of one token and one split, and walks the split 16
// cache rows at a time (FlashMLA's decomposition on mma.sync instead of wgmma). The rows are
// copied into shared memory with cp.async, the next tile while the current one is used; each
// of the 4 warps computes the scores S [16 heads x 16 rows] = Q K^T over all 576 columns
// (bf16 inputs, fp32 accumulation; redundant across warps, which is cheaper than exchanging
// them), keeps the online softmax of its heads in registers (the MMA's accumulator layout is
// the next MMA's operand layout, so P needs no shared memory), and accumulates its 128 of the
// 512 latent columns of O += P V. P is split into a bf16 high part and a bf16 remainder (two
// MMAs), so the weights keep ~16 bits like the fp32 weights of the CUDA-core kernels. The
// 64-head CUDA-core kernel issues ~100 instructions per (row, head) and is instruction-bound.
// A head count that is not a multiple of 16 (8 per GPU for Kimi K2 under tp8, Moonlight under
// tp2) fills the last block's missing heads with zero queries and stores nothing for them:
// their scores are finite (all zero), so their softmax is well defined and never read.
constexpr int kMmaHeads = 16;  // heads per block: the MMA's M
constexpr int kMmaRows = 16;   // cache rows per tile
constexpr int kMmaWarps = 4;   // each owns 128 latent columns of the output
constexpr int kMmaLatent = 512, kMmaRope = 64;
constexpr int kMmaWidth = kMmaLatent + kMmaRope;  // 576: 36 MMA k-steps
constexpr int kMmaStride = kMmaWidth + 8;         // padded shared-memory row: conflict-free fragments
constexpr int kMmaColumnsPerWarp = kMmaLatent / kMmaWarps;
constexpr int kMmaMinSplitRows = 32;  // two tiles: 16 and 64 measured alike or slower at batch 1
constexpr size_t kMmaSharedBytes = sizeof(bf16) * kMmaStride * (kMmaHeads + 2 * kMmaRows);  // Q + two tiles

__device__ __forceinline__ uint32_t shared_u32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// x = hi + lo with both parts bf16 (|lo| <= half an ulp of hi): a pair of values as the high
// and remainder operands of two MMAs.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const bf16 h0 = to_bf(x0), h1 = to_bf(x1);
  hi = pack_bf16x2(h0, h1);
  lo = pack_bf16x2(to_bf(x0 - to_f(h0)), to_bf(x1 - to_f(h1)));
}

// A block of the tensor-core kernel: token t, heads [h0, h0 + 16), context positions
// [begin, end) of split `split`, and the token's block table.
struct MmaTask {
  int t, h0, split, begin, end;
  const int32_t* table;
};

__device__ MmaTask mma_task(const ops::MlaAttentionParams& p, int split_length) {
  MmaTask w;
  w.t = blockIdx.x;
  w.h0 = blockIdx.y * kMmaHeads;
  w.split = blockIdx.z;
  const int context = p.positions[w.t] + 1;
  const int length = token_split_length(split_length, context);
  w.begin = w.split * length;
  w.end = min(context, w.begin + length);
  w.table = p.block_tables + static_cast<int64_t>(p.seq_of_token[w.t]) * p.max_pages_per_seq;
  return w;
}

constexpr int kMmaChunks = kMmaWidth / 8;  // 16-byte chunks per row

// Q of the block's heads into q_s [16][latent | rope]; zeros for heads past the last.
__device__ void mma_load_queries(const ops::MlaAttentionParams& p, const MmaTask& w, bf16* q_s) {
  const bf16* const q_latent = static_cast<const bf16*>(p.q_latent);
  const bf16* const q_rope = static_cast<const bf16*>(p.q_rope);
  for (int c = threadIdx.x; c < kMmaHeads * kMmaChunks; c += blockDim.x) {
    const int h = c / kMmaChunks, column = (c % kMmaChunks) * 8;
    uint4* dst = reinterpret_cast<uint4*>(q_s + h * kMmaStride + column);
    if (w.h0 + h >= p.heads) {
      *dst = make_uint4(0, 0, 0, 0);
      continue;
    }
    const int64_t th = static_cast<int64_t>(w.t) * p.heads + w.h0 + h;
    const bf16* src = column < kMmaLatent ? q_latent + th * kMmaLatent + column
                                          : q_rope + th * p.q_head_stride + p.rope_offset + (column - kMmaLatent);
    *dst = *reinterpret_cast<const uint4*>(src);
  }
}

// Rows [first, first + 16) of the split into `tile` [16][kMmaStride] (cp.async, one commit
// group); rows past its end are zeros.
__device__ void mma_load_tile(const ops::MlaAttentionParams& p, const MmaTask& w, int first, bf16* tile) {
  const bf16* const cache = static_cast<const bf16*>(p.cache);
  const int page_size = static_cast<int>(p.page_size);
  for (int c = threadIdx.x; c < kMmaRows * kMmaChunks; c += blockDim.x) {
    const int r = c / kMmaChunks, column = (c % kMmaChunks) * 8, pos = first + r;
    bf16* dst = tile + r * kMmaStride + column;
    if (pos < w.end) {
      const int64_t slot = static_cast<int64_t>(w.table[pos / page_size]) * page_size + pos % page_size;
      cp_async_16(dst, cache + slot * kMmaWidth + column);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
  cp_async_commit();
}

// S [16 heads x 16 rows] = Q K^T of the tile: two MMA column tiles of 8 rows, 36 k-steps.
__device__ void mma_score_tile(const bf16* q_s, const bf16* tile, float (&score)[2][4]) {
  const int lane = threadIdx.x & 31, group = lane >> 2, quad = lane & 3;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) score[j][e] = 0.0f;
#pragma unroll 4
  for (int k = 0; k < kMmaWidth; k += 16) {
    const bf16* qa = q_s + group * kMmaStride + k + 2 * quad;
    const uint32_t a[4] = {shared_u32(qa), shared_u32(qa + 8 * kMmaStride), shared_u32(qa + 8),
                           shared_u32(qa + 8 * kMmaStride + 8)};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bf16* kb = tile + (8 * j + group) * kMmaStride + k + 2 * quad;
      mma_16x8x16(score[j], a, shared_u32(kb), shared_u32(kb + 8));
    }
  }
}

// The online softmax of heads group (r = 0: accumulator elements e = 0, 1) and group + 8
// (r = 1: e = 2, 3) over rows 8 j + 2 quad + (e & 1) of a tile; the 4 lanes of a group hold
// a head's 16 rows.
struct MmaSoftmax {
  float running_max[2] = {-INFINITY, -INFINITY}, denom[2] = {0.0f, 0.0f};

  // Scores of a tile (`valid` rows real) into P; correction gets each head's rescale factor.
  __device__ void add(float (&score)[2][4], int valid, float scale, float (&correction)[2]) {
    const int quad = threadIdx.x & 3;
    float tile_max[2] = {-INFINITY, -INFINITY}, tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = 8 * j + 2 * quad + (e & 1);
        score[j][e] = row < valid ? score[j][e] * scale : -INFINITY;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], score[j][e]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float new_max = fmaxf(running_max[r], tile_max[r]);
      correction[r] = new_max == -INFINITY ? 1.0f : __expf(running_max[r] - new_max);
      running_max[r] = new_max;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float m = running_max[e >> 1];
        score[j][e] = score[j][e] == -INFINITY ? 0.0f : __expf(score[j][e] - m);  // now P
        tile_sum[e >> 1] += score[j][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_sum[r] += __shfl_xor_sync(0xffffffffu, tile_sum[r], 1);
      tile_sum[r] += __shfl_xor_sync(0xffffffffu, tile_sum[r], 2);
      denom[r] = denom[r] * correction[r] + tile_sum[r];
    }
  }
};

// O = O * correction + P V over the warp's 128 latent columns (V: the tile's latent part). P
// [16 heads x 16 rows] is the A operand in the score accumulators' layout, as a bf16 high
// part and remainder.
__device__ void mma_accumulate_tile(const float (&prob)[2][4], const float (&correction)[2], const bf16* tile,
                                    float (&o)[kMmaColumnsPerWarp / 8][4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, quad = lane & 3;
  uint32_t p_hi[4], p_lo[4];
  split_bf16x2(prob[0][0], prob[0][1], p_hi[0], p_lo[0]);
  split_bf16x2(prob[0][2], prob[0][3], p_hi[1], p_lo[1]);
  split_bf16x2(prob[1][0], prob[1][1], p_hi[2], p_lo[2]);
  split_bf16x2(prob[1][2], prob[1][3], p_hi[3], p_lo[3]);
#pragma unroll
  for (int n = 0; n < kMmaColumnsPerWarp / 8; ++n) {
    o[n][0] *= correction[0];
    o[n][1] *= correction[0];
    o[n][2] *= correction[1];
    o[n][3] *= correction[1];
    const bf16* vb = tile + (2 * quad) * kMmaStride + warp * kMmaColumnsPerWarp + 8 * n + group;
    const uint32_t b0 = pack_bf16x2(vb[0], vb[kMmaStride]);
    const uint32_t b1 = pack_bf16x2(vb[8 * kMmaStride], vb[9 * kMmaStride]);
    mma_16x8x16(o[n], p_hi, b0, b1);
    mma_16x8x16(o[n], p_lo, b0, b1);
  }
}

// The split's partial state of heads group (r = 0) and group + 8 (r = 1), where they exist.
__device__ void mma_store_partials(const ops::MlaAttentionParams& p, const MmaTask& w, const MmaSoftmax& softmax,
                                   const float (&o)[kMmaColumnsPerWarp / 8][4], Partials partials) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, quad = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = w.h0 + group + 8 * r;
    if (h >= p.heads) continue;
    const int64_t slot = (static_cast<int64_t>(w.t) * p.heads + h) * gridDim.z + w.split;
    if (warp == 0 && quad == 0) {
      partials.m[slot] = softmax.running_max[r];  // -inf for an empty split
      partials.l[slot] = softmax.denom[r];
    }
#pragma unroll
    for (int n = 0; n < kMmaColumnsPerWarp / 8; ++n) {
      const int column = warp * kMmaColumnsPerWarp + 8 * n + 2 * quad;
      *reinterpret_cast<float2*>(partials.acc + slot * kMmaLatent + column) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
    }
  }
}

// Grid (tokens, ceil(heads / 16), splits), kMmaWarps warps, kMmaSharedBytes of dynamic shared
// memory. Fragment layouts: mma.cuh.
__global__ void __launch_bounds__(kMmaWarps * 32)
    mla_split_mma_kernel(const ops::MlaAttentionParams p, Partials partials, int split_length) {
  extern __shared__ __align__(16) unsigned char mma_shared[];
  bf16* q_s = reinterpret_cast<bf16*>(mma_shared);  // [kMmaHeads][kMmaStride]
  bf16* k_s = q_s + kMmaHeads * kMmaStride;         // [2][kMmaRows][kMmaStride]
  pdl_enter();
  const MmaTask w = mma_task(p, split_length);
  mma_load_queries(p, w, q_s);
  float o[kMmaColumnsPerWarp / 8][4] = {};  // O [heads group, group + 8][the warp's columns], per 8-column tile
  MmaSoftmax softmax;
  const int tiles = w.begin < w.end ? (w.end - w.begin + kMmaRows - 1) / kMmaRows : 0;
  if (tiles > 0) mma_load_tile(p, w, w.begin, k_s);
  for (int i = 0; i < tiles; ++i) {
    if (i + 1 < tiles) {
      mma_load_tile(p, w, w.begin + (i + 1) * kMmaRows, k_s + ((i + 1) & 1) * kMmaRows * kMmaStride);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile i (and Q) visible to every warp
    const bf16* tile = k_s + (i & 1) * kMmaRows * kMmaStride;
    float score[2][4], correction[2];
    mma_score_tile(q_s, tile, score);
    softmax.add(score, w.end - (w.begin + i * kMmaRows), p.scale, correction);
    mma_accumulate_tile(score, correction, tile, o);
    __syncthreads();  // every warp is done with this buffer before the next tile's copy lands in it
  }
  mma_store_partials(p, w, softmax, o, partials);
}

bool mma_shapes(const ops::MlaAttentionParams& p) {
  return p.latent == kMmaLatent && p.rope == kMmaRope && p.heads >= 1 && p.q_head_stride % 8 == 0 &&
         p.rope_offset % 8 == 0 && aligned16({p.q_latent, p.q_rope, p.cache});
}

int64_t head_blocks(int64_t heads) { return (heads + kMmaHeads - 1) / kMmaHeads; }

// Splits of the tensor-core kernel: about two blocks per SM, none shorter than
// kMmaMinSplitRows rows (at most the CUDA-core kernels' splits, whose workspace is allocated).
int mma_splits_for(int64_t tokens, int64_t heads, int64_t max_context) {
  constexpr int64_t kTargetMmaBlocks = 264;
  const int64_t blocks_per_split = std::max<int64_t>(1, tokens * head_blocks(heads));
  const int64_t by_length = std::max<int64_t>(1, (max_context + kMmaMinSplitRows - 1) / kMmaMinSplitRows);
  const int64_t by_occupancy = (kTargetMmaBlocks + blocks_per_split - 1) / blocks_per_split;
  return static_cast<int>(std::min<int64_t>({kMaxSplits, by_length, by_occupancy}));
}

// The tensor-core kernel's dynamic shared memory, set once per device (one thread per GPU).
void configure_mma_kernel() {
  static thread_local int configured_device = -1;
  int device = 0;
  cudaGetDevice(&device);
  if (configured_device != device) {
    cudaFuncSetAttribute(mla_split_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kMmaSharedBytes));
    configured_device = device;
  }
}

bool vec_shapes(int64_t latent, int64_t rope, const void* q_latent, const void* cache) {
  return latent % 8 == 0 && rope % 2 == 0 && rope <= 64 && (latent + rope) % 8 == 0 && aligned16({q_latent, cache});
}

// One block per (token, head), one thread per latent element: warp 0 turns the splits'
// maxima into weights e^(m_s - M) (in shared memory) and the denominator once; then every
// thread's loads over the splits are independent of each other (the former loop recomputed
// the weights per element and waited on each load in turn: ~100 us at batch 1).
__global__ void mla_merge_kernel(Partials partials, bf16* out, int heads, int latent, int splits) {
  pdl_enter();
  __shared__ float weight[kMaxSplits];
  __shared__ float inv_denom;
  const int64_t th = static_cast<int64_t>(blockIdx.x) * heads + blockIdx.y;
  const float* m = partials.m + th * splits;
  const float* l = partials.l + th * splits;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float global_max = -INFINITY;
    for (int s = lane; s < splits; s += 32) global_max = fmaxf(global_max, m[s]);
    for (int offset = 16; offset > 0; offset >>= 1)
      global_max = fmaxf(global_max, __shfl_xor_sync(0xffffffffu, global_max, offset));
    float denom = 0.0f;
    for (int s = lane; s < splits; s += 32) {
      const float w = m[s] == -INFINITY ? 0.0f : __expf(m[s] - global_max);  // an empty split adds nothing
      weight[s] = w;
      denom += w * l[s];
    }
    denom = warp_sum(denom);
    if (lane == 0) inv_denom = 1.0f / denom;
  }
  __syncthreads();
  const float* acc = partials.acc + th * splits * latent;
  for (int i = threadIdx.x; i < latent; i += blockDim.x) {
    float sum = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) sum += weight[s] * acc[static_cast<int64_t>(s) * latent + i];
    out[th * latent + i] = to_bf(sum * inv_denom);
  }
}

// Absorbed query of a decode-sized batch. One block per (head, 64 latent columns): the
// columns' slice of W_uk [nope, latent] (16 KB per block for DeepSeek-V3) is read once, as 8
// lanes of 16-byte chunks per row times 32 groups of rows (four rows per thread, all loaded
// before use); each thread keeps its 8 columns' sums for every token, and the groups' partial
// sums are added in group order through shared memory. Replaces a cuBLAS batched GEMM whose
// kernel is a full stream dependency (no programmatic launch) at one to four tokens.
constexpr int kAbsorbThreads = 256;
constexpr int kAbsorbTokens = 4;
constexpr int kAbsorbColumns = 64;  // latent columns per block
constexpr int kAbsorbRowsInFlight = 8;

__global__ void __launch_bounds__(kAbsorbThreads)
    mla_q_absorb_small_kernel(const ops::MlaQAbsorbParams p, int token_groups) {
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* const kv_b = static_cast<const bf16*>(p.kv_b);
  bf16* q_latent = static_cast<bf16*>(p.q_latent);
  int tokens = static_cast<int>(p.tokens);
  const int heads = static_cast<int>(p.heads);
  const int64_t q_head_stride = p.q_head_stride;
  const int nope = static_cast<int>(p.nope), v = static_cast<int>(p.v), latent = static_cast<int>(p.latent);
  // blockIdx.x: the group of kAbsorbTokens tokens (fastest: the groups of one head's columns
  // read the same weights, mostly from L2) and the head.
  const int token_group = blockIdx.x % token_groups, h = blockIdx.x / token_groups;
  tokens = min(kAbsorbTokens, tokens - token_group * kAbsorbTokens);
  q += static_cast<int64_t>(token_group) * kAbsorbTokens * heads * q_head_stride;
  q_latent += static_cast<int64_t>(token_group) * kAbsorbTokens * heads * latent;
  const int col0 = blockIdx.y * kAbsorbColumns;
  const int columns = min(kAbsorbColumns, latent - col0);
  const int lanes = columns / 8, groups = kAbsorbThreads / lanes;
  const int lane = threadIdx.x % lanes, group = threadIdx.x / lanes;
  const bf16* w = kv_b + static_cast<int64_t>(h) * (nope + v) * latent + col0;  // W_uk[h][:, col0:]
  // The rows' slices of this block, asked of L2 before the wait (one 128-byte line each).
  for (int n = threadIdx.x; n < nope; n += kAbsorbThreads) prefetch_l2(w + static_cast<int64_t>(n) * latent);
  pdl_enter();
  __shared__ float partial[kAbsorbThreads * 8 * kAbsorbTokens];  // [groups][tokens][columns], 32 KB
  float acc[kAbsorbTokens][8];
#pragma unroll
  for (int j = 0; j < kAbsorbTokens; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.0f;
  if (group < groups) {
    for (int n0 = group; n0 < nope; n0 += kAbsorbRowsInFlight * groups) {
      uint4 wp[kAbsorbRowsInFlight];
#pragma unroll
      for (int u = 0; u < kAbsorbRowsInFlight; ++u) {
        const int n = n0 + u * groups;
        wp[u] = n < nope ? *reinterpret_cast<const uint4*>(w + static_cast<int64_t>(n) * latent + lane * 8)
                         : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kAbsorbRowsInFlight; ++u) {
        const int n = n0 + u * groups;
        if (n >= nope) break;
        const bf16* wv = reinterpret_cast<const bf16*>(&wp[u]);
#pragma unroll
        for (int j = 0; j < kAbsorbTokens; ++j) {
          if (j >= tokens) break;
          const float qn = to_f(q[(static_cast<int64_t>(j) * heads + h) * q_head_stride + n]);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[j][e] += qn * to_f(wv[e]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kAbsorbTokens; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) partial[(group * kAbsorbTokens + j) * columns + lane * 8 + e] = acc[j][e];
  }
  __syncthreads();
  for (int o = threadIdx.x; o < tokens * columns; o += kAbsorbThreads) {
    const int j = o / columns, l = o % columns;
    float sum = 0.0f;
    for (int g = 0; g < groups; ++g) sum += partial[(g * kAbsorbTokens + j) * columns + l];
    q_latent[(static_cast<int64_t>(j) * heads + h) * latent + col0 + l] = to_bf(sum);
  }
}

}  // namespace

bool mla_q_absorb_streaming_supported(const ops::MlaQAbsorbParams& p) {
  return p.latent % 8 == 0 && aligned16({p.kv_b});
}

bool mla_q_absorb_small_supported(const ops::MlaQAbsorbParams& p) {
  return p.tokens >= 1 && p.tokens <= kAbsorbTokens && mla_q_absorb_streaming_supported(p);
}

void launch_mla_q_absorb_small(const ops::MlaQAbsorbParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const int64_t token_groups = (p.tokens + kAbsorbTokens - 1) / kAbsorbTokens;
  launch_pdl(mla_q_absorb_small_kernel,
             dim3(static_cast<unsigned>(p.heads * token_groups),
                  static_cast<unsigned>((p.latent + kAbsorbColumns - 1) / kAbsorbColumns)),
             kAbsorbThreads, 0, stream, p, static_cast<int>(token_groups));
}

// Splits of a batch-invariant launch: enough for the longest context's invariant runs.
int invariant_splits_for(int64_t max_context) {
  const int64_t length = token_split_length(0, static_cast<int>(std::min<int64_t>(max_context, 1 << 30)));
  return static_cast<int>(std::min<int64_t>(kMaxSplits, (max_context + length - 1) / length));
}

int64_t mla_workspace_bytes(const ops::MlaAttentionParams& p, bool batch_invariant) {
  const int64_t max_context = p.max_pages_per_seq * p.page_size;
  const int64_t splits =
      batch_invariant ? invariant_splits_for(max_context) : splits_for(p.tokens, p.heads, max_context);
  const int64_t n = p.tokens * p.heads * splits;
  const int64_t split_bytes = 4 * (acc_offset(n) + n * p.latent);
  return mla_decode_supported(p) ? std::max(split_bytes, mla_decode_workspace_bytes()) : split_bytes;
}

namespace {

// The tiled kernel from this many cached rows of capacity per sequence, the split kernels
// below it, where they measured faster (docs/benchmarks.md, "Long contexts").
constexpr int64_t kTiledMinContext = 4096;

// All heads of a token per block with a balanced schedule (mla_decode.cu) where the shape
// allows (and always for an fp8 cache, which only it reads); its splits depend on the batch, so
// batch-invariant mode keeps the split kernels. False: not launched.
bool launched_tiled(const ops::MlaAttentionParams& p, const KernelPolicy& policy, void* workspace,
                    cudaStream_t stream) {
  const bool fits = !policy.batch_invariant && mla_decode_supported(p);
  if (p.cache_fp8 && !fits)
    throw std::invalid_argument(
        "mla_attention: an fp8 KV cache (--kv-cache-dtype fp8_e4m3) needs latent 512, rope 64, heads a multiple of 64 "
        "(got " +
        std::to_string(p.heads) + ") and no --batch-invariant");
  const bool short_context = p.max_pages_per_seq * p.page_size < kTiledMinContext;
  if (!p.cache_fp8 && (!fits || !policy.mla_tensor_cores || short_context)) return false;
  launch_mla_decode(p, workspace, stream);
  return true;
}

}  // namespace

void launch_mla_attention(const ops::MlaAttentionParams& p, const KernelPolicy& policy, void* workspace,
                          cudaStream_t stream) {
  if (p.latent > kMaxLatent)
    throw std::invalid_argument("mla_attention: unsupported latent (kv_lora_rank) " + std::to_string(p.latent) +
                                " (max " + std::to_string(kMaxLatent) + ")");
  if (p.rope > kMaxRope)
    throw std::invalid_argument("mla_attention: unsupported rope (qk_rope_head_dim) " + std::to_string(p.rope) +
                                " (max " + std::to_string(kMaxRope) + ")");
  const int64_t tokens = p.tokens, heads = p.heads, latent = p.latent;
  if (tokens == 0) return;
  const int64_t max_context = p.max_pages_per_seq * p.page_size;
  if (launched_tiled(p, policy, workspace, stream)) return;
  // Kernel 1 (one of three) writes the splits' partial states; the merge kernel combines them.
  const bool on_tensor_cores = policy.mla_tensor_cores && mma_shapes(p);
  int splits = splits_for(tokens, heads, max_context);  // the workspace holds this many
  int split_length = 0;  // 0: each token's own runs (token_split_length), batch-invariant
  if (policy.batch_invariant) {
    splits = invariant_splits_for(max_context);  // blocks past a token's own runs stay empty
  } else if (on_tensor_cores) {
    // Whole tiles per split; as many splits as that takes to hold the context.
    const int64_t wanted = std::min(splits, mma_splits_for(tokens, heads, max_context));
    const int64_t rows_per_split = (max_context + wanted - 1) / wanted;
    split_length = static_cast<int>((rows_per_split + kMmaRows - 1) / kMmaRows * kMmaRows);
    splits = static_cast<int>((max_context + split_length - 1) / split_length);
  } else {
    split_length = static_cast<int>((max_context + splits - 1) / splits);
  }
  if (on_tensor_cores) {
    configure_mma_kernel();
    launch_pdl(
        mla_split_mma_kernel,
        dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(head_blocks(heads)), static_cast<unsigned>(splits)),
        kMmaWarps * 32, kMmaSharedBytes, stream, p, carve(workspace, tokens, heads, splits, latent), split_length);
  } else {
    const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((heads + kHeadsPerBlock - 1) / kHeadsPerBlock),
                    static_cast<unsigned>(splits));
    auto* kernel = vec_shapes(latent, p.rope, p.q_latent, p.cache) ? mla_split_vec_kernel : mla_split_kernel;
    launch_pdl(kernel, grid, kHeadsPerBlock * 32, 0, stream, p, carve(workspace, tokens, heads, splits, latent),
               split_length);
  }
  const int merge_threads = static_cast<int>(std::min<int64_t>(512, (latent + 31) / 32 * 32));
  launch_pdl(mla_merge_kernel, dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(heads)), merge_threads, 0,
             stream, carve(workspace, tokens, heads, splits, latent), static_cast<bf16*>(p.out),
             static_cast<int>(heads), static_cast<int>(latent), splits);
}

}  // namespace moeserve::cuda
