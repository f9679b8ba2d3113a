// Text <-> token ids for the DeepSeek-V3 / Kimi K2 model families.
//
//   auto tok = moeserve::tokenizer::load_tokenizer("/models/Kimi-K2-Instruct");
//   std::vector<int32_t> ids = tok->encode("hello", /*allow_special=*/false);
//   std::string text = tok->decode(ids);
//
// Formats: a Hugging Face tokenizer.json (byte-level BPE; DeepSeek-V3), or a tiktoken ranks
// file `tiktoken.model` plus tokenizer_config.json (Kimi K2), or the built-in byte tokenizer of
// the synthetic models. Streaming output: see detokenizer.h. Chat prompts: chat_template.h.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe_model.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_tokens.h"

namespace moeserve::tokenizer {

enum class TokenKind : uint8_t {
  kNormal,   // a BPE token
  kSpecial,  // a special token ("<|im_end|>", "[BOS]"): recognised in text only when allowed
  kAdded,    // a non-special added token: always recognised in text
  kUnused,   // an id with no token (a gap in the ranks file)
};

// Where the model's chat template came from, if it ships one (see chat_template.h).
struct ChatTemplateSource {
  std::string text;    // the Jinja text, empty if none
  std::string origin;  // e.g. "/m/tokenizer_config.json: chat_template"
  std::string name;    // a known template name when the format fixes it (built-in tokenizer)
};

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
};

// Everything a loader reads from the files; the Tokenizer takes it over.
struct TokenizerParts {
  std::string origin;                    // the file(s) it was read from, for messages
  std::vector<std::string> token_bytes;  // [vocab_size] raw bytes each id stands for
  std::vector<TokenKind> token_kind;     // [vocab_size]
  std::unique_ptr<BpeModel> bpe;
  PreTokenizer pre_tokenizer;
  AddedTokenMatcher added_tokens;
  std::optional<int32_t> bos_id, eos_id;
  std::string bos_token, eos_token;  // their text, as the chat templates print them
  ChatTemplateSource chat_template;
};

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerParts parts);

  // Token ids of `text` (UTF-8; an error names the first bad byte). With allow_special, the
  // text of a special token ("<|im_end|>") becomes that token; without, it is encoded as plain
  // text. Non-special added tokens are always recognised. Never adds BOS or EOS.
  std::vector<int32_t> encode(std::string_view text, bool allow_special) const;

  // As encode(text, true), except inside the `plain` ranges (sorted, disjoint), which are
  // encoded as with allow_special false: a chat prompt whose template markers are special
  // tokens while the text a client wrote into it (chat_template.h: RenderedChat) cannot forge
  // them. No special token is recognised across a range's edge.
  std::vector<int32_t> encode(std::string_view text, std::span<const TextRange> plain) const;

  // The text of `ids`, ill-formed UTF-8 replaced by U+FFFD. Special tokens print their text
  // unless skip_special. An id with no token (has_token) adds nothing, as in Hugging Face's
  // decode: a model's vocabulary is often padded past its tokenizer's, and a draw there (or a
  // logit_bias toward it) must not fail the engine that decodes it.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Whether `id` is a token of this tokenizer: in [0, vocab_size()) and not a hole in it.
  bool has_token(int32_t id) const {
    return id >= 0 && id < vocab_size() && parts_.token_kind[static_cast<size_t>(id)] != TokenKind::kUnused;
  }
  // Raw bytes of one token (possibly a fragment of a UTF-8 character); an error without
  // has_token.
  const std::string& token_bytes(int32_t id) const;
  TokenKind token_kind(int32_t id) const;

  int64_t vocab_size() const { return static_cast<int64_t>(parts_.token_bytes.size()); }
  std::optional<int32_t> bos_id() const { return parts_.bos_id; }
  std::optional<int32_t> eos_id() const { return parts_.eos_id; }
  const std::string& bos_token() const { return parts_.bos_token; }
  const std::string& eos_token() const { return parts_.eos_token; }
  // Id of an added or special token given its text ("<|im_end|>"), if the vocabulary has it.
  std::optional<int32_t> added_token_id(std::string_view text) const;

  const ChatTemplateSource& chat_template() const { return parts_.chat_template; }
  const std::string& origin() const { return parts_.origin; }

 private:
  void check_id(int32_t id) const;
  void encode_ordinary(std::string_view segment, std::vector<int32_t>& out, std::vector<std::string_view>& pieces,
                       std::deque<std::string>& arena) const;

  TokenizerParts parts_;
};

// Loads the tokenizer of a model directory: tokenizer.json (+ tokenizer_config.json if
// present), else tiktoken.model + tokenizer_config.json. `model_dir` may also be "synthetic"
// or "synthetic:NAME" for the built-in tokenizer with the default synthetic vocabulary.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);

// The tokenizer of synthetic models: byte b <-> id b for b in 0..255, then the special tokens
// [BOS] [EOS] <|im_end|> <|im_user|> <|im_assistant|> <|im_system|> <|im_middle|> [PAD] at
// 256..263, Kimi K2's <|tool_calls_section_begin|> <|tool_calls_section_end|> <|tool_call_begin|>
// <|tool_call_argument_begin|> <|tool_call_end|> <think> </think> at 264..270 (where the
// vocabulary has room), and <|reserved_token_ID|> for the remaining ids. Chat template: kimi-k2.
// Requires vocab_size >= 264.
std::unique_ptr<Tokenizer> make_builtin_tokenizer(int64_t vocab_size);

// Vocabulary size of the built-in tokenizer that "synthetic" names in load_tokenizer.
inline constexpr int64_t kBuiltinDefaultVocabSize = 512;

}  // namespace moeserve::tokenizer
