// A CUDA extension of a Communicator: the all-reduce of a branch fused with the residual add
// and RMSNorm that follow it (GPUs with peer access: one kernel instead of three). Not part
// of Communicator, which knows collectives only; a caller asks for it with
// fused_all_reduce_norm() and falls back to all_reduce_sum and the backend's add_rms_norm.
#pragma once

#include <cstdint>

#include "comm/communicator.h"

namespace moeserve::comm {

// The residual add and RMSNorm that follow the all-reduce of a [rows, dim] fp32 branch
// (ops::AddRmsNormParams): hidden = bf16(hidden + bf16(branch)), normed = weight * norm(hidden).
struct ResidualNorm {
  void* hidden;        // [rows, dim] bf16, updated in place
  const void* weight;  // [dim] bf16
  void* normed;        // [rows, dim] bf16
  int64_t rows = 0, dim = 0;
  float eps = 0;
};

class FusedAllReduceNorm {
 public:
  virtual ~FusedAllReduceNorm() = default;
  // The communicator's all_reduce_sum of a fp32 [norm.rows, norm.dim] branch (written back to
  // `branch`) fused with `norm`, where the fused kernel fits the shape; false, doing nothing,
  // where it does not. Counted as the all-reduce in the communicator's stats.
  virtual bool all_reduce_add_rms_norm(float* branch, const ResidualNorm& norm) = 0;
  // False while the communicator has no fused path at all (e.g. no peer all-reduce group).
  virtual bool fused_all_reduce_norm_available() const = 0;
};

// `comm`'s fused path, or nullptr when it has none (CPU and in-process communicators, NCCL
// without peer access).
FusedAllReduceNorm* fused_all_reduce_norm(Communicator& comm);

}  // namespace moeserve::comm
