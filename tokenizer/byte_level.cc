#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

struct ByteLevelTables {
  std::array<uint32_t, 256> char_of_byte{};
  std::array<int16_t, 512> byte_of_char{};  // -1: not in the alphabet; all characters are < 512

  ByteLevelTables() {
    byte_of_char.fill(-1);
    uint32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool shows_itself = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char_of_byte[b] = shows_itself ? static_cast<uint32_t>(b) : next_extra++;
      byte_of_char[char_of_byte[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

uint32_t byte_level_char(uint8_t b) { return tables().char_of_byte[b]; }

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const Utf8Step step = utf8_step(token, pos);
    if (step.kind != Utf8Step::Kind::kValid || step.codepoint >= 512) return std::nullopt;
    const int16_t b = tables().byte_of_char[step.codepoint];
    if (b < 0) return std::nullopt;
    bytes += static_cast<char>(b);
    pos += step.length;
  }
  return bytes;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_codepoint(byte_level_char(static_cast<uint8_t>(c)), out);
  return out;
}

}  // namespace moeserve::tokenizer
