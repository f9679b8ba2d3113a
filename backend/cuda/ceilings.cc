#include "backend/cuda/ceilings.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace moeserve::cuda {

namespace {

struct DeviceMemory {
  void* ptr = nullptr;
  explicit DeviceMemory(size_t bytes) {
    MS_CHECK(cudaMalloc(&ptr, bytes) == cudaSuccess, "ceilings: cudaMalloc of {} bytes failed", bytes);
  }
  ~DeviceMemory() { cudaFree(ptr); }
};

// Best of `repeats` timings of `iterations` calls of fn (milliseconds per call).
template <typename Fn>
double time_ms(cudaStream_t stream, int repeats, int iterations, Fn&& fn) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  fn();  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    cudaEventRecord(start, stream);
    for (int i = 0; i < iterations; ++i) fn();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best = std::min(best, static_cast<double>(ms) / iterations);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

}  // namespace

Ceilings measure_ceilings(int device) {
  MS_CHECK(cudaSetDevice(device) == cudaSuccess, "ceilings: cannot select CUDA device {}", device);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  Ceilings c;
  {
    const size_t bytes = size_t{2} << 30;  // 2 GiB each way: far beyond the 50 MB L2
    DeviceMemory a(bytes), b(bytes);
    cudaMemsetAsync(a.ptr, 1, bytes, stream);
    const double ms =
        time_ms(stream, 5, 3, [&] { cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, stream); });
    c.copy_gbs = 2.0 * bytes / (ms * 1e-3) / 1e9;
  }
  {
    const int n = 8192;
    DeviceMemory a(size_t{2} * n * n), b(size_t{2} * n * n), d(size_t{2} * n * n);
    for (auto [matrix, seed] : {std::pair{a.ptr, uint64_t{1}}, std::pair{b.ptr, uint64_t{2}}}) {
      launch_fill_uniform({.out = matrix,
                           .rows = n,
                           .cols = n,
                           .full_cols = n,
                           .row0 = 0,
                           .col0 = 0,
                           .seed = seed,
                           .offset = 0.0f,
                           .amplitude = 1.0f},
                          stream);
    }
    cublasHandle_t handle;
    cublasCreate(&handle);
    cublasSetStream(handle, stream);
    const float alpha = 1.0f, beta = 0.0f;
    const double ms = time_ms(stream, 3, 5, [&] {
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.ptr, CUDA_R_16BF, n, b.ptr, CUDA_R_16BF, n,
                   &beta, d.ptr, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    c.bf16_tflops = 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3) / 1e12;
    cublasDestroy(handle);
  }
  cudaStreamDestroy(stream);
  return c;
}

}  // namespace moeserve::cuda
