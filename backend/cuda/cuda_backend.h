// The CUDA backend: bf16 activations and weights, fp32 accumulation; every op of ops/ops.h
// as a kernel (backend/cuda/*.cu) or a cuBLAS call; one stream per backend object.
#pragma once

#include <memory>

#include "ops/ops.h"

typedef struct CUstream_st* cudaStream_t;

namespace moeserve::cuda {

// Number of visible CUDA devices (0 when there is no driver or no GPU).
int device_count();

class CudaBackend;
std::unique_ptr<ops::Backend> make_cuda_backend(int device);
// The stream a CUDA backend runs on (for NCCL and graph capture).
cudaStream_t stream_of(ops::Backend& backend);

}  // namespace moeserve::cuda
