#include "tokenizer/base64.h"

#include <gtest/gtest.h>

#include <random>

namespace moeserve::tokenizer {
namespace {

TEST(Base64, RoundTripsEveryLength) {
  std::mt19937 rng(7);
  for (size_t n = 0; n < 64; ++n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
    const auto decoded = base64_decode(base64_encode(bytes));
    ASSERT_TRUE(decoded.has_value()) << n;
    EXPECT_EQ(*decoded, bytes);
  }
  EXPECT_EQ(base64_encode("a"), "YQ==");
  EXPECT_EQ(base64_decode("IUA="), std::optional<std::string>("!@"));
}

TEST(Base64, RejectsMalformedText) {
  EXPECT_FALSE(base64_decode("YQ="));                   // length not a multiple of 4
  EXPECT_FALSE(base64_decode("Y*==").has_value());      // character outside the alphabet
  EXPECT_FALSE(base64_decode("Y=Q=").has_value());      // padding in the middle
  EXPECT_FALSE(base64_decode("YQ==YQ==").has_value());  // padding before the end
  EXPECT_FALSE(base64_decode("YR==").has_value());      // non-canonical: padding bits set
  EXPECT_FALSE(base64_decode("====").has_value());
}

}  // namespace
}  // namespace moeserve::tokenizer
