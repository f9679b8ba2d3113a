// The built-in byte tokenizer of the synthetic models.
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {
namespace {

// In id order from 256; the chat template (kimi-k2) uses the <|im_*|> tokens.
constexpr const char* kBuiltinSpecialTokens[] = {
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "[PAD]",
};
constexpr int64_t kNumBuiltinSpecialTokens = std::size(kBuiltinSpecialTokens);
// Then, where the vocabulary has room, Kimi K2's tool-call and thinking tokens, so that the
// output parsers' tests see them as the special tokens they are in Kimi's own tokenizer.
constexpr const char* kBuiltinOutputTokens[] = {
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
};

std::string special_token_text(int64_t id) {
  const int64_t special = id - 256;
  if (special < kNumBuiltinSpecialTokens) return kBuiltinSpecialTokens[special];
  if (special - kNumBuiltinSpecialTokens < static_cast<int64_t>(std::size(kBuiltinOutputTokens)))
    return kBuiltinOutputTokens[special - kNumBuiltinSpecialTokens];
  return "<|reserved_token_" + std::to_string(id) + "|>";
}

}  // namespace

std::unique_ptr<Tokenizer> make_builtin_tokenizer(int64_t vocab_size) {
  MS_CHECK(vocab_size >= 256 + kNumBuiltinSpecialTokens && vocab_size <= INT32_MAX,
           "the built-in tokenizer needs a vocabulary of at least {} ids (256 bytes + {} special tokens), "
           "the model has {}",
           256 + kNumBuiltinSpecialTokens, kNumBuiltinSpecialTokens, vocab_size);
  TokenizerParts parts;
  parts.origin = fmt::format("built-in byte tokenizer (vocab {})", vocab_size);
  parts.token_bytes.resize(vocab_size);
  parts.token_kind.resize(vocab_size, TokenKind::kSpecial);
  std::array<int32_t, 256> byte_ids;
  for (int b = 0; b < 256; ++b) {
    parts.token_bytes[b] = std::string(1, static_cast<char>(b));
    parts.token_kind[b] = TokenKind::kNormal;
    byte_ids[b] = b;
  }
  for (int64_t id = 256; id < vocab_size; ++id) {
    parts.token_bytes[id] = special_token_text(id);
    parts.added_tokens.add(parts.token_bytes[id], static_cast<int32_t>(id), /*special=*/true);
  }
  // No merges: every byte is its own token.
  parts.bpe = std::make_unique<BpeModel>(byte_ids, MergeTable{}, StringIdMap{}, BpeModel::Options{});
  parts.bos_id = 256;
  parts.bos_token = "[BOS]";
  parts.eos_id = 257;
  parts.eos_token = "[EOS]";
  parts.chat_template = {"", "built-in tokenizer", "kimi-k2"};
  return std::make_unique<Tokenizer>(std::move(parts));
}

}  // namespace moeserve::tokenizer
