// Int4 weight rows streamed through shared memory for the tensor-core dot products of
// quant_mma.cuh, without changing the stored layout (ops/quant_layout.h):
//   - every lane copies 16 contiguous bytes per cp.async (a row's 128-byte stage chunk is 8
//     lanes), where loading the fragments straight from global memory takes 4 bytes a lane;
//   - a warp keeps kStreamStages stages of its own K range in flight (multi-stage cp.async
//     pipeline, warp-private: no block barrier in the K loop);
//   - ldmatrix hands each lane exactly the words quant_mma.cuh's fragments take (word quad of
//     the step's 16 bytes of rows group and group + 8), so the stored layout needs no repack;
//     chunks are XOR-swizzled by row so that neither the copies nor ldmatrix conflict on banks;
//   - a stage also carries its rows' scales (16 >> scale_shift bytes a row).
// Stage = kStreamSteps int4 steps (32 elements, 16 bytes of each row) of kRows weight rows:
//   values [kRows][8 chunks of 16 B] (chunk c of row r at c ^ (r % 8)), scales [kRows][16 B].
#pragma once

#include "backend/cuda/quant_mma.cuh"
#include "backend/cuda/smem_copy.cuh"

namespace moeserve::cuda {

constexpr int kStreamSteps = 8;   // int4 steps per stage: 256 K elements, 128 bytes of a row
constexpr int kStreamStages = 3;  // per warp: two stages loading while one is multiplied
constexpr int kStreamRowBytes = kStreamSteps * 16;

template <int kRowTiles>
struct Int4Stream {
  static constexpr int kRows = 16 * kRowTiles;
  static constexpr int kStageBytes = kRows * (kStreamRowBytes + 16);
  static constexpr int kWarpBytes = kStreamStages * kStageBytes;
};

// Whether an int4 weight with rows of k elements streams: whole stages, and every stage's
// scales a 16 >> scale_shift byte aligned chunk (k a multiple of 8 groups).
inline bool int4_stream_supported(int64_t k, const ops::QuantLayout& l) {
  return l.quant == ops::WeightQuant::int4_group && k % (8 * l.group_size) == 0;
}

// The weight rows of one block's tile: tile row r (0 .. kRows) is matrix row
// min(first[r / 16] + r % 16, last[r / 16]) (rows past the matrix repeat its last row; their
// outputs are not stored).
struct StreamRows {
  const char* values;                  // row 0's packed words
  const char* scales;                  // row 0's scales
  int64_t value_stride, scale_stride;  // bytes per row
  int64_t first[2], last[2];
  int scale_shift;  // log2(steps per scale)
};

// The K steps of warp `warp`: contiguous ranges of whole stages (the last ones may be empty).
__device__ __forceinline__ void stream_warp_steps(int steps, int warp, int warps, int& begin, int& end) {
  const int stages = steps / kStreamSteps, per_warp = (stages + warps - 1) / warps;
  begin = min(stages, warp * per_warp) * kStreamSteps;
  end = min(stages, warp * per_warp + per_warp) * kStreamSteps;
}

template <int kBytes>
__device__ __forceinline__ void cp_async_small(void* shared, const void* global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(shared)), "l"(global));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(shared_address(shared)), "l"(global), "n"(kBytes));
  }
#endif
}

// cp_async_wait with a compiler memory barrier: the stage's plain shared loads stay after it.
template <int kPending>
__device__ __forceinline__ void stream_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// Copies steps [step0, step0 + kStreamSteps) of the tile's rows into `stage` (this lane's part).
template <int kRowTiles>
__device__ __forceinline__ void issue_int4_stage(const StreamRows& m, int step0, char* stage, int lane) {
  constexpr int kRows = Int4Stream<kRowTiles>::kRows;
  const int chunk = lane & 7;
#pragma unroll
  for (int i = 0; i < kRows / 4; ++i) {
    const int r = 4 * i + (lane >> 3), rt = i / 4;  // rows 4i .. 4i + 3 lie in one 16-row tile
    const int64_t row = min(m.first[rt] + (r & 15), m.last[rt]);
    cp_async_small<16>(stage + r * kStreamRowBytes + ((chunk ^ (r & 7)) << 4),
                       m.values + row * m.value_stride + static_cast<int64_t>(step0 + chunk) * 16);
  }
  if (lane < kRows) {
    const bool second = lane >= 16;  // selects, not an index: m stays in registers
    const int64_t row = min((second ? m.first[1] : m.first[0]) + (lane & 15), second ? m.last[1] : m.last[0]);
    const char* src = m.scales + row * m.scale_stride + static_cast<int64_t>(step0 >> m.scale_shift) * 2;
    char* dst = stage + kRows * kStreamRowBytes + lane * 16;
    if (m.scale_shift == 0) {
      cp_async_small<16>(dst, src);
    } else if (m.scale_shift == 1) {
      cp_async_small<8>(dst, src);
    } else {
      cp_async_small<4>(dst, src);
    }
  }
}

// One token tile per pass: a stage's input fragments (8 registers of 4 words) are loaded
// before its weights are waited for, so their latency hides behind the weights' instead of
// stalling every step (measured: the step's input loads were the kernel's largest cost).
template <int kTiles>
constexpr bool kPreloadInputs = kTiles == 1;

template <int kTiles>
__device__ __forceinline__ void load_stage_inputs(const bf16* const (&x_rows)[kTiles], int tiles, int step0, int quad,
                                                  InputFragment<QuantKind::int4> (&pre)[kStreamSteps][kTiles]) {
  if constexpr (kPreloadInputs<kTiles>) {
#pragma unroll
    for (int u = 0; u < kStreamSteps; ++u)
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile)
        if (tile < tiles) load_input<QuantKind::int4>(x_rows[tile], step0 + u, quad, pre[u][tile]);
  }
}

// acc += the stage's steps (quant_step_dot's layout and arithmetic). gate_up (2 row tiles):
// one ldmatrix.x4 per step gives rows (rt, half) = matrix 2 rt + half; down (1 row tile): one
// per two steps, matrix 2 j + half = step u + j.
template <int kRowTiles, int kTiles>
__device__ __forceinline__ void int4_stage_dot(const char* stage, int scale_shift, int step0,
                                               const bf16* const (&x_rows)[kTiles],
                                               const InputFragment<QuantKind::int4> (&pre)[kStreamSteps][kTiles],
                                               int tiles, int lane, float (&acc)[kTiles][kRowTiles][4]) {
  constexpr int kRows = Int4Stream<kRowTiles>::kRows;
  const int quad = lane & 3, group = lane >> 2;
  const bf16* scales = reinterpret_cast<const bf16*>(stage + kRows * kStreamRowBytes);
  constexpr int kStepsPerLoad = kRowTiles == 2 ? 1 : 2;
#pragma unroll
  for (int u = 0; u < kStreamSteps; u += kStepsPerLoad) {
    uint32_t d[4];
    const int r = kRowTiles == 2 ? lane : (lane & 15), c = kRowTiles == 2 ? u : u + (lane >> 4);
    ldmatrix_x4(d, stage + r * kStreamRowBytes + ((c ^ (r & 7)) << 4));
#pragma unroll
    for (int j = 0; j < kStepsPerLoad; ++j) {
      uint32_t w[kRowTiles][2];
      float scale[kRowTiles][2];
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          w[rt][half] = d[2 * (rt + j) + half];
          scale[rt][half] = to_f(scales[(rt * 16 + half * 8 + group) * 8 + ((u + j) >> scale_shift)]);
        }
      if constexpr (kPreloadInputs<kTiles>) {
        quant_step_mma<QuantKind::int4, kRowTiles, kTiles>(w, scale, pre[u + j], tiles, acc);
      } else {
        quant_step_dot<QuantKind::int4, kRowTiles, kTiles>(w, scale, x_rows, tiles, step0 + u + j, quad, acc);
      }
    }
  }
}

// acc += the dot products over this warp's steps [step_begin, step_end) (whole stages), the
// weights streamed through warp_smem (Int4Stream<kRowTiles>::kWarpBytes).
template <int kRowTiles, int kTiles>
__device__ __forceinline__ void int4_stream_dot(const StreamRows& m, char* warp_smem, int step_begin, int step_end,
                                                const bf16* const (&x_rows)[kTiles], int tiles, int lane,
                                                float (&acc)[kTiles][kRowTiles][4]) {
  constexpr int kStageBytes = Int4Stream<kRowTiles>::kStageBytes;
  const int stages = (step_end - step_begin) / kStreamSteps;
#pragma unroll
  for (int t = 0; t < kStreamStages - 1; ++t) {
    if (t < stages) issue_int4_stage<kRowTiles>(m, step_begin + t * kStreamSteps, warp_smem + t * kStageBytes, lane);
    cp_async_commit();
  }
  for (int t = 0; t < stages; ++t) {
    InputFragment<QuantKind::int4> pre[kStreamSteps][kTiles];
    load_stage_inputs<kTiles>(x_rows, tiles, step_begin + t * kStreamSteps, lane & 3, pre);
    stream_wait<kStreamStages - 2>();  // this lane's copies of stage t have landed
    __syncwarp();                      // every lane's; and stage t - 1 is no longer read
    const int next = t + kStreamStages - 1;
    if (next < stages)
      issue_int4_stage<kRowTiles>(m, step_begin + next * kStreamSteps, warp_smem + (next % kStreamStages) * kStageBytes,
                                  lane);
    cp_async_commit();
    int4_stage_dot<kRowTiles, kTiles>(warp_smem + (t % kStreamStages) * kStageBytes, m.scale_shift,
                                      step_begin + t * kStreamSteps, x_rows, pre, tiles, lane, acc);
  }
  stream_wait<0>();
}

}  // namespace moeserve::cuda
