// MLA decode attention on tensor cores with a balanced split of the context over the SMs
// (mla_decode.cu): DeepSeek-V3's latent shape (512 + 64), heads a multiple of 64.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/ops.h"

namespace moeserve::cuda {

bool mla_decode_supported(const ops::MlaAttentionParams& p);
// The partial states of the context pieces (one device's: its SM count sizes the grid).
int64_t mla_decode_workspace_bytes();
// The softmax weights enter P V as a bf16 high part and a bf16 remainder (two MMAs, ~16 bits
// like fp32 weights). Reads a bf16 or an fp8 (p.cache_fp8) cache.
void launch_mla_decode(const ops::MlaAttentionParams& p, void* workspace, cudaStream_t stream);

// kv_write of an fp8 cache (kv_fp8.cu).
void launch_kv_write_fp8(const ops::KvWriteParams& p, cudaStream_t stream);

}  // namespace moeserve::cuda
