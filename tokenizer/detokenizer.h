// Streaming detokenization: feed generated ids one at a time, get text as soon as it is whole.
// A character whose UTF-8 bytes are spread over several tokens is held back until its last
// byte arrives, so no chunk is ever broken UTF-8; bytes that can no longer form a character
// become U+FFFD at once. The concatenation of all push() results and flush() equals
// Tokenizer::decode of all the ids.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {

class IncrementalDetokenizer {
 public:
  // The tokenizer must outlive the detokenizer.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false);

  // Text completed by `id` (may be empty while a character is incomplete).
  std::string push(int32_t id);

  // What is still held back, an incomplete character as U+FFFD; the stream is then empty.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete trailing character
};

}  // namespace moeserve::tokenizer
