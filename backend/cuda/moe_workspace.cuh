// The grouped experts' workspace (moe.cu sorts the pairs into it; the bf16 and the quantized
// expert kernels, moe.cu and quant_moe.cu, read it): device-visible arrays carved from one
// buffer of moe_workspace_bytes().
#pragma once

#include "backend/cuda/kernels.h"
#include "cuda_common/common.cuh"

namespace moeserve::cuda {

struct MoeWorkspace {
  int32_t* active;        // [local_experts]: the local experts with rows, then unused entries
  int32_t* num_active;    // [1]
  int32_t* counts;        // [local_experts]
  int32_t* offsets;       // [local_experts + 1]
  int32_t* pair_of_slot;  // [pairs]: t * top_k + k of the pair at each sorted position
  int32_t* slot_of_pair;  // [pairs]: sorted position of pair (t, k), or -1 when not local
  bf16* act;              // [pairs, inter]
  float* partial;         // [pairs, hidden]
  bf16* x_sorted;         // [pairs, hidden]   (GEMM path) input rows in expert order
  bf16* gate_up;          // [pairs, 2 * inter] (GEMM path)
};

inline int64_t align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

inline MoeWorkspace carve(void* base, int64_t pairs, int64_t local_experts, int64_t hidden, int64_t inter) {
  auto* p = static_cast<char*>(base);
  MoeWorkspace w;
  w.active = reinterpret_cast<int32_t*>(p);
  p += align256(4 * local_experts);
  w.num_active = reinterpret_cast<int32_t*>(p);
  p += align256(4);
  w.counts = reinterpret_cast<int32_t*>(p);
  p += align256(4 * local_experts);
  w.offsets = reinterpret_cast<int32_t*>(p);
  p += align256(4 * (local_experts + 1));
  w.pair_of_slot = reinterpret_cast<int32_t*>(p);
  p += align256(4 * pairs);
  w.slot_of_pair = reinterpret_cast<int32_t*>(p);
  p += align256(4 * pairs);
  w.act = reinterpret_cast<bf16*>(p);
  p += align256(2 * pairs * inter);
  w.partial = reinterpret_cast<float*>(p);
  p += align256(4 * pairs * hidden);
  w.x_sorted = reinterpret_cast<bf16*>(p);
  p += align256(2 * pairs * hidden);
  w.gate_up = reinterpret_cast<bf16*>(p);
  return w;
}

// The workspace's arrays for this call.
inline MoeWorkspace carve(const MoeExpertsLaunch& m) {
  return carve(m.workspace, m.pairs, m.local_experts, m.op.hidden, m.op.inter);
}

}  // namespace moeserve::cuda
