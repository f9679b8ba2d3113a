// Shared-memory staging for the tensor-core attention kernels (sm_80 and later): asynchronous
// 16-byte copies from global memory (cp.async) and warp-wide fragment loads (ldmatrix).
#pragma once

#include <cstdint>

namespace moeserve::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(void* shared, const void* global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(shared)), "l"(global));
#endif
}

// The same copy, or 16 zero bytes when !valid (global is not read then, but must be mapped).
__device__ __forceinline__ void cp_async_16_or_zero(void* shared, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;");
#endif
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
#endif
}

// ldmatrix.x4: four 8 x 8 bf16 matrices; lanes 8 m .. 8 m + 7 give the row addresses of matrix
// m (16 bytes each) and r[m] is this lane's pair of it in the MMA fragment layout (row lane / 4,
// columns 2 (lane % 4) + {0, 1}; mma.cuh). The .trans form hands out the transposed pair (rows
// 2 (lane % 4) + {0, 1}, column lane / 4): a B operand from a row-major [k][n] tile.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* shared_row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared_row)));
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* shared_row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared_row)));
#endif
}

}  // namespace moeserve::cuda
