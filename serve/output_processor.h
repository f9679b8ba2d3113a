// Turns one request's generated tokens into its output text as they arrive: streaming
// detokenization (never broken UTF-8), stop token ids, stop strings (the text stops before
// the match; text that could still become a stop string is held back), and the length limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::serve {

struct OutputLimits {
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  int64_t min_tokens = 0;                   // no stop string or stop token ends it earlier
  bool include_stop_str_in_output = false;  // the matched stop string stays in the text
  // stop_token_ids[0, this) are the client's: a stop there is the stop_reason; the rest (EOS)
  // end with none, as in vLLM.
  size_t client_stop_token_ids = SIZE_MAX;
};

// Characters (code points) in valid UTF-8 text: what OpenAI's text offsets count.
int64_t code_points(const std::string& utf8);

class OutputProcessor {
 public:
  OutputProcessor(const tokenizer::Tokenizer& tokenizer, OutputLimits limits);

  struct Update {
    std::string text;           // text that became final with this token
    int64_t text_offset = 0;    // where this token's text starts in the whole output, in characters
    std::string finish_reason;  // "" while running, else "stop" or "length"
    // What stopped it (vLLM's stop_reason): a stop string, or a client's stop token id (-1: none).
    std::string stop_string;
    int32_t stop_token = -1;
  };
  // Adds the next generated token; `stops` (structured output: the grammar is complete) ends
  // the output there as a stop token does.
  Update push(int32_t token, bool stops = false);

  int64_t generated() const { return generated_; }
  bool finished() const { return finished_; }

 private:
  // The longest suffix of held_ that is a proper prefix of a stop string.
  size_t held_back_length() const;

  OutputLimits limits_;
  tokenizer::IncrementalDetokenizer detokenizer_;
  std::string held_;           // decoded text not yet released
  int64_t decoded_chars_ = 0;  // code points decoded so far (the detokenizer emits whole characters)
  int64_t generated_ = 0;
  bool finished_ = false;
};

}  // namespace moeserve::serve
