#include "backend/cpu/quant_dequant.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace moeserve::cpu {

using ops::QuantLayout;
using ops::WeightQuant;

void check_quant_shape(std::string_view what, int64_t n, int64_t k, const QuantLayout& l) {
  MS_CHECK(n > 0 && k > 0, "{}: quantized weight shape [{}, {}] is empty", what, n, k);
  switch (l.quant) {
    case WeightQuant::int4_group:
      MS_CHECK(l.group_size > 0 && l.group_size % 8 == 0,
               "{}: int4 group_size {} is not a positive multiple of 8 (eight values per int32)", what, l.group_size);
      MS_CHECK(k % l.group_size == 0, "{}: in_features {} is not a multiple of the int4 group_size {}", what, k,
               l.group_size);
      return;
    case WeightQuant::fp8_block:
      MS_CHECK(l.block_n > 0 && l.block_k > 0, "{}: fp8 block [{}, {}] must be positive", what, l.block_n, l.block_k);
      return;
    case WeightQuant::none:
      break;
  }
  fail("{}: the weight is not quantized", what);
}

namespace {

// w[n, k] = (nibble - 8) * scale[n, k / group]
void int4_rows(const DequantRowsParams& p) {
  const auto* words = static_cast<const uint32_t*>(p.weight);  // [n, k / 8]
  const auto* scales = reinterpret_cast<const uint16_t*>(static_cast<const std::byte*>(p.weight) +
                                                         ops::quant_scales_offset(p.n, p.k, p.layout));
  const int64_t groups = p.k / p.layout.group_size;  // bf16 scales [n, groups]
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t n = p.row0 + r;
    float* out = p.out + r * p.k;
    for (int64_t c = 0; c < p.k; ++c) {
      const uint32_t nibble = (words[n * (p.k / 8) + c / 8] >> (4 * (c % 8))) & 0xfu;
      const float scale = bf16_to_f32(scales[n * groups + c / p.layout.group_size]);
      out[c] = static_cast<float>(static_cast<int32_t>(nibble) - 8) * scale;
    }
  }
}

// w[n, k] = e4m3[n, k] * scale[n / block_n, k / block_k]
void fp8_rows(const DequantRowsParams& p) {
  const auto* values = static_cast<const uint8_t*>(p.weight);  // [n, k]
  const auto* scales = reinterpret_cast<const float*>(static_cast<const std::byte*>(p.weight) +
                                                      ops::quant_scales_offset(p.n, p.k, p.layout));
  const int64_t block_cols = (p.k + p.layout.block_k - 1) / p.layout.block_k;  // fp32 scales [., block_cols]
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t n = p.row0 + r;
    const float* scale_row = scales + (n / p.layout.block_n) * block_cols;
    float* out = p.out + r * p.k;
    for (int64_t c = 0; c < p.k; ++c) out[c] = f8_e4m3_to_f32(values[n * p.k + c]) * scale_row[c / p.layout.block_k];
  }
}

}  // namespace

void dequantize_rows(const DequantRowsParams& p) {
  MS_CHECK(p.row0 >= 0 && p.row0 + p.rows <= p.n, "dequantize_rows: rows [{}, {}) outside a weight of {} rows", p.row0,
           p.row0 + p.rows, p.n);
  if (p.layout.quant == WeightQuant::int4_group) return int4_rows(p);
  if (p.layout.quant == WeightQuant::fp8_block) return fp8_rows(p);
  fail("dequantize_rows: the weight is not quantized");
}

}  // namespace moeserve::cpu
