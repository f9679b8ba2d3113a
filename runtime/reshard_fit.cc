#include "runtime/reshard_fit.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/deepseek_v3_weights.h"

namespace moeserve::runtime {

std::string reshard_fit(const ReshardFitParams& p) {
  if (p.bytes_per_rank <= 0) return "";
  const int devices = std::max(p.from.world(), p.to.world());
  for (int r = 0; r < devices; ++r) {
    const int64_t old_bytes = r < p.from.world() ? rank_weights(p.config, p.from, r, p.element_bytes).held_bytes : 0;
    const int64_t new_bytes = r < p.to.world() ? rank_weights(p.config, p.to, r, p.element_bytes).held_bytes : 0;
    if (old_bytes + new_bytes > p.bytes_per_rank)
      return fmt::format(
          "rank {} would hold plan '{}''s {} bytes of weights and plan '{}''s {} while copying, more than its {}; "
          "the new plan's weights are read from the model's source after the old ones are freed",
          r, p.from.name, old_bytes, p.to.name, new_bytes, p.bytes_per_rank);
  }
  return "";
}

}  // namespace moeserve::runtime
