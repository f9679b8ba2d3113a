// Strict standard base64 (RFC 4648 alphabet, '=' padding required), as in tiktoken ranks files.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace moeserve::tokenizer {

// The decoded bytes, or nullopt if `text` is not canonical padded base64.
std::optional<std::string> base64_decode(std::string_view text);

std::string base64_encode(std::string_view bytes);

}  // namespace moeserve::tokenizer
