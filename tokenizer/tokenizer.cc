#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {

Tokenizer::Tokenizer(TokenizerParts parts) : parts_(std::move(parts)) {
  MS_CHECK(parts_.token_bytes.size() == parts_.token_kind.size(), "{}: {} token texts but {} token kinds",
           parts_.origin, parts_.token_bytes.size(), parts_.token_kind.size());
  MS_CHECK(parts_.bpe != nullptr, "{}: no BPE model", parts_.origin);
}

void Tokenizer::check_id(int32_t id) const {
  MS_CHECK(id >= 0 && id < vocab_size(), "token id {} is outside the vocabulary of {} (size {})", id, parts_.origin,
           vocab_size());
  MS_CHECK(parts_.token_kind[id] != TokenKind::kUnused, "token id {} has no token in {}", id, parts_.origin);
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return parts_.token_bytes[id];
}

TokenKind Tokenizer::token_kind(int32_t id) const {
  MS_CHECK(id >= 0 && id < vocab_size(), "token id {} is outside the vocabulary of {} (size {})", id, parts_.origin,
           vocab_size());
  return parts_.token_kind[id];
}

std::optional<int32_t> Tokenizer::added_token_id(std::string_view text) const {
  const auto match = parts_.added_tokens.find(text, 0, /*allow_special=*/true);
  if (!match || match->begin != 0 || match->length != text.size()) return std::nullopt;
  return match->id;
}

void Tokenizer::encode_ordinary(std::string_view segment, std::vector<int32_t>& out,
                                std::vector<std::string_view>& pieces, std::deque<std::string>& arena) const {
  if (segment.empty()) return;
  if (parts_.pre_tokenizer.empty()) {
    parts_.bpe->encode_piece(segment, out);
    return;
  }
  parts_.pre_tokenizer.split(segment, pieces, arena);
  for (std::string_view piece : pieces) parts_.bpe->encode_piece(piece, out);
  arena.clear();
}

namespace {

// The next added token to take at or after `pos`: special ones only outside the plain ranges
// (from `range` on; the ones before `pos` are skipped), and none across a range's edge, so
// each range is searched on its own.
std::optional<AddedTokenMatcher::Match> next_added_token(const AddedTokenMatcher& matcher, std::string_view text,
                                                         size_t pos, std::span<const TextRange> plain, size_t& range) {
  while (true) {
    while (range < plain.size() && plain[range].end <= pos) ++range;
    if (range == plain.size()) return matcher.find(text, pos, /*allow_special=*/true);
    const TextRange& r = plain[range];
    if (pos < r.begin) {
      if (auto match = matcher.find(text.substr(0, r.begin), pos, /*allow_special=*/true)) return match;
      pos = r.begin;
    }
    if (auto match = matcher.find(text.substr(0, r.end), pos, /*allow_special=*/false)) return match;
    pos = r.end;
  }
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  if (allow_special) return encode(text, std::span<const TextRange>());
  const TextRange all{0, text.size()};
  return encode(text, std::span<const TextRange>(&all, 1));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, std::span<const TextRange> plain) const {
  const size_t bad = first_invalid_utf8(text);
  MS_CHECK(bad == std::string_view::npos, "text to encode is not valid UTF-8 at byte {}", bad);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::vector<std::string_view> pieces;
  std::deque<std::string> arena;
  size_t pos = 0, range = 0;
  while (pos < text.size()) {
    const auto match = next_added_token(parts_.added_tokens, text, pos, plain, range);
    const size_t segment_end = match ? match->begin : text.size();
    encode_ordinary(text.substr(pos, segment_end - pos), ids, pieces, arena);
    if (!match) break;
    ids.push_back(match->id);
    pos = match->begin + match->length;
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (!has_token(id)) continue;
    if (skip_special && parts_.token_kind[id] == TokenKind::kSpecial) continue;
    bytes += parts_.token_bytes[id];
  }
  std::string text;
  text.reserve(bytes.size());
  append_utf8_lossy(bytes, text);
  return text;
}

}  // namespace moeserve::tokenizer
