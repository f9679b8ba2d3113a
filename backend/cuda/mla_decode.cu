// MLA decode attention on tensor cores, all 64 heads of a head group against a tile of cache
// rows at once (FlashMLA's decomposition, on mma.sync): the latent row is shared by every
// head, so the heads are the MMA's M dimension and each cache row is read from HBM once per
// token instead of once per 16 heads.
//
// Work: a "sequence" is (token, group of 64 heads); its context [0, position] is cut into
// tiles of kRows cache rows. All sequences' tiles, in order, form one line of `total` tiles;
// block p of the grid (one per SM) takes the run [p total / parts, (p + 1) total / parts) of it
// (FlashMLA's tile scheduler: equal work per SM for any mix of context lengths). Every block
// derives the schedule itself from the positions (a block-wide scan), so nothing is computed on
// the host and a captured graph replays it for any positions. A sequence wholly inside one
// block's run is finished there (normalised, bf16 out); one cut by run boundaries leaves a
// partial softmax state per piece (at most two per block: its first and its last sequence),
// which the combine kernel merges in order.
//
// Block: 8 warps, a three-stage cp.async pipeline of row tiles in shared memory beside the
// group's queries Q [64 heads][576]: two tiles (74 KB) stay in flight while one is computed,
// and the next load is issued only after the tile's first barrier, when every warp is done
// with the previous tile, so a tile costs three block barriers (four with fp8). Per tile:
//   S = Q K^T [64 x 32]: warp w computes heads 32 (w % 2) .. + 31 over a quarter of the 576
//     columns (9 MMA k-steps); the quarters' partial sums meet in shared memory.
//   softmax: warp w owns heads 8 w .. 8 w + 7 (running max and denominator in registers),
//     writes P [64 x 32] (over the first quarter's partial S, which only its own warp reads)
//     as a bf16 high part and a bf16 remainder (two MMAs: the weights keep
//     ~16 bits like the fp32 weights of the CUDA-core kernels and the CPU reference; bf16 alone,
//     FlashMLA's choice, measured 1-4% faster but parts from the reference's roundings) and
//     each head's rescale factor.
//   O = O * correction + P V: warp w accumulates heads 32 (w % 2) .. + 31 by latent columns
//     128 (w / 2) .. + 127 (128 fp32 accumulators per thread).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/mla_decode.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/smem_copy.cuh"
#include "cuda_common/common.cuh"

namespace moeserve::cuda {

namespace {

constexpr int kHeads = 64;  // heads per sequence: four MMA row tiles
constexpr int kRows = 32;   // cache rows per tile
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kLatent = 512, kRope = 64, kWidth = kLatent + kRope;
constexpr int kStride = kWidth + 8;                    // bf16 per shared row: 1168 bytes, ldmatrix rows conflict-free
constexpr int kSlices = 4;                             // column quarters of S
constexpr int kStepsPerSlice = kWidth / 16 / kSlices;  // 9 MMA k-steps
constexpr int kRedStride = kRows + 8;                  // floats per row of a partial S
constexpr int kPStride = 2 * kRedStride;               // bf16 per row of P: [high 32 | remainder 32 | pad]
constexpr int kStages = 3;                             // row tiles in shared memory: two load while one computes
constexpr int kMinTilesPerPart = 2;  // a block's run amortises its load of Q (two tiles' bytes, from L2)

constexpr int kFp8Stride = kWidth + 16;  // bytes per staged fp8 row (16-byte aligned rows)

// bf16 cache: kStages tiles (cp.async straight into the MMA's tiles). fp8 cache: kStages
// staged tiles of codes and one bf16 tile that the codes are widened into. P lives in the
// first quarter of the partial S (the softmax reads it into registers first), which is what
// lets three bf16 tiles fit beside Q.
template <bool kFp8>
struct SharedLayout {
  static constexpr int bf16_tiles = kFp8 ? 1 : kStages;
  static constexpr size_t q = 0;                                        // bf16 [kHeads][kStride]
  static constexpr size_t tiles = q + sizeof(bf16) * kHeads * kStride;  // bf16 [bf16_tiles][kRows][kStride]
  static constexpr size_t staged =
      tiles + sizeof(bf16) * bf16_tiles * kRows * kStride;  // u8 [kStages][kRows][kFp8Stride]
  static constexpr size_t red =
      staged + (kFp8 ? kStages * kRows * kFp8Stride : 0);  // float [kSlices][kHeads][kRedStride]
  static constexpr size_t p = red;                         // bf16 [kHeads][kPStride], over red[0]
  static constexpr size_t correction = red + sizeof(float) * kSlices * kHeads * kRedStride;  // float [kHeads]
  static constexpr size_t inv_denom = correction + sizeof(float) * kHeads;                   // float [kHeads]
  static constexpr size_t scan = inv_denom + sizeof(float) * kHeads;                         // int [kWarps + 8]
  static constexpr size_t bytes = scan + sizeof(int) * (kWarps + 8);
  static_assert(bytes <= 227 * 1024, "MLA decode shared memory over the H100/H200 per-block limit");
};

// The inputs in the types the kernels compute with.
struct DecodeInputs {
  const bf16* q_latent;  // [T, heads, 512]
  const bf16* q_rope;    // [T, heads, q_head_stride], rope at rope_offset
  const void* cache;     // [pages * page_size, 576] bf16 or fp8 codes
  const int32_t* block_tables;
  const int32_t* seq_of_token;
  const int32_t* positions;
  bf16* out;  // [T, heads, 512]
  int tokens, heads, groups, page_size;
  int64_t q_head_stride, rope_offset, max_pages_per_seq;
  float scale;        // of the scores (times the fp8 cache's scale)
  float value_scale;  // of the output: the fp8 cache's scale, else 1
};

DecodeInputs decode_inputs(const ops::MlaAttentionParams& p) {
  return {static_cast<const bf16*>(p.q_latent),
          static_cast<const bf16*>(p.q_rope),
          p.cache,
          p.block_tables,
          p.seq_of_token,
          p.positions,
          static_cast<bf16*>(p.out),
          static_cast<int>(p.tokens),
          static_cast<int>(p.heads),
          static_cast<int>(p.heads / kHeads),
          static_cast<int>(p.page_size),
          p.q_head_stride,
          p.rope_offset,
          p.max_pages_per_seq,
          p.cache_fp8 ? p.scale * p.cache_scale : p.scale,
          p.cache_fp8 ? p.cache_scale : 1.0f};
}

// Partial softmax states of the pieces of cut sequences: slot 2 p holds block p's first
// sequence, 2 p + 1 its last (when that is cut too).
struct DecodePartials {
  float* m;     // [2 parts][kHeads]: running max
  float* l;     // [2 parts][kHeads]: denominator
  float* acc;   // [2 parts][kHeads][kLatent]: unnormalised output
  int4* tasks;  // [parts]: the combine's work, from the decode kernel (PartTask)
};

DecodePartials carve_partials(void* workspace, int parts) {
  auto* f = static_cast<float*>(workspace);
  const int64_t states = static_cast<int64_t>(2) * parts * kHeads;
  return {f, f + states, f + 2 * states, reinterpret_cast<int4*>(f + 2 * states + states * kLatent)};
}

__device__ __forceinline__ int sequence_tiles(const DecodeInputs& in, int s) {
  return (in.positions[s / in.groups] + 1 + kRows - 1) / kRows;
}

// Exclusive prefix sum of v over the block; total gets the block's sum. scratch: kWarps ints.
__device__ int block_exclusive_sum(int v, int* scratch, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, offset);
    if (lane >= offset) x += y;
  }
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  int base = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    base += w < warp ? scratch[w] : 0;
    total += scratch[w];
  }
  __syncthreads();
  return base + x - v;
}

// Block `part`'s run of the tile line: tiles [begin, end); its first sequence `first` starts at
// tile `first_start` (<= begin). Parts beyond `parts` (too little work to spread) get nothing.
struct Run {
  int total, parts, begin, end, first, first_start;
  __device__ int part_begin(int q) const { return static_cast<int>(static_cast<int64_t>(q) * total / parts); }
  // The part whose run holds tile x.
  __device__ int part_of(int x) const { return static_cast<int>((static_cast<int64_t>(x + 1) * parts - 1) / total); }
};

__device__ Run block_run(const DecodeInputs& in, int part, int* scratch) {
  const int sequences = in.tokens * in.groups;
  Run r{};
  for (int base = 0; base < sequences; base += kThreads) {
    const int s = base + static_cast<int>(threadIdx.x);
    int chunk = 0;
    block_exclusive_sum(s < sequences ? sequence_tiles(in, s) : 0, scratch, chunk);
    r.total += chunk;
  }
  r.parts = max(1, min(static_cast<int>(gridDim.x), r.total / kMinTilesPerPart));
  r.begin = part < r.parts ? r.part_begin(part) : r.total;
  r.end = part < r.parts ? r.part_begin(part + 1) : r.total;
  int* found = scratch + kWarps;  // [first, first_start]
  if (threadIdx.x == 0) found[0] = found[1] = 0;
  __syncthreads();
  int carry = 0;
  for (int base = 0; base < sequences && r.begin < r.end; base += kThreads) {
    const int s = base + static_cast<int>(threadIdx.x);
    const int tiles = s < sequences ? sequence_tiles(in, s) : 0;
    int chunk = 0;
    const int start = carry + block_exclusive_sum(tiles, scratch, chunk);
    if (start <= r.begin && r.begin < start + tiles) {
      found[0] = s;
      found[1] = start;
    }
    carry += chunk;
  }
  __syncthreads();
  r.first = found[0];
  r.first_start = found[1];
  return r;
}

// A piece of one sequence: its rows [row_begin, row_end) and where its result goes.
struct Piece {
  int token, group, row_begin, row_end;
  bool whole;  // the whole sequence: normalised into out; else a partial state in `slot`
  int slot;
};

struct PieceState {
  float o[2][16][4];         // O [heads 32 (warp % 2) + 16 mt + {group, group + 8}][the warp's 128 columns]
  float running_max, denom;  // of head 8 warp + lane / 4 (the softmax role)
};

// Q of the piece's heads into shared memory (cp.async, joins the first tile's group).
__device__ void load_queries(const DecodeInputs& in, const Piece& piece, bf16* q_s) {
  constexpr int kChunks = kWidth / 8;
  const int h = threadIdx.x >> 2;  // 4 threads per head
  const int64_t th = static_cast<int64_t>(piece.token) * in.heads + piece.group * kHeads + h;
  for (int c = threadIdx.x & 3; c < kChunks; c += 4) {
    const int column = c * 8;
    const bf16* src = column < kLatent ? in.q_latent + th * kLatent + column
                                       : in.q_rope + th * in.q_head_stride + in.rope_offset + (column - kLatent);
    cp_async_16(q_s + h * kStride + column, src);
  }
}

// Rows [first, first + kRows) of the sequence into `tile` (bf16 rows of kStride elements, or
// fp8 rows of kFp8Stride bytes); rows at or past `end` are zeros.
template <bool kFp8>
__device__ void load_tile(const DecodeInputs& in, const int32_t* table, int first, int end, void* tile) {
  constexpr int kRowBytes = kWidth * (kFp8 ? 1 : 2), kChunks = kRowBytes / 16;
  constexpr int kTileStride = kFp8 ? kFp8Stride : kStride * 2;  // bytes
  const int r = threadIdx.x >> 3, pos = first + r;              // 8 threads per row
  const bool valid = pos < end;
  const char* row = static_cast<const char*>(in.cache);
  if (valid) row += (static_cast<int64_t>(table[pos / in.page_size]) * in.page_size + pos % in.page_size) * kRowBytes;
  char* dst = static_cast<char*>(tile) + r * kTileStride;
  for (int c = threadIdx.x & 7; c < kChunks; c += 8)
    cp_async_16_or_zero(dst + c * 16, row + (valid ? c * 16 : 0), valid);
}

// A staged tile of fp8 codes widened into the bf16 tile (exact), 8 codes per step.
__device__ void widen_tile(const uint8_t* staged, bf16* tile) {
  constexpr int kUnits = kRows * kWidth / 8;
  for (int u = threadIdx.x; u < kUnits; u += kThreads) {
    const int r = u / (kWidth / 8), column = (u % (kWidth / 8)) * 8;
    const uint2 codes = *reinterpret_cast<const uint2*>(staged + r * kFp8Stride + column);
    uint4 wide;
    e4m3x4_to_bf16x4(codes.x, wide.x, wide.y);
    e4m3x4_to_bf16x4(codes.y, wide.z, wide.w);
    *reinterpret_cast<uint4*>(tile + r * kStride + column) = wide;
  }
}

// Partial S of this warp (heads 32 hh .., column quarter `slice`) into red[slice].
__device__ void score_tile(const bf16* q_s, const bf16* tile, float* red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, quad = lane & 3;
  const int hh = warp & 1, slice = warp >> 1;
  float s[2][4][4] = {};
#pragma unroll 3
  for (int step = 0; step < kStepsPerSlice; ++step) {
    const int k = (slice * kStepsPerSlice + step) * 16;
    uint32_t a[2][4], b[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldmatrix_x4(a[mt], q_s + (32 * hh + 16 * mt + (lane & 15)) * kStride + k + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < 2; ++np)
      ldmatrix_x4(b[np], tile + (16 * np + (lane & 7) + ((lane >> 4) << 3)) * kStride + k + ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        mma_16x8x16(s[mt][nt], a[mt], b[nt >> 1][2 * (nt & 1)], b[nt >> 1][2 * (nt & 1) + 1]);
  }
  float* mine = red + slice * kHeads * kRedStride;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int head = 32 * hh + 16 * mt + group, row = 8 * nt + 2 * quad;
      *reinterpret_cast<float2*>(mine + head * kRedStride + row) = make_float2(s[mt][nt][0], s[mt][nt][1]);
      *reinterpret_cast<float2*>(mine + (head + 8) * kRedStride + row) = make_float2(s[mt][nt][2], s[mt][nt][3]);
    }
}

// The softmax role: head 8 warp + lane / 4, rows 8 (lane % 4) .. + 7 of the tile (`valid` of
// them real). Writes P (high part, remainder) and the head's rescale factor.
__device__ void softmax_tile(const float* red, int valid, float scale, PieceState& st, bf16* p_s, float* correction) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int head = 8 * warp + (lane >> 2), r0 = 8 * (lane & 3);
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = 0.0f;
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
    const float4* src = reinterpret_cast<const float4*>(red + (slice * kHeads + head) * kRedStride + r0);
    const float4 x = src[0], y = src[1];
    v[0] += x.x, v[1] += x.y, v[2] += x.z, v[3] += x.w, v[4] += y.x, v[5] += y.y, v[6] += y.z, v[7] += y.w;
  }
  float tile_max = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] = r0 + j < valid ? v[j] * scale : -INFINITY;
    tile_max = fmaxf(tile_max, v[j]);
  }
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  const float new_max = fmaxf(st.running_max, tile_max);  // finite: row 0 of a tile is always real
  const float corr = __expf(st.running_max - new_max);    // 0 on the first tile (-inf)
  float sum = 0.0f;
  uint4 hi, lo;  // bf16 pairs of rows r0 + 2 i, r0 + 2 i + 1
  uint32_t* hi32 = reinterpret_cast<uint32_t*>(&hi);
  uint32_t* lo32 = reinterpret_cast<uint32_t*>(&lo);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float p0 = v[2 * i] == -INFINITY ? 0.0f : __expf(v[2 * i] - new_max);
    const float p1 = v[2 * i + 1] == -INFINITY ? 0.0f : __expf(v[2 * i + 1] - new_max);
    sum += p0 + p1;
    const bf16 h0 = to_bf(p0), h1 = to_bf(p1);
    hi32[i] = pack_bf16x2(h0, h1);
    lo32[i] = pack_bf16x2(to_bf(p0 - to_f(h0)), to_bf(p1 - to_f(h1)));
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  st.denom = st.denom * corr + sum;
  st.running_max = new_max;
  __syncwarp();  // P of the head overwrites red[0][head], which the head's lanes (this warp) read above
  *reinterpret_cast<uint4*>(p_s + head * kPStride + r0) = hi;
  *reinterpret_cast<uint4*>(p_s + head * kPStride + kRows + r0) = lo;
  if ((lane & 3) == 0) correction[head] = corr;
}

// O = O * correction + P V for this warp's heads and 128 columns.
__device__ void accumulate_tile(const bf16* tile, const bf16* p_s, const float* correction, PieceState& st) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2;
  const int hh = warp & 1, column0 = 128 * (warp >> 1);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const float c0 = correction[32 * hh + 16 * mt + group], c1 = correction[32 * hh + 16 * mt + group + 8];
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      st.o[mt][nt][0] *= c0, st.o[mt][nt][1] *= c0;
      st.o[mt][nt][2] *= c1, st.o[mt][nt][3] *= c1;
    }
  }
#pragma unroll
  for (int step = 0; step < kRows / 16; ++step) {
    uint32_t a_hi[2][4], a_lo[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int row = 32 * hh + 16 * mt + (lane & 15), column = 16 * step + (lane >> 4) * 8;
      ldmatrix_x4(a_hi[mt], p_s + row * kPStride + column);
      ldmatrix_x4(a_lo[mt], p_s + row * kPStride + kRows + column);
    }
#pragma unroll
    for (int np = 0; np < 8; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(
          b, tile + (16 * step + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + column0 + 16 * np + (lane >> 4) * 8);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma_16x8x16(st.o[mt][2 * np], a_hi[mt], b[0], b[1]);
        mma_16x8x16(st.o[mt][2 * np + 1], a_hi[mt], b[2], b[3]);
        mma_16x8x16(st.o[mt][2 * np], a_lo[mt], b[0], b[1]);
        mma_16x8x16(st.o[mt][2 * np + 1], a_lo[mt], b[2], b[3]);
      }
    }
  }
}

// The piece's result: normalised bf16 into out, or the partial state into its slot.
__device__ void store_piece(const DecodeInputs& in, const Piece& piece, const PieceState& st, DecodePartials partials,
                            float* inv_denom) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, quad = lane & 3;
  {
    const int head = 8 * warp + (lane >> 2);
    if (piece.whole) {
      if ((lane & 3) == 0) inv_denom[head] = 1.0f / st.denom;
    } else if ((lane & 3) == 0) {
      partials.m[piece.slot * kHeads + head] = st.running_max;
      partials.l[piece.slot * kHeads + head] = st.denom;
    }
  }
  __syncthreads();
  const int hh = warp & 1, column0 = 128 * (warp >> 1);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int head = 32 * hh + 16 * mt + group + 8 * half;
      const float f = piece.whole ? inv_denom[head] * in.value_scale : in.value_scale;
      const int64_t row = piece.whole
                              ? (static_cast<int64_t>(piece.token) * in.heads + piece.group * kHeads + head) * kLatent
                              : (static_cast<int64_t>(piece.slot) * kHeads + head) * kLatent;
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        const int column = column0 + 8 * nt + 2 * quad;
        const float x = st.o[mt][nt][2 * half] * f, y = st.o[mt][nt][2 * half + 1] * f;
        if (piece.whole)
          *reinterpret_cast<__nv_bfloat162*>(in.out + row + column) = __floats2bfloat162_rn(x, y);
        else
          *reinterpret_cast<float2*>(partials.acc + row + column) = make_float2(x, y);
      }
    }
}

template <bool kFp8>
__device__ void run_piece(const DecodeInputs& in, const Piece& piece, unsigned char* shared, DecodePartials partials) {
  using Layout = SharedLayout<kFp8>;
  bf16* q_s = reinterpret_cast<bf16*>(shared + Layout::q);
  bf16* tiles = reinterpret_cast<bf16*>(shared + Layout::tiles);
  uint8_t* staged = shared + Layout::staged;
  float* red = reinterpret_cast<float*>(shared + Layout::red);
  bf16* p_s = reinterpret_cast<bf16*>(shared + Layout::p);
  float* correction = reinterpret_cast<float*>(shared + Layout::correction);
  // Where tile i's copy lands: its bf16 buffer, or its staging buffer of codes.
  auto landing = [&](int i) -> void* {
    return kFp8 ? static_cast<void*>(staged + (i % kStages) * kRows * kFp8Stride)
                : static_cast<void*>(tiles + (i % kStages) * kRows * kStride);
  };
  const int32_t* table = in.block_tables + static_cast<int64_t>(in.seq_of_token[piece.token]) * in.max_pages_per_seq;
  const int n = (piece.row_end - piece.row_begin + kRows - 1) / kRows;
  PieceState st;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[mt][nt][e] = 0.0f;
  st.running_max = -INFINITY;
  st.denom = 0.0f;
  __syncthreads();  // the previous piece is done with every buffer
  // Commit groups: Q with tile 0, then one per tile (empty past the end), so before tile i
  // the newest group is tile i + 1's.
  load_queries(in, piece, q_s);
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n) load_tile<kFp8>(in, table, piece.row_begin + i * kRows, piece.row_end, landing(i));
    cp_async_commit();
  }
  for (int i = 0; i < n; ++i) {
    bf16* tile = kFp8 ? tiles : static_cast<bf16*>(landing(i));
    cp_async_wait<kStages - 2>();
    __syncthreads();                    // tile i (and Q) visible to every warp; every warp is done with tile i - 1
    const int ahead = i + kStages - 1;  // into tile i - 1's buffer
    if (ahead < n) load_tile<kFp8>(in, table, piece.row_begin + ahead * kRows, piece.row_end, landing(ahead));
    cp_async_commit();
    if (kFp8) {
      widen_tile(static_cast<const uint8_t*>(landing(i)), tile);
      __syncthreads();
    }
    score_tile(q_s, tile, red);
    __syncthreads();
    softmax_tile(red, piece.row_end - (piece.row_begin + i * kRows), in.scale, st, p_s, correction);
    __syncthreads();
    accumulate_tile(tile, p_s, correction, st);
  }
  store_piece(in, piece, st, partials, reinterpret_cast<float*>(shared + Layout::inv_denom));
}

// Grid: one block per part (SM), kThreads threads, SharedLayout<kFp8>::bytes of dynamic shared memory.
// The combine's task of part p: its last sequence when that is cut by the run's end and
// starts inside the run ({token, group, slot of its first piece, pieces}), else pieces 0.
__device__ int4 part_task(const DecodeInputs& in, const Run& run, int part) {
  if (run.begin >= run.end) return make_int4(0, 0, 0, 0);
  int s = run.first, start = run.first_start;
  while (start + sequence_tiles(in, s) < run.end) start += sequence_tiles(in, s++);
  const int stop = start + sequence_tiles(in, s);
  if (stop <= run.end || start < run.begin) return make_int4(0, 0, 0, 0);
  const int pieces = run.part_of(stop - 1) - part + 1;
  return make_int4(s / in.groups, s % in.groups, 2 * part + (s == run.first ? 0 : 1), pieces);
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(const DecodeInputs in, DecodePartials partials) {
  extern __shared__ __align__(16) unsigned char shared[];
  pdl_enter();
  const int part = blockIdx.x;
  const Run run = block_run(in, part, reinterpret_cast<int*>(shared + SharedLayout<kFp8>::scan));
  if (threadIdx.x == 0) partials.tasks[part] = part_task(in, run, part);
  if (run.begin >= run.end) return;  // a part beyond the work
  int s = run.first, start = run.first_start;
  while (start < run.end) {
    const int tiles = sequence_tiles(in, s);
    const int token = s / in.groups, context = in.positions[token] + 1;
    Piece piece;
    piece.token = token;
    piece.group = s % in.groups;
    piece.row_begin = (max(run.begin, start) - start) * kRows;
    piece.row_end = min(context, (min(run.end, start + tiles) - start) * kRows);
    piece.whole = start >= run.begin && start + tiles <= run.end;
    piece.slot = 2 * part + (s == run.first ? 0 : 1);
    run_piece<kFp8>(in, piece, shared, partials);
    start += tiles;
    ++s;
  }
}

// Grid (parts, kHeads), kCombineThreads threads: block (p, h) merges head h of the sequence
// that part p's task names (a sequence cut by p's run end that starts in p's run): its pieces
// in parts p, p + 1, ..., in order, each thread 4 of the 512 columns.
constexpr int kCombineThreads = kLatent / 4;

__global__ void __launch_bounds__(kCombineThreads)
    mla_decode_combine_kernel(const DecodeInputs in, DecodePartials partials) {
  __shared__ float weight[1024];
  __shared__ float reduce[kCombineThreads / 32];
  pdl_enter();
  const int part = blockIdx.x, head = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int4 task = partials.tasks[part];  // token, group, slot of the first piece, pieces
  if (task.w == 0) return;
  auto slot_of = [&](int i) { return i == 0 ? task.z : 2 * (part + i); };
  auto block_reduce = [&](float v, bool is_max) {
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, v, offset);
      v = is_max ? fmaxf(v, o) : v + o;
    }
    if (lane == 0) reduce[warp] = v;
    __syncthreads();
    v = reduce[0];
    for (int w = 1; w < kCombineThreads / 32; ++w) v = is_max ? fmaxf(v, reduce[w]) : v + reduce[w];
    __syncthreads();
    return v;
  };
  float global_max = -INFINITY;
  for (int i = threadIdx.x; i < task.w; i += kCombineThreads)
    global_max = fmaxf(global_max, partials.m[slot_of(i) * kHeads + head]);
  global_max = block_reduce(global_max, true);
  float denom = 0.0f;
  for (int i = threadIdx.x; i < task.w; i += kCombineThreads) {
    const float w = __expf(partials.m[slot_of(i) * kHeads + head] - global_max);  // every piece has rows
    weight[i] = w;
    denom += w * partials.l[slot_of(i) * kHeads + head];
  }
  const float inv_denom = 1.0f / block_reduce(denom, false);  // its syncs also publish weight[]
  const int column = 4 * threadIdx.x;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
  for (int i = 0; i < task.w; ++i) {
    const float4 a = *reinterpret_cast<const float4*>(
        partials.acc + (static_cast<int64_t>(slot_of(i)) * kHeads + head) * kLatent + column);
    const float w = weight[i];
    sum.x += w * a.x, sum.y += w * a.y, sum.z += w * a.z, sum.w += w * a.w;
  }
  bf16* out = in.out + (static_cast<int64_t>(task.x) * in.heads + task.y * kHeads + head) * kLatent + column;
  reinterpret_cast<__nv_bfloat162*>(out)[0] = __floats2bfloat162_rn(sum.x * inv_denom, sum.y * inv_denom);
  reinterpret_cast<__nv_bfloat162*>(out)[1] = __floats2bfloat162_rn(sum.z * inv_denom, sum.w * inv_denom);
}

// Streaming multiprocessors of the current device (the grid: one block each), asked once per
// device and thread.
int parts_of_device() {
  static thread_local int device_of_count = -1, count = 0;
  int device = 0;
  cudaGetDevice(&device);
  if (device != device_of_count) {
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    count = std::clamp(count, 1, 1024);  // the combine kernel's weights hold 1024 pieces
    cudaFuncSetAttribute(mla_decode_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(SharedLayout<false>::bytes));
    cudaFuncSetAttribute(mla_decode_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(SharedLayout<true>::bytes));
    device_of_count = device;
  }
  return count;
}

}  // namespace

bool mla_decode_supported(const ops::MlaAttentionParams& p) {
  return p.latent == kLatent && p.rope == kRope && p.heads >= kHeads && p.heads % kHeads == 0 &&
         p.q_head_stride % 8 == 0 && p.rope_offset % 8 == 0 && aligned16({p.q_latent, p.q_rope, p.cache, p.out}) &&
         p.tokens * (p.heads / kHeads) < (int64_t{1} << 30);
}

int64_t mla_decode_workspace_bytes() {
  const int64_t parts = parts_of_device();
  return 4 * 2 * parts * kHeads * (2 + kLatent) + static_cast<int64_t>(sizeof(int4)) * parts;
}

void launch_mla_decode(const ops::MlaAttentionParams& p, void* workspace, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const int parts = parts_of_device();
  const DecodePartials partials = carve_partials(workspace, parts);
  auto* kernel = p.cache_fp8 ? mla_decode_kernel<true> : mla_decode_kernel<false>;
  const size_t shared = p.cache_fp8 ? SharedLayout<true>::bytes : SharedLayout<false>::bytes;
  launch_pdl(kernel, dim3(parts), kThreads, shared, stream, decode_inputs(p), partials);
  launch_pdl(mla_decode_combine_kernel, dim3(parts, kHeads), kCombineThreads, 0, stream, decode_inputs(p), partials);
}

}  // namespace moeserve::cuda
