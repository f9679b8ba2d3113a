// Fuzz target: loading a tokenizer from its files (tokenizer/: tokenizer.json, or tiktoken.model
// with tokenizer_config.json), then encoding and decoding a text with it. Sections (see
// fuzz_input.h): the tokenizer file (tokenizer.json when it starts with '{', else tiktoken.model),
// tokenizer_config.json (absent when empty), the text.
// Invariants of a loaded tokenizer: every id encode gives is in the vocabulary; decode and the
// streaming detokenizer agree; bos/eos ids name tokens; the rendered chat template (if the files
// carry a known one) encodes.
#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using moeserve::tokenizer::Tokenizer;

void write_files(const std::vector<std::string_view>& parts) {
  moeserve::fuzz::clear_scratch_dir();
  const bool hf = !parts[0].empty() && parts[0][0] == '{';
  moeserve::fuzz::write_scratch_file(hf ? "tokenizer.json" : "tiktoken.model", parts[0]);
  if (parts.size() > 1 && !parts[1].empty()) moeserve::fuzz::write_scratch_file("tokenizer_config.json", parts[1]);
}

void check_ids(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip_special) {
  for (const int32_t id : ids) MS_FUZZ_ASSERT(id >= 0 && id < tokenizer.vocab_size(), "id outside the vocabulary");
  moeserve::tokenizer::IncrementalDetokenizer stream(tokenizer, skip_special);
  std::string streamed;
  for (const int32_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  MS_FUZZ_ASSERT(streamed == tokenizer.decode(ids, skip_special), "streamed text differs from decode");
}

void check_tokenizer(const Tokenizer& tokenizer, std::string_view text) {
  for (const auto id : {tokenizer.bos_id(), tokenizer.eos_id()})
    if (id) MS_FUZZ_ASSERT(*id >= 0 && *id < tokenizer.vocab_size(), "bos/eos id outside the vocabulary");
  try {
    for (const bool allow_special : {false, true}) {
      const std::vector<int32_t> ids = tokenizer.encode(text, allow_special);
      check_ids(tokenizer, ids, false);
      check_ids(tokenizer, ids, true);
    }
  } catch (const moeserve::Error&) {  // text that is not UTF-8
  }
  if (moeserve::tokenizer::first_invalid_utf8(text) != std::string_view::npos) return;  // JSON strings are UTF-8
  try {
    moeserve::tokenizer::ChatRequest chat;
    chat.messages = {{{"role", "user"}, {"content", std::string(text)}}};
    const std::string prompt = moeserve::tokenizer::render_chat(tokenizer, chat);
    check_ids(tokenizer, tokenizer.encode(prompt, true), false);
  } catch (const moeserve::Error&) {  // no known template
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts = moeserve::fuzz::split_sections(moeserve::fuzz::as_text(data, size));
  write_files(parts);
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = moeserve::tokenizer::load_tokenizer(moeserve::fuzz::scratch_dir());
  } catch (const moeserve::Error&) {
    return 0;
  }
  check_tokenizer(*tokenizer, parts.size() > 2 ? parts[2] : std::string_view("Hello, world! 你好 <|im_end|>"));
  return 0;
}
