#include "tokenizer/special_tokens.h"

#include "core/error.h"

namespace moeserve::tokenizer {

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  for (const auto& [b, next] : nodes_[node].children) {
    if (b == byte) return next;
  }
  return -1;
}

void AddedTokenMatcher::add(std::string_view text, int32_t id, bool special) {
  MS_CHECK(!text.empty(), "added token {} has empty text", id);
  int32_t node = 0;
  for (char c : text) {
    const auto byte = static_cast<uint8_t>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_[node].children.emplace_back(byte, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  nodes_[node].token_id = id;
  nodes_[node].special = special;
  const auto first = static_cast<uint8_t>(text[0]);
  (special ? starts_special_ : starts_plain_)[first] = true;
  has_plain_ = has_plain_ || !special;
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::find(std::string_view text, size_t from,
                                                                bool allow_special) const {
  if (!allow_special && !has_plain_) return std::nullopt;
  for (size_t pos = from; pos < text.size(); ++pos) {
    const auto first = static_cast<uint8_t>(text[pos]);
    if (!starts_plain_[first] && !(allow_special && starts_special_[first])) continue;
    int32_t node = 0;
    std::optional<Match> longest;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      const Node& n = nodes_[node];
      if (n.token_id >= 0 && (allow_special || !n.special)) longest = Match{pos, i + 1 - pos, n.token_id};
    }
    if (longest) return longest;
  }
  return std::nullopt;
}

}  // namespace moeserve::tokenizer
