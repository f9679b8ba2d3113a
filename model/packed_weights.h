// Quantized weights as ops/quant_layout.h packs them, read from a checkpoint slice by slice:
//   int4 (compressed-tensors pack-quantized): <m>.weight_packed int32 [N, K/8],
//        <m>.weight_scale bf16 [N, K/group], <m>.weight_shape int [2] = [N, K]
//   fp8 (DeepSeek block FP8): <m>.weight F8_E4M3 [N, K], <m>.weight_scale_inv fp32
//        [ceil(N/bn), ceil(K/bk)]
// Every tensor's dtype and shape is checked against the config's [N, K], naming the tensor.
// The checkpoint stores no padding; the loader places values and scales in one buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"
#include "ops/quant_layout.h"
#include "parallel/plan.h"

namespace moeserve {

// One quantized slice: rows x cols of a weight, packed.
struct PackedWeight {
  int64_t rows = 0, cols = 0;
  std::vector<std::byte> values;  // int4: int32 [rows, cols/8]; fp8: e4m3 [rows, cols]
  std::vector<std::byte> scales;  // int4: bf16 [rows, cols/group]; fp8: fp32 [ceil(rows/bn), ceil(cols/bk)]
};

// Which slice of which weight: rows x cols of linear `module` (a tensor name without
// ".weight") whose full shape is [n, k].
struct PackedSlice {
  const std::string& module;
  int64_t n, k;
  parallel::Range rows, cols;
  const ops::QuantLayout& layout;
};

// Throws, naming the tensor, unless the slice starts and ends on the layout's group (int4: K)
// or block (fp8: N and K) boundaries, or at the end of the tensor: a plan whose split cuts a
// group cannot load the weight. `rank` names the rank in the message.
void check_packed_slice(const PackedSlice& s, int rank);

// The slice read from `checkpoint`, checking every tensor of the weight.
PackedWeight read_packed(const Checkpoint& checkpoint, const PackedSlice& s);

// The slice's weights as fp32 [rows, cols], exactly as the format defines them
// ((nibble - 8) * scale; e4m3 * scale_inv): for the few weights an op reads unquantized.
Tensor dequantize(const PackedWeight& w, const ops::QuantLayout& layout);

}  // namespace moeserve
