#include "parallel/memory_fit.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>

#include "core/error.h"

namespace moeserve::parallel {

int64_t sequences_per_rank(const ParallelPlan& plan, const MemoryBudget& budget) {
  return (budget.max_running_requests + plan.attn_dp - 1) / plan.attn_dp;
}

int64_t rank_bytes_needed(const ParallelPlan& plan, const RankMemory& rank, const MemoryBudget& budget) {
  return rank.weight_bytes + rank.kv_bytes_per_token * budget.context_tokens * sequences_per_rank(plan, budget);
}

MemoryFit check_memory_fit(const ParallelPlan& plan, const std::vector<RankMemory>& ranks, const MemoryBudget& budget) {
  MS_CHECK(budget.bytes_per_rank > 0, "plan '{}': --mem-per-rank must be positive", plan.name);
  MS_CHECK(budget.context_tokens >= 0 && budget.max_running_requests >= 1,
           "plan '{}': context length must be >= 0 and running requests >= 1", plan.name);
  MemoryFit fit;
  fit.kv_token_room = INT64_MAX;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int64_t needed = rank_bytes_needed(plan, ranks[r], budget);
    if (needed <= budget.bytes_per_rank) {
      if (r == 0 || needed > fit.needed_bytes)
        fit = {static_cast<int>(r), needed, ranks[r].weight_bytes, fit.kv_token_room};
      if (ranks[r].kv_bytes_per_token > 0)
        fit.kv_token_room =
            std::min(fit.kv_token_room, (budget.bytes_per_rank - ranks[r].weight_bytes) / ranks[r].kv_bytes_per_token);
      continue;
    }
    const int64_t sequences = sequences_per_rank(plan, budget);
    fail(
        "plan '{}' does not fit --mem-per-rank {}: rank {} needs {} = weights {} + KV cache {} ({} tokens x {} "
        "sequences x {} per token)",
        plan.name, format_bytes(static_cast<double>(budget.bytes_per_rank)), r,
        format_bytes(static_cast<double>(needed)), format_bytes(static_cast<double>(ranks[r].weight_bytes)),
        format_bytes(static_cast<double>(needed - ranks[r].weight_bytes)), budget.context_tokens, sequences,
        format_bytes(static_cast<double>(ranks[r].kv_bytes_per_token)));
  }
  if (fit.kv_token_room == INT64_MAX) fit.kv_token_room = 0;
  return fit;
}

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  double number = 0;
  try {
    number = i ? std::stod(text.substr(0, i)) : -1;
  } catch (const std::logic_error&) {
    number = -1;
  }
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale = -1;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "kib" || unit == "k")
    scale = 1024.0;
  else if (unit == "mib" || unit == "m")
    scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  MS_CHECK(number > 0 && scale > 0, "{}: '{}' is not a size (use e.g. 80GiB, 141GB, 512MiB or a byte count)", what,
           text);
  return static_cast<int64_t>(std::llround(number * scale));
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", bytes, units[u]);
}

}  // namespace moeserve::parallel
