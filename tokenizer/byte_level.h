// The GPT-2 / Hugging Face "ByteLevel" alphabet: every byte is shown as one printable
// Unicode character (printable Latin-1 bytes stand for themselves, the other 68 bytes map to
// U+0100 and up, in byte order). Vocab files of byte-level BPE models are written in it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve::tokenizer {

// The character that shows byte `b`.
uint32_t byte_level_char(uint8_t b);

// The raw bytes behind a token written in the byte-level alphabet, or nullopt if some character
// of `token` is not in the alphabet (such a token, e.g. "<｜User｜>", stands for its own UTF-8).
std::optional<std::string> byte_level_to_bytes(std::string_view token);

// The byte-level spelling of raw bytes (the inverse of byte_level_to_bytes).
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace moeserve::tokenizer
