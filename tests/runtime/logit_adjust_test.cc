// Logit adjustments (step/logit_adjust.h) end to end on the host: a request's options and
// history become sparse entries (runtime::LogitAdjustState) that the CPU op applies in place,
// over a vocabulary split into parts and ranks; the result must equal vLLM's formulas written
// out over the whole row (logit_bias and min_tokens first, then apply_penalties: repetition
// over prompt and output tokens, frequency and presence over output tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/random.h"
#include "runtime/logit_adjust_state.h"

namespace moeserve {
namespace {

// vLLM's sampler on one row, over the whole vocabulary.
std::vector<float> vllm_reference(std::vector<float> logits, const ops::LogitAdjustOptions& o,
                                  const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  const auto vocab = static_cast<int64_t>(logits.size());
  for (const auto& [token, bias] : o.logit_bias) logits[token] += bias;
  if (static_cast<int64_t>(output.size()) < o.min_tokens)
    for (int32_t token : o.min_tokens_mask) logits[token] = -INFINITY;
  std::vector<int> count(vocab, 0);
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  for (int32_t token : output) {
    ++count[token];
    seen.insert(token);
  }
  for (int64_t t = 0; t < vocab; ++t) {
    const float penalty = seen.count(static_cast<int32_t>(t)) ? o.repetition_penalty : 1.0f;
    logits[t] = logits[t] > 0 ? logits[t] / penalty : logits[t] * penalty;
    logits[t] -= o.frequency_penalty * static_cast<float>(count[t]);
    logits[t] -= o.presence_penalty * static_cast<float>(count[t] > 0);
  }
  return logits;
}

struct Case {
  const char* name;
  ops::LogitAdjustOptions options;
  int64_t generated;  // output tokens so far
};

std::vector<Case> cases() {
  ops::LogitAdjustOptions bias;
  bias.logit_bias = {{3, 5.0f}, {77, -100.0f}, {200, 0.5f}};
  ops::LogitAdjustOptions min_tokens;
  min_tokens.min_tokens = 6;
  min_tokens.min_tokens_mask = {1, 150};
  ops::LogitAdjustOptions penalties;
  penalties.repetition_penalty = 1.3f;
  penalties.frequency_penalty = 0.7f;
  penalties.presence_penalty = -0.4f;
  ops::LogitAdjustOptions all = penalties;
  all.logit_bias = bias.logit_bias;
  all.min_tokens = 6;
  all.min_tokens_mask = {1, 150};
  ops::LogitAdjustOptions below_one;
  below_one.repetition_penalty = 0.8f;
  return {{"logit_bias", bias, 3},
          {"min_tokens before", min_tokens, 5},
          {"min_tokens reached", min_tokens, 6},
          {"penalties", penalties, 12},
          {"all", all, 4},
          {"repetition < 1", below_one, 9},
          {"nothing generated", all, 0}};
}

TEST(LogitAdjust, EntriesOnTheCpuOpEqualVllmsFormulas) {
  auto backend = cpu::make_cpu_backend();
  const int64_t vocab = 256, rows = 3, parts = 2, ranks = 2;
  const int64_t vocab_local = vocab / ranks, vocab_part = vocab_local / parts;
  const std::vector<int32_t> prompt = {5, 9, 9, 200, 31, 3};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const int32_t row = 1;  // rows 0 and 2 have no entries and must not change
    std::vector<float> logits(rows * vocab);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = 8.0f * uniform_pm1(11, i);
    runtime::LogitAdjustState state(c.options, prompt);
    std::vector<int32_t> output;
    for (int64_t i = 0; i < c.generated; ++i) {
      output.push_back(static_cast<int32_t>((i * 37 + 5) % vocab));  // repeats: counts above 1
      state.add_output(output.back());
    }
    std::vector<ops::LogitAdjustEntry> entries;
    state.append_entries(row, entries);
    const auto count = static_cast<int32_t>(entries.size());
    entries.push_back({.row = row, .token = 7, .bias = 1e9f});  // beyond the count: never applied
    // Each rank holds [parts, rows, vocab_part] of its ids, as the head leaves them.
    std::vector<float> got(rows * vocab);
    for (int64_t rank = 0; rank < ranks; ++rank) {
      std::vector<float> local(parts * rows * vocab_part);
      for (int64_t v = 0; v < parts; ++v)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < vocab_part; ++i)
            local[(v * rows + r) * vocab_part + i] = logits[r * vocab + rank * vocab_local + v * vocab_part + i];
      backend->logit_adjust({local.data(), entries.data(), &count, static_cast<int64_t>(entries.size()), rows,
                             vocab_part, parts, rank * vocab_local});
      for (int64_t v = 0; v < parts; ++v)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < vocab_part; ++i)
            got[r * vocab + rank * vocab_local + v * vocab_part + i] = local[(v * rows + r) * vocab_part + i];
    }
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> raw(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      const std::vector<float> want = r == row ? vllm_reference(raw, c.options, prompt, output) : raw;
      for (int64_t t = 0; t < vocab; ++t) {
        const float g = got[r * vocab + t], w = want[t];
        if (std::isinf(w))
          EXPECT_EQ(g, w) << "row " << r << " token " << t;
        else
          EXPECT_NEAR(g, w, 1e-5f * std::max(1.0f, std::abs(w))) << "row " << r << " token " << t;
      }
    }
  }
}

TEST(LogitAdjust, DefaultOptionsListNothing) {
  runtime::LogitAdjustState state({}, std::vector<int32_t>{1, 2, 3});
  state.add_output(4);
  std::vector<ops::LogitAdjustEntry> entries;
  state.append_entries(0, entries);
  EXPECT_TRUE(entries.empty());
  EXPECT_FALSE(ops::LogitAdjustOptions{}.active());
}

}  // namespace
}  // namespace moeserve
