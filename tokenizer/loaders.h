// The file-format readers behind load_tokenizer (internal to the tokenizer library).
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace moeserve::tokenizer {

// A Hugging Face tokenizer.json holding a byte-level BPE model (DeepSeek-V3's format).
TokenizerParts load_hf_tokenizer_json(const std::string& path, const TokenizerConfig& config);

// A tiktoken ranks file (one "<base64 token> <rank>" per line) with the split pattern and
// special-token layout of Kimi's tokenization_kimi.py (tokenizer_class TikTokenTokenizer).
TokenizerParts load_tiktoken_model(const std::string& path, const TokenizerConfig& config);

// Looks up the ids of the config's bos/eos texts among the added tokens; an error if the text
// is not a token.
void resolve_bos_eos(const TokenizerConfig& config, TokenizerParts& parts);

}  // namespace moeserve::tokenizer
