// Prompts for the load generator, following sglang.bench_serving's random datasets: each
// request's input and output lengths are drawn uniformly from [len * ratio, len].
//   random:     a text prompt of `input_len` random words (the server's tokenizer decides the
//               token count; the benchmark reads it back from the usage it reports)
//   random-ids: a prompt of `input_len` token ids drawn from [0, vocab_size)
//   sharegpt:FILE: ShareGPT conversations (sharegpt_prompts below)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moeserve::bench {

struct DatasetOptions {
  std::string name = "random-ids";  // random | random-ids
  int64_t num_prompts = 100;
  int64_t input_len = 256;
  int64_t output_len = 64;
  double range_ratio = 0.0;  // 0: lengths from [1, len]; 1: exactly len
  int64_t vocab_size = 256;  // random-ids: ids drawn from [0, vocab_size)
  uint64_t seed = 1;
};

struct BenchPrompt {
  std::string text;          // random
  std::vector<int32_t> ids;  // random-ids
  int64_t input_len = 0;     // as generated (words or ids)
  int64_t output_len = 0;    // max_tokens, with ignore_eos
};

// random and random-ids. Throws an Error naming the flag (--num-prompts, --random-input-len,
// ...) when out of range.
std::vector<BenchPrompt> make_prompts(const DatasetOptions& options);

// The token count of a text under the served model's tokenizer.
using TokenCounter = std::function<int64_t(const std::string& text)>;

// ShareGPT prompts as sglang.bench_serving samples them: FILE is a JSON list of
// {"conversations": [{"from": ..., "value": ...}, ...]}; conversations with two turns or more
// give (first turn = the prompt text, the second turn's token count = the output length, or
// `fixed_output_len` when > 0), taken in an order shuffled by `seed`, skipping pairs whose
// prompt or output has fewer than 2 tokens, a prompt over 1024 tokens, or prompt + output
// over 2048; the first `num_prompts` kept. Errors name the file and what is wrong with it.
std::vector<BenchPrompt> sharegpt_prompts(const std::string& path, int64_t num_prompts, int64_t fixed_output_len,
                                          uint64_t seed, const TokenCounter& count_tokens);

}  // namespace moeserve::bench
