#include "grammar/utf8_masks.h"

#include "core/error.h"

namespace moeserve::grammar {
namespace {

bool in(uint8_t byte, uint8_t lo, uint8_t hi) { return byte >= lo && byte <= hi; }

// RFC 3629's byte ranges, one byte at a time.
Utf8State at_boundary(uint8_t b) {
  if (b <= 0x7F) return Utf8State::kBoundary;
  if (in(b, 0xC2, 0xDF)) return Utf8State::kTail1;
  if (b == 0xE0) return Utf8State::kE0;
  if (b == 0xED) return Utf8State::kED;
  if (in(b, 0xE1, 0xEF)) return Utf8State::kTail2;
  if (b == 0xF0) return Utf8State::kF0;
  if (in(b, 0xF1, 0xF3)) return Utf8State::kTail3;
  if (b == 0xF4) return Utf8State::kF4;
  return Utf8State::kInvalid;  // 80..C1 and F5..FF never start a character
}

// Inside a character: the range its next byte must fall in, and the state after it.
struct Tail {
  uint8_t lo, hi;
  Utf8State next;
};
constexpr Tail kTails[kUtf8States] = {
    {0, 0, Utf8State::kInvalid},         // kBoundary: at_boundary()
    {0x80, 0xBF, Utf8State::kBoundary},  // kTail1
    {0x80, 0xBF, Utf8State::kTail1},     // kTail2
    {0x80, 0xBF, Utf8State::kTail2},     // kTail3
    {0xA0, 0xBF, Utf8State::kTail1},     // kE0
    {0x80, 0x9F, Utf8State::kTail1},     // kED
    {0x90, 0xBF, Utf8State::kTail2},     // kF0
    {0x80, 0x8F, Utf8State::kTail2},     // kF4
};

Utf8State step(Utf8State state, uint8_t b) {
  if (state == Utf8State::kBoundary) return at_boundary(b);
  if (state == Utf8State::kInvalid) return Utf8State::kInvalid;
  const Tail& tail = kTails[static_cast<int>(state)];
  return in(b, tail.lo, tail.hi) ? tail.next : Utf8State::kInvalid;
}

}  // namespace

Utf8State utf8_after(Utf8State state, std::string_view bytes) {
  for (char c : bytes) state = step(state, static_cast<uint8_t>(c));
  return state;
}

Utf8Masks::Utf8Masks(const std::vector<std::string>& token_bytes, int64_t words)
    : words_(words), bits_(static_cast<size_t>(kUtf8States * words), 0) {
  MS_CHECK(static_cast<int64_t>(token_bytes.size()) <= words * 32, "utf8 masks: {} ids do not fit {} words",
           token_bytes.size(), words);
  for (int s = 0; s < kUtf8States; ++s) {
    const auto state = static_cast<Utf8State>(s);
    int32_t* row = bits_.data() + s * words;
    for (size_t id = 0; id < token_bytes.size(); ++id) {
      const std::string& bytes = token_bytes[id];
      // An id without text ends or interrupts the text: only between characters.
      const bool valid =
          bytes.empty() ? state == Utf8State::kBoundary : utf8_after(state, bytes) != Utf8State::kInvalid;
      if (valid) row[id / 32] = static_cast<int32_t>(static_cast<uint32_t>(row[id / 32]) | (1u << (id % 32)));
    }
  }
}

std::span<const int32_t> Utf8Masks::allowed(Utf8State state) const {
  const auto s = static_cast<int64_t>(state);
  MS_CHECK(s >= 0 && s < kUtf8States, "utf8 masks: no mask for an invalid state");
  return {bits_.data() + s * words_, static_cast<size_t>(words_)};
}

}  // namespace moeserve::grammar
