// Finds added tokens (special tokens such as "<|im_end|>" and other added tokens) in text:
// leftmost occurrence, longest token at that position (Hugging Face's aho-corasick
// LeftmostLongest; tiktoken's special-token regex agrees for these vocabularies).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::tokenizer {

class AddedTokenMatcher {
 public:
  struct Match {
    size_t begin;
    size_t length;
    int32_t id;
  };

  // `special` tokens are matched only when the caller allows special tokens; the others
  // (non-special added tokens) always are.
  void add(std::string_view text, int32_t id, bool special);

  std::optional<Match> find(std::string_view text, size_t from, bool allow_special) const;

  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node index)
    int32_t token_id = -1;
    bool special = false;
  };
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<Node> nodes_{Node{}};  // [0] is the root
  std::array<bool, 256> starts_special_{};
  std::array<bool, 256> starts_plain_{};
  bool has_plain_ = false;
};

}  // namespace moeserve::tokenizer
