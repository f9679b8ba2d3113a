#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (!tokenizer_.has_token(id)) return {};  // as decode: no text, and what is pending stays pending
  const std::string& bytes = tokenizer_.token_bytes(id);
  if (skip_special_ && tokenizer_.token_kind(id) == TokenKind::kSpecial) return {};
  pending_ += bytes;
  const size_t hold = completable_utf8_tail(pending_);
  std::string text;
  append_utf8_lossy(std::string_view(pending_).substr(0, pending_.size() - hold), text);
  pending_.erase(0, pending_.size() - hold);
  return text;
}

std::string IncrementalDetokenizer::flush() {
  std::string text;
  append_utf8_lossy(pending_, text);
  pending_.clear();
  return text;
}

}  // namespace moeserve::tokenizer
