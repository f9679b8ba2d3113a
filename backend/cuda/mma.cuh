// Warp-level tensor-core helpers (mma.sync, sm_80 and later), shared by the attention and
// grouped-expert kernels.
#pragma once

#include "cuda_common/common.cuh"

namespace moeserve::cuda {

__device__ __forceinline__ uint32_t pack_bf16x2(bf16 lo, bf16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}

// d += a b: a [16 x 16] bf16 row-major fragment, b [16 x 8] bf16 column-major, d fp32.
// Fragment layouts (PTX m16n8k16): lane = 4 * group + quad; a[0] holds row group, columns
// 2 quad + {0, 1}; a[1] row group + 8, same columns; a[2] and a[3] the same rows, columns + 8;
// b0 rows 2 quad + {0, 1} of column group, b1 rows + 8; d rows group (d0, d1) and group + 8
// (d2, d3), columns 2 quad + {0, 1}.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

}  // namespace moeserve::cuda
