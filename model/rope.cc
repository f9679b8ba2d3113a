#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace moeserve {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t dim = c.qk_rope_head_dim;
  const int64_t half = dim / 2;
  const float base = static_cast<float>(c.rope_theta);
  std::vector<float> pos_freqs(half), inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    pos_freqs[i] = std::pow(base, exponent);
  }
  if (c.rope_scaling.type != "yarn") {
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0f / pos_freqs[i];
    return inv_freq;
  }
  const RopeScaling& r = c.rope_scaling;
  const double original = static_cast<double>(r.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(original / (rotations * 2.0 * M_PI))) / (2.0 * std::log(c.rope_theta));
  };
  double low = correction_dim(r.beta_fast);
  double high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const float factor = static_cast<float>(r.factor);
  for (int64_t i = 0; i < half; ++i) {
    const float ramp =
        std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    const float extrapolation = 1.0f / pos_freqs[i];
    const float interpolation = 1.0f / (factor * pos_freqs[i]);
    inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv_freq;
}

}  // namespace moeserve
