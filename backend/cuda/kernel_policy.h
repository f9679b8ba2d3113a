// The CUDA backend's kernel choices, made once when the backend is built and passed down to
// the launchers: plain C++17, shared by the backend class and the kernels' translation units.
#pragma once

#include <cstdint>
#include <string>

namespace moeserve::cuda {

struct KernelPolicy {
  // CudaBackendOptions::batch_invariant: every row's arithmetic independent of its batch.
  bool batch_invariant = false;
  // MLA attention on tensor cores where the shape allows (DeepSeek-V3's 512 + 64, 16-byte
  // aligned); otherwise the CUDA-core split kernels (docs/benchmarks.md: tensor cores won).
  bool mla_tensor_cores = true;
  // Grouped experts on tensor cores from one routed row per local expert on average (always
  // in batch-invariant mode); otherwise the CUDA-core streaming kernels at every batch.
  bool moe_tensor_cores = true;
  // Batch-invariant projections with at least this many output features take tensor cores
  // (linear_mma_kernel); narrower ones stream.
  int64_t linear_mma_min_rows = 2048;
  // Ops between side_begin() and side_join() on a second stream; false: one stream.
  bool overlap_streams = true;

  // One line: "batch_invariant=0 mla_tensor_cores=1 ...".
  std::string describe() const;
};

}  // namespace moeserve::cuda
