// The parts of a Hugging Face tokenizer_config.json (and chat_template.jinja) that both
// tokenizer formats use: special-token texts, the chat template, the tokenizer class and the
// added_tokens_decoder table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {

// Token ids index per-token tables, so every reader bounds them: below 2^24 (real vocabularies
// stay under 2^18) and at most kMaxTokenIdGap past the number of tokens a file lists (ids may
// leave gaps, but a crafted id must not allocate gigabytes).
constexpr int64_t kMaxTokenIds = int64_t{1} << 24;
constexpr int64_t kMaxTokenIdGap = int64_t{1} << 16;

// The bound above for a file listing `listed` tokens: every id must be below it.
inline int64_t token_id_limit(size_t listed) {
  return std::min<int64_t>(kMaxTokenIds, static_cast<int64_t>(listed) + kMaxTokenIdGap);
}

struct AddedTokenEntry {
  int32_t id;
  std::string content;
  bool special;
};

struct TokenizerConfig {
  std::string path;  // empty if the model has no tokenizer_config.json
  std::optional<std::string> bos_token, eos_token;
  std::string tokenizer_class;
  std::vector<AddedTokenEntry> added_tokens_decoder;  // sorted by id
  ChatTemplateSource chat_template;
};

// Reads `model_dir`/tokenizer_config.json if it exists (required: an error otherwise) and the
// chat template: `model_dir`/chat_template.jinja if present (as transformers prefers it), else
// the config's "chat_template" (a string, or a list of {name, template} whose "default" is used).
TokenizerConfig read_tokenizer_config(const std::string& model_dir, bool required);

}  // namespace moeserve::tokenizer
