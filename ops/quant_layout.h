// How a quantized weight lies in backend memory. Quantized weights stay packed as the
// checkpoint stores them (never expanded to the activation dtype), values then scales in one
// buffer, so that a weight is still one pointer (the experts' pointer tables are unchanged):
//
//   int4_group  values: int32 [N, K/8]; element k of row n is bits 4*(k%8) .. 4*(k%8)+3 of word
//                 (n, k/8), stored as q + 8 (q in [-8, 7]: compressed-tensors pack-quantized,
//                 symmetric, "uint4b8")
//               scales: bf16 [N, K/group]
//               w[n, k] = (nibble - 8) * scale[n, k / group]
//   fp8_block   values: e4m3 [N, K] (one byte each)
//               scales: fp32 [ceil(N/block_n), ceil(K/block_k)] (DeepSeek's weight_scale_inv)
//               w[n, k] = fp8[n, k] * scale[n / block_n, k / block_k]
//
// The scales start at quant_scales_offset(): the values' bytes rounded up to 256, so both
// parts are aligned for vector loads. The products are exact in fp32 (int4: a 4-bit integer
// times a bf16; fp8: a 4-bit mantissa times an fp32 scale rounds once), and backends
// accumulate in fp32.
#pragma once

#include <cstdint>

namespace moeserve::ops {

enum class WeightQuant : uint8_t { none, int4_group, fp8_block };

struct QuantLayout {
  WeightQuant quant = WeightQuant::none;
  int64_t group_size = 0;  // int4_group: K elements per scale (32, 64 or 128)
  int64_t block_n = 0;     // fp8_block: rows per scale block
  int64_t block_k = 0;     // fp8_block: columns per scale block
  bool quantized() const { return quant != WeightQuant::none; }
  // Spelled out: the CUDA translation units compile this header as C++17 (no defaulted ==).
  bool operator==(const QuantLayout& o) const {
    return quant == o.quant && group_size == o.group_size && block_n == o.block_n && block_k == o.block_k;
  }
  bool operator!=(const QuantLayout& o) const { return !(*this == o); }
};

inline constexpr int64_t kQuantScalesAlignment = 256;

// Elements of the scale tensor of an [n, k] weight (0 when not quantized).
inline int64_t quant_scale_count(int64_t n, int64_t k, const QuantLayout& l) {
  switch (l.quant) {
    case WeightQuant::int4_group:
      return n * (k / l.group_size);
    case WeightQuant::fp8_block:
      // Ceil divisions without forming a + b - 1 (no overflow for any block size).
      return (n / l.block_n + (n % l.block_n != 0)) * (k / l.block_k + (k % l.block_k != 0));
    case WeightQuant::none:
      break;
  }
  return 0;
}
inline int64_t quant_scale_bytes(int64_t n, int64_t k, const QuantLayout& l) {
  return quant_scale_count(n, k, l) * (l.quant == WeightQuant::int4_group ? 2 : 4);
}
// Bytes of the packed values of an [n, k] quantized weight.
inline int64_t quant_value_bytes(int64_t n, int64_t k, const QuantLayout& l) {
  return l.quant == WeightQuant::int4_group ? n * k / 2 : n * k;
}
inline int64_t quant_scales_offset(int64_t n, int64_t k, const QuantLayout& l) {
  const int64_t values = quant_value_bytes(n, k, l);
  return (values + kQuantScalesAlignment - 1) / kQuantScalesAlignment * kQuantScalesAlignment;
}
// Bytes of the whole buffer of an [n, k] quantized weight (values, padding, scales).
inline int64_t quant_buffer_bytes(int64_t n, int64_t k, const QuantLayout& l) {
  return quant_scales_offset(n, k, l) + quant_scale_bytes(n, k, l);
}

}  // namespace moeserve::ops
