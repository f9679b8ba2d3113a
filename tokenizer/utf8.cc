#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

constexpr uint32_t kReplacement = 0xFFFD;

// Allowed range of the second byte for each lead byte (Unicode Table 3-7); the remaining
// continuation bytes are always 0x80..0xBF.
struct LeadInfo {
  int length;  // 0: the byte cannot start a sequence
  uint8_t second_lo, second_hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

Utf8Step utf8_step(std::string_view bytes, size_t pos) {
  const auto b0 = static_cast<uint8_t>(bytes[pos]);
  const LeadInfo info = lead_info(b0);
  if (info.length == 1) return {Utf8Step::Kind::kValid, 1, b0};
  if (info.length == 0) return {Utf8Step::Kind::kInvalid, 1, 0};
  uint32_t cp = b0 & (0x7F >> info.length);
  for (int i = 1; i < info.length; ++i) {
    if (pos + i >= bytes.size()) return {Utf8Step::Kind::kTruncated, static_cast<size_t>(i), 0};
    const auto b = static_cast<uint8_t>(bytes[pos + i]);
    const uint8_t lo = i == 1 ? info.second_lo : 0x80;
    const uint8_t hi = i == 1 ? info.second_hi : 0xBF;
    if (b < lo || b > hi) return {Utf8Step::Kind::kInvalid, static_cast<size_t>(i), 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Step::Kind::kValid, static_cast<size_t>(info.length), cp};
}

size_t first_invalid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    // ASCII fast path.
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Step step = utf8_step(bytes, pos);
    if (step.kind != Utf8Step::Kind::kValid) return pos;
    pos += step.length;
  }
  return std::string_view::npos;
}

void append_codepoint(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

void append_utf8_lossy(std::string_view bytes, std::string& out) {
  size_t pos = 0;
  size_t run_start = 0;  // start of the pending run of valid bytes, copied in one go
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Step step = utf8_step(bytes, pos);
    if (step.kind == Utf8Step::Kind::kValid) {
      pos += step.length;
      continue;
    }
    out.append(bytes.substr(run_start, pos - run_start));
    append_codepoint(kReplacement, out);
    pos += step.length;
    run_start = pos;
  }
  out.append(bytes.substr(run_start));
}

size_t completable_utf8_tail(std::string_view bytes) {
  // A truncated sequence is at most 3 bytes long, so only the last 3 bytes can start one.
  const size_t first = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t pos = first; pos < bytes.size(); ++pos) {
    if (lead_info(static_cast<uint8_t>(bytes[pos])).length < 2) continue;
    const Utf8Step step = utf8_step(bytes, pos);
    if (step.kind == Utf8Step::Kind::kTruncated && pos + step.length == bytes.size()) {
      return step.length;
    }
  }
  return 0;
}

}  // namespace moeserve::tokenizer
