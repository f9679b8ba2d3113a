// Element types and their host-side conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace moeserve {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  F64,
  F8_E4M3,
  F8_E5M2,
  I64,
  I32,
  I16,
  I8,
  U8,
  Bool,
};

// Bytes per element.
size_t dtype_size(DType dtype);
// Name as safetensors writes it ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Parses a safetensors dtype string; returns false for an unknown one.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// f rounded to the nearest bf16 value (as a GPU kernel stores it), kept as a float.
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t bits);
// OCP FP8 E4M3 ("e4m3fn", torch.float8_e4m3fn): bias 7, subnormals, no infinity, S.1111.111
// is NaN. Every value is exact in fp32 (and in bf16).
float f8_e4m3_to_f32(uint8_t bits);
// f to e4m3fn, rounding to nearest even and saturating to +-448 (as CUDA's cvt.rn.satfinite
// and torch's clamp-then-cast do); NaN stays NaN (0x7f with the sign).
uint8_t f32_to_f8_e4m3(float f);
uint16_t f32_to_f16(float f);

// Converts `count` elements of `dtype` at `src` to float. Only floating dtypes that the
// forward reads (F32, F16, BF16, F64) are accepted; others throw.
void convert_to_f32(DType dtype, const void* src, float* dst, size_t count);

}  // namespace moeserve
