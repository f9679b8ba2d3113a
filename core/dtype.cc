#include "core/dtype.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace moeserve {

namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "F32", 4},         {DType::F16, "F16", 2},         {DType::BF16, "BF16", 2}, {DType::F64, "F64", 8},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1}, {DType::I64, "I64", 8},   {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},         {DType::I8, "I8", 1},           {DType::U8, "U8", 1},     {DType::Bool, "BOOL", 1},
};
const DTypeInfo& info(DType dtype) {
  for (const auto& entry : kDTypes)
    if (entry.dtype == dtype) return entry;
  fail("internal error: unknown dtype {}", static_cast<int>(dtype));
}
}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }

bool parse_dtype(std::string_view name, DType* out) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) {
      *out = entry.dtype;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float f8_e4m3_to_f32(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exponent = (bits >> 3) & 0xfu, mantissa = bits & 0x7u;
  float f;
  if (exponent == 0xfu && mantissa == 0x7u) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) {  // subnormal: mantissa * 2^-9
    f = static_cast<float>(mantissa) * 0x1p-9f;
    return sign ? -f : f;
  }
  const uint32_t u = sign | ((exponent + 127 - 7) << 23) | (mantissa << 20);
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint8_t f32_to_f8_e4m3(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;   // NaN
  if (abs >= 0x43e00000u) return sign | 0x7eu;  // >= 448 (with infinity): the largest finite
  if (abs < 0x3c800000u) {                      // below 2^-6: subnormal or zero, units of 2^-9
    // abs * 2^9 rounded to an integer, nearest even (exact in fp32: no double rounding).
    float magnitude;
    std::memcpy(&magnitude, &abs, sizeof magnitude);
    return sign | static_cast<uint8_t>(std::nearbyint(magnitude * 0x1p9f));  // 8 (2^-6) is the smallest normal
  }
  // Normal: keep 3 of the 23 fraction bits, round the other 20 to nearest even; a carry into
  // the exponent is the correct next binade (448 stays the largest: 464 and up saturated above).
  const uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  return sign | static_cast<uint8_t>(((rounded >> 20) - ((127 - 7) << 3)) & 0x7fu);
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow to inf
  if (abs < 0x38800000u) {                        // half subnormal or zero: units of 2^-24
    if (abs < 0x33000000u) return sign;
    const uint32_t shift = 126 - (abs >> 23);  // 14..24
    const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
    uint32_t result = significand >> shift;
    const uint32_t remainder = significand & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

void convert_to_f32(DType dtype, const void* src, float* dst, size_t count) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::BF16: {
      const auto* p = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::F16: {
      const auto* p = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    case DType::F64: {
      const auto* p = static_cast<const double*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(p[i]);
      return;
    }
    default:
      fail("cannot convert dtype {} to F32", dtype_name(dtype));
  }
}

}  // namespace moeserve
