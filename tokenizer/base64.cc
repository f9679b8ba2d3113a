#include "tokenizer/base64.h"

#include <algorithm>
#include <array>
#include <cstdint>

namespace moeserve::tokenizer {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

const std::array<int8_t, 256>& sextet_of_char() {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  return table;
}

}  // namespace

std::optional<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  const auto& sextet = sextet_of_char();
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last_quad = i + 4 == text.size();
    int padding = 0;
    uint32_t quad = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=') {
        // Padding only at the end of the last quad, at most two characters.
        if (!last_quad || j < 2) return std::nullopt;
        ++padding;
        quad <<= 6;
        continue;
      }
      if (padding > 0) return std::nullopt;
      const int8_t v = sextet[static_cast<uint8_t>(c)];
      if (v < 0) return std::nullopt;
      quad = (quad << 6) | static_cast<uint32_t>(v);
    }
    // Non-canonical encodings carry set bits in the padding positions.
    if ((padding == 1 && (quad & 0xFF) != 0) || (padding == 2 && (quad & 0xFFFF) != 0)) {
      return std::nullopt;
    }
    out += static_cast<char>(quad >> 16);
    if (padding < 2) out += static_cast<char>((quad >> 8) & 0xFF);
    if (padding < 1) out += static_cast<char>(quad & 0xFF);
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t triple = 0;
    for (size_t j = 0; j < 3; ++j) {
      triple = (triple << 8) | (j < n ? static_cast<uint8_t>(bytes[i + j]) : 0u);
    }
    for (size_t j = 0; j < 4; ++j) {
      out += j <= n ? kAlphabet[(triple >> (18 - 6 * j)) & 0x3F] : '=';
    }
  }
  return out;
}

}  // namespace moeserve::tokenizer
