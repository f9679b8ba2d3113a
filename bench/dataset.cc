#include "bench/dataset.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"

namespace moeserve::bench {

std::vector<BenchPrompt> make_prompts(const DatasetOptions& o) {
  MS_CHECK(o.name == "random" || o.name == "random-ids", "--dataset '{}': expected random, random-ids or sharegpt:FILE",
           o.name);
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

std::vector<BenchPrompt> sharegpt_prompts(const std::string& path, int64_t num_prompts, int64_t fixed_output_len,
                                          uint64_t seed, const TokenCounter& count_tokens) {
  MS_CHECK(num_prompts > 0, "--num-prompts must be positive (got {})", num_prompts);
  std::ifstream in(path);
  MS_CHECK(in.good(), "--dataset sharegpt:{}: cannot open the file", path);
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    MS_CHECK(false, "--dataset sharegpt:{}: not JSON ({})", path, e.what());
  }
  MS_CHECK(data.is_array(), "--dataset sharegpt:{}: expected a JSON list of conversations", path);
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& item : data) {
    if (!item.is_object() || !item.contains("conversations") || !item["conversations"].is_array()) continue;
    const auto& turns = item["conversations"];
    if (turns.size() < 2 || !turns[0].is_object() || !turns[1].is_object()) continue;
    const auto prompt = turns[0].find("value"), reply = turns[1].find("value");
    if (prompt == turns[0].end() || reply == turns[1].end() || !prompt->is_string() || !reply->is_string()) continue;
    pairs.emplace_back(prompt->get<std::string>(), reply->get<std::string>());
  }
  std::mt19937_64 rng(seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  std::vector<BenchPrompt> prompts;
  for (const auto& [prompt, reply] : pairs) {
    if (static_cast<int64_t>(prompts.size()) == num_prompts) break;
    BenchPrompt p;
    p.text = prompt;
    p.input_len = count_tokens(prompt);
    p.output_len = fixed_output_len > 0 ? fixed_output_len : count_tokens(reply);
    if (p.input_len < 2 || p.output_len < 2) continue;
    if (p.input_len > 1024 || p.input_len + p.output_len > 2048) continue;
    prompts.push_back(std::move(p));
  }
  MS_CHECK(!prompts.empty(), "--dataset sharegpt:{}: no usable conversation (two turns of 2 to 1024 tokens)", path);
  return prompts;
}

}  // namespace moeserve::bench
