// Random packed quantized weights for the backend tests, with their fp32 values computed here
// from the format definitions (independently of the backends' dequantizers): int4 nibbles are
// read byte by byte, e4m3 values through std::ldexp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"
#include "core/random.h"
#include "ops/quant_layout.h"

namespace moeserve::test {

struct QuantWeight {
  int64_t n = 0, k = 0;
  ops::QuantLayout layout;
  std::vector<uint8_t> packed;  // quant_buffer_bytes(n, k): values, padding, scales
  std::vector<float> values;    // [n, k] the exact fp32 weight the format defines
};

// e4m3fn by its definition: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 m/8, S.1111.111 NaN.
inline float e4m3_by_definition(uint8_t byte) {
  const int e = (byte >> 3) & 15, m = byte & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (byte & 0x80) ? -magnitude : magnitude;
}

inline ops::QuantLayout int4_layout(int64_t group) { return {ops::WeightQuant::int4_group, group, 0, 0}; }
inline ops::QuantLayout fp8_layout(int64_t block_n = 128, int64_t block_k = 128) {
  return {ops::WeightQuant::fp8_block, 0, block_n, block_k};
}

// Scales around `scale` (int4: bf16 values; fp8: fp32 values that make the product round).
inline QuantWeight make_quant_weight(int64_t n, int64_t k, const ops::QuantLayout& layout, uint64_t seed,
                                     float scale = 0.02f) {
  if (layout.quant == ops::WeightQuant::int4_group && k % layout.group_size != 0)
    throw std::invalid_argument("make_quant_weight: k is not a multiple of the int4 group");
  QuantWeight w{n, k, layout, std::vector<uint8_t>(static_cast<size_t>(ops::quant_buffer_bytes(n, k, layout))),
                std::vector<float>(static_cast<size_t>(n * k))};
  uint8_t* values = w.packed.data();
  uint8_t* scales = values + ops::quant_scales_offset(n, k, layout);
  const int64_t scale_count = ops::quant_scale_count(n, k, layout);
  if (layout.quant == ops::WeightQuant::int4_group) {
    for (int64_t i = 0; i < n * k / 2; ++i) values[i] = static_cast<uint8_t>(random_word(seed, i));
    std::vector<float> s(static_cast<size_t>(scale_count));
    for (int64_t i = 0; i < scale_count; ++i) {
      const uint16_t bits = f32_to_bf16(scale * (0.5f + uniform01(seed + 1, i)));
      std::memcpy(scales + 2 * i, &bits, 2);
      s[i] = bf16_to_f32(bits);
    }
    // Little-endian words: element c of a row is in byte c / 2, low nibble for even c.
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t byte = values[(r * k + c) / 2];
        const int q = ((c % 2) ? byte >> 4 : byte & 15) - 8;
        w.values[r * k + c] = static_cast<float>(q) * s[r * (k / layout.group_size) + c / layout.group_size];
      }
    return w;
  }
  const int64_t block_cols = (k + layout.block_k - 1) / layout.block_k;
  std::vector<float> s(static_cast<size_t>(scale_count));
  for (int64_t i = 0; i < scale_count; ++i) {
    s[i] = scale * (0.5f + uniform01(seed + 1, i)) / 64.0f;  // |e4m3| <= 448
    std::memcpy(scales + 4 * i, &s[i], 4);
  }
  for (int64_t i = 0; i < n * k; ++i) {
    uint8_t byte = static_cast<uint8_t>(random_word(seed, i));
    if ((byte & 0x7f) == 0x7f) byte = 0;  // no NaN
    values[i] = byte;
    const int64_t r = i / k, c = i % k;
    w.values[i] = e4m3_by_definition(byte) * s[(r / layout.block_n) * block_cols + c / layout.block_k];
  }
  return w;
}

}  // namespace moeserve::test
