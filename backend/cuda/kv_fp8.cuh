// The fp8 (e4m3fn) latent cache on the GPU: a row of width codes, one byte each; an element's
// value is its code times the cache's per-tensor scale (ops::KvWriteParams::fp8).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace moeserve::cuda {

// Four e4m3fn codes (the bytes of `codes`, lowest first) as two bf16 pairs, exactly: each
// byte's sign, exponent and mantissa are moved to their bf16 places, which reads the code as
// its value times 2^-120 (a bf16 subnormal for the e4m3 subnormals), and one bf16x2 multiply
// by 2^120 (exact: a power of two, no overflow) gives the value. NaN codes are never written
// (the writer saturates).
__device__ __forceinline__ void e4m3x4_to_bf16x4(uint32_t codes, uint32_t& lo_pair, uint32_t& hi_pair) {
  const __nv_bfloat162 two_120 = __floats2bfloat162_rn(0x1p120f, 0x1p120f);
  auto widen = [&](uint32_t spread) {  // bytes at bits 0 and 16
    const uint32_t bits = ((spread & 0x00800080u) << 8) | ((spread & 0x007f007fu) << 4);
    __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&bits);
    v = __hmul2(v, two_120);
    return *reinterpret_cast<const uint32_t*>(&v);
  };
  lo_pair = widen(__byte_perm(codes, 0, 0x4140));
  hi_pair = widen(__byte_perm(codes, 0, 0x4342));
}

}  // namespace moeserve::cuda
