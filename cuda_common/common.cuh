// Helpers shared by the CUDA kernels (backend/cuda and comm).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace moeserve::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ bf16 to_bf(float v) { return __float2bfloat16_rn(v); }

template <typename T>  // float, double
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block (warps added in warp order); every thread gets the result. `scratch`
// holds >= 32 values.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  T total = 0;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

// Rows of 16-byte chunks (8 bf16) can be loaded with uint4 when every pointer is 16-byte
// aligned (nullptr: not used).
inline bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// Programmatic dependent launch (sm_90 and later). Every kernel here is launched with
// launch_pdl and begins with pdl_enter(): it may be scheduled while its predecessor in the
// stream is still running, waits there until the predecessor has completed and its memory is
// visible (griddepcontrol.wait), then lets its own successor be scheduled. A decode step is
// ~150 short kernels on one stream; this hides most of the launch gap between consecutive
// ones (captured graphs keep the programmatic edges). Kernels of cuBLAS and NCCL are ordinary
// stream dependencies. Nothing is read before the wait, so the overlap is launch latency only.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Weights do not depend on the previous kernel, so a kernel may ask L2 for the first bytes
// of the weights it will stream before pdl_enter(): the fetch overlaps the predecessor's
// tail instead of starting after it (decode at small batch is a chain of short kernels whose
// boundaries are the idle time). The warp's lanes cover [p, p + bytes) in 128-byte lines.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ void warp_prefetch_l2(const void* p, int64_t bytes) {
  const char* base = static_cast<const char*>(p);
  for (int64_t offset = static_cast<int64_t>(threadIdx.x & 31) * 128; offset < bytes; offset += 32 * 128)
    prefetch_l2(base + offset);
}

template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("kernel launch failed: ") + cudaGetErrorString(status));
}

}  // namespace moeserve::cuda
