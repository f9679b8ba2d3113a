#include "runtime/logit_adjust_state.h"

#include <cmath>

namespace moeserve::runtime {

LogitAdjustState::LogitAdjustState(ops::LogitAdjustOptions options, std::span<const int32_t> prompt)
    : options_(std::move(options)) {
  if (options_.repetition_penalty != 1.0f) prompt_.insert(prompt.begin(), prompt.end());
}

void LogitAdjustState::add_output(int32_t token) {
  ++generated_[token];
  ++generated_count_;
}

void LogitAdjustState::append_entries(int32_t row, std::vector<ops::LogitAdjustEntry>& out) const {
  const size_t first = out.size();
  std::unordered_map<int32_t, size_t> at;  // token -> its entry in out
  auto entry = [&](int32_t token) -> ops::LogitAdjustEntry& {
    auto [it, added] = at.emplace(token, out.size());
    if (added) out.push_back({.row = row, .token = token});
    return out[it->second];
  };
  for (const auto& [token, bias] : options_.logit_bias) entry(token).bias += bias;
  if (generated_count_ < options_.min_tokens)
    for (int32_t token : options_.min_tokens_mask) entry(token).bias = -INFINITY;
  const float repetition = options_.repetition_penalty;
  for (int32_t token : prompt_) entry(token).repetition = repetition;
  const bool output_penalties =
      repetition != 1.0f || options_.frequency_penalty != 0.0f || options_.presence_penalty != 0.0f;
  for (const auto& [token, count] : generated_) {
    if (!output_penalties) break;
    ops::LogitAdjustEntry& e = entry(token);
    e.repetition = repetition;
    e.subtract = options_.frequency_penalty * static_cast<float>(count) + options_.presence_penalty;
  }
  // A token whose reasons cancel (a zero bias) changes nothing: drop it.
  std::erase_if(out, [&, i = size_t{0}](const ops::LogitAdjustEntry& e) mutable {
    const bool mine = i++ >= first;
    return mine && e.bias == 0.0f && e.repetition == 1.0f && e.subtract == 0.0f;
  });
}

}  // namespace moeserve::runtime
