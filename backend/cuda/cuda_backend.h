// The CUDA backend: bf16 activations and weights, fp32 accumulation; every op of ops/ops.h
// as a kernel (backend/cuda/*.cu) or a cuBLAS call; one stream per backend object.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/cuda/kernel_policy.h"
#include "ops/ops.h"

typedef struct CUstream_st* cudaStream_t;

namespace moeserve::cuda {

// Number of visible CUDA devices (0 when there is no driver or no GPU).
int device_count();

// Device memory as the driver reports it now (cudaMemGetInfo on `device`).
struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
DeviceMemory device_memory(int device);

struct CudaBackendOptions {
  // Every row's result independent of the batch it runs in (its size, its other rows, how it
  // is split into micro-batches or prefill chunks): projections take one kernel per shape
  // whatever the batch (tensor cores for wide ones, else streamed in groups of 4 rows; no
  // cuBLAS), the experts always take one kernel pair, the router one
  // selection kernel, and attention splits each token's context by its own length. Costs
  // speed at large batches; `--batch-invariant`.
  bool batch_invariant = false;
};

// The policy a backend built with `options` runs with (printed once on stderr at start-up).
KernelPolicy kernel_policy(const CudaBackendOptions& options);

class CudaBackend;
std::unique_ptr<ops::Backend> make_cuda_backend(int device, const CudaBackendOptions& options = {});
// With an explicit policy: the tests reach the kernel paths the serving policy does not take.
std::unique_ptr<ops::Backend> make_cuda_backend_with_policy(int device, const KernelPolicy& policy);
// The stream a CUDA backend runs on (for NCCL and graph capture).
cudaStream_t stream_of(ops::Backend& backend);

}  // namespace moeserve::cuda
