// The CPU reference's reading of packed quantized weights (ops/quant_layout.h): each weight
// becomes the exact fp32 value the format defines (int4: (nibble - 8) * bf16 scale; fp8:
// e4m3 value * fp32 block scale, one rounding), so that a quantized op is the unquantized op
// on the dequantized fp32 weight, bit for bit.
#pragma once

#include <cstdint>
#include <string_view>

#include "ops/quant_layout.h"

namespace moeserve::cpu {

// Checks that an [n, k] weight can be packed as `layout` says; the error names `what` (the
// op and operand, e.g. "linear weight") and the offending field.
void check_quant_shape(std::string_view what, int64_t n, int64_t k, const ops::QuantLayout& layout);

// Rows [row0, row0 + rows) of the packed [n, k] weight as fp32: out [rows, k].
struct DequantRowsParams {
  const void* weight;  // the packed buffer: values, then scales at quant_scales_offset(n, k)
  int64_t n, k;
  ops::QuantLayout layout;
  int64_t row0, rows;
  float* out;  // [rows, k]
};
void dequantize_rows(const DequantRowsParams& p);

}  // namespace moeserve::cpu
