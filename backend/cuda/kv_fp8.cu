// kv_write into an fp8 (e4m3fn) latent cache: entry / scale, rounded to nearest even and
// saturated to +-448 (cvt.rn.satfinite, the rounding of core/dtype.h f32_to_f8_e4m3).
#include <cuda_fp8.h>

#include <stdexcept>
#include <string>

#include "backend/cuda/mla_decode.h"
#include "cuda_common/common.cuh"

namespace moeserve::cuda {

namespace {

// One block per token; each thread encodes pairs of elements (width is even).
__global__ void kv_write_fp8_kernel(const bf16* entries, const int32_t* slots, uint8_t* cache, int64_t width,
                                    float scale) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const bf16* entry = entries + t * width;
  uint8_t* row = cache + static_cast<int64_t>(slots[t]) * width;
  for (int64_t i = 2 * threadIdx.x; i < width; i += 2 * blockDim.x) {
    const float2 x = make_float2(__fdiv_rn(to_f(entry[i]), scale), __fdiv_rn(to_f(entry[i + 1]), scale));
    const __nv_fp8x2_storage_t codes = __nv_cvt_float2_to_fp8x2(x, __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<__nv_fp8x2_storage_t*>(row + i) = codes;
  }
}

}  // namespace

void launch_kv_write_fp8(const ops::KvWriteParams& p, cudaStream_t stream) {
  if (p.width % 2 != 0)
    throw std::invalid_argument("kv_write: an fp8 cache needs an even row width (got " + std::to_string(p.width) + ")");
  if (p.tokens == 0) return;
  launch_pdl(kv_write_fp8_kernel, static_cast<unsigned>(p.tokens), 128, 0, stream, static_cast<const bf16*>(p.entries),
             p.slots, static_cast<uint8_t*>(p.cache), p.width, p.fp8_scale);
}

}  // namespace moeserve::cuda
