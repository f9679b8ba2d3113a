#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include "core/error.h"

namespace moeserve {

TEST(DType, ParsesSafetensorsNames) {
  DType d;
  ASSERT_TRUE(parse_dtype("BF16", &d));
  EXPECT_EQ(d, DType::BF16);
  ASSERT_TRUE(parse_dtype("F8_E4M3", &d));
  EXPECT_EQ(dtype_size(d), 1u);
  EXPECT_FALSE(parse_dtype("bfloat16", &d));
  EXPECT_EQ(dtype_name(DType::I32), "I32");
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, Fp16RoundTripsIncludingSubnormals) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /*min normal*/,
                  5.960464477539063e-08f /*min subnormal*/, -3.0517578125e-05f /*subnormal*/}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  }
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);   // overflow to +inf
  EXPECT_EQ(f32_to_f16(1e-9f), 0x0000);  // underflow to +0
  // Halfway between the two smallest subnormals rounds to even (the smaller).
  EXPECT_EQ(f32_to_f16(1.5f * 5.960464477539063e-08f), 0x0002);
  EXPECT_EQ(f32_to_f16(0.5f * 5.960464477539063e-08f), 0x0000);
}

TEST(DType, ConvertRejectsNonFloatTypes) {
  int32_t x = 1;
  float y;
  EXPECT_THROW(convert_to_f32(DType::I32, &x, &y, 1), Error);
}

// Every e4m3fn byte against its definition, (-1)^s 2^(e-7) (1 + m/8) (subnormal: 2^-6 m/8),
// written with std::ldexp; S.1111.111 is NaN and there is no infinity.
TEST(DType, Fp8E4m3DecodesEveryByteAsDefined) {
  for (int byte = 0; byte < 256; ++byte) {
    const int e = (byte >> 3) & 15, m = byte & 7;
    const float got = f8_e4m3_to_f32(static_cast<uint8_t>(byte));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << byte;
      continue;
    }
    const float magnitude = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(8.0f + m, e - 10);
    EXPECT_EQ(got, (byte & 0x80) ? -magnitude : magnitude) << byte;
    EXPECT_EQ(std::signbit(got), (byte & 0x80) != 0) << byte;
  }
  EXPECT_EQ(f8_e4m3_to_f32(0x7e), 448.0f);                // the largest finite value
  EXPECT_EQ(f8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(f8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(f8_e4m3_to_f32(0xb8), -1.0f);
}

// The encoder against torch's rounding (clamp to +-448, then cast to float8_e4m3fn) of every
// e4m3 value, every midpoint between neighbours and the floats either side of it, the
// saturating and subnormal ranges and random floats: tests/data/e4m3_rounding.txt, which
// tests/python/test_e4m3_rounding_table.py checks against torch itself.
TEST(DType, Fp8E4m3EncodesAsTorchWithSaturation) {
  std::ifstream table("tests/data/e4m3_rounding.txt");
  ASSERT_TRUE(table) << "tests/data/e4m3_rounding.txt not found (run from the repository root)";
  std::string bits_hex, code_hex;
  int64_t lines = 0;
  while (table >> bits_hex >> code_hex) {
    const uint32_t bits = static_cast<uint32_t>(std::stoul(bits_hex, nullptr, 16));
    const auto code = static_cast<uint8_t>(std::stoul(code_hex, nullptr, 16));
    float f;
    std::memcpy(&f, &bits, sizeof f);
    ASSERT_EQ(f32_to_f8_e4m3(f), code) << "f32 bits " << bits_hex << " (" << f << ")";
    ++lines;
  }
  EXPECT_GT(lines, 9000);
}

// Decoding then encoding gives every byte back (the NaNs as a NaN: the decoder drops their sign).
TEST(DType, Fp8E4m3RoundTripsEveryByte) {
  for (int byte = 0; byte < 256; ++byte) {
    const uint8_t back = f32_to_f8_e4m3(f8_e4m3_to_f32(static_cast<uint8_t>(byte)));
    if ((byte & 0x7f) == 0x7f)
      EXPECT_EQ(back & 0x7f, 0x7f) << byte;
    else
      EXPECT_EQ(back, byte) << byte;
  }
}

}  // namespace moeserve
