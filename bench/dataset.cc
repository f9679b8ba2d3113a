#include "bench/dataset.h"

#include <algorithm>
#include <random>

#include "core/error.h"

namespace moeserve::bench {

std::vector<BenchPrompt> make_prompts(const DatasetOptions& o) {
  MS_CHECK(o.name == "random" || o.name == "random-ids", "--dataset '{}': expected random or random-ids", o.name);
  MS_CHECK(o.num_prompts > 0, "--num-prompts must be positive (got {})", o.num_prompts);
  MS_CHECK(o.input_len > 0, "--random-input-len must be positive (got {})", o.input_len);
  MS_CHECK(o.output_len > 0, "--random-output-len must be positive (got {})", o.output_len);
  MS_CHECK(o.range_ratio >= 0 && o.range_ratio <= 1, "--random-range-ratio must be in [0, 1] (got {})", o.range_ratio);
  MS_CHECK(o.vocab_size > 0, "--vocab-size must be positive (got {})", o.vocab_size);
  std::mt19937_64 rng(o.seed);
  auto length = [&](int64_t len) {
    const int64_t low = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(len) * o.range_ratio));
    return std::uniform_int_distribution<int64_t>(low, len)(rng);
  };
  std::vector<BenchPrompt> prompts(static_cast<size_t>(o.num_prompts));
  for (BenchPrompt& p : prompts) {
    p.input_len = length(o.input_len);
    p.output_len = length(o.output_len);
    if (o.name == "random-ids") {
      std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(o.vocab_size - 1));
      p.ids.resize(static_cast<size_t>(p.input_len));
      for (int32_t& t : p.ids) t = id(rng);
    } else {
      std::uniform_int_distribution<int> letter('a', 'z'), word_len(2, 7);
      for (int64_t w = 0; w < p.input_len; ++w) {
        if (w) p.text += ' ';
        for (int k = word_len(rng); k > 0; --k) p.text += static_cast<char>(letter(rng));
      }
    }
  }
  return prompts;
}

}  // namespace moeserve::bench
