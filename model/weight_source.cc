#include "model/weight_source.h"

#include <cmath>

#include "core/error.h"
#include "core/random.h"

namespace moeserve {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

Tensor CheckpointWeightSource::read(const std::string& name, const Shape& full_shape, Slice rows, Slice cols) {
  record(name);
  return checkpoint_->read_f32(name, full_shape, rows, cols);
}

std::string SyntheticWeightSource::describe() const { return fmt::format("synthetic weights (seed {})", seed_); }

SyntheticRecipe SyntheticWeightSource::recipe_of(const std::string& name, const Shape& full_shape) const {
  MS_CHECK(full_shape.size() == 1 || full_shape.size() == 2, "synthetic tensor '{}': shape {} is not 1-D or 2-D", name,
           shape_str(full_shape));
  const int64_t fan_in = full_shape.size() == 2 ? full_shape[1] : 1;
  // Uniform(-a, a) has variance a^2/3: a = sqrt(3 / fan_in) keeps a projection's output at
  // unit variance. Norm weights sit near 1, biases near 0; residual-branch outputs (o_proj,
  // down_proj) are damped so that the residual stream grows slowly with depth.
  SyntheticRecipe r;
  r.seed = splitmix64(seed_ ^ hash_string(name));
  if (ends_with(name, "norm.weight")) {
    r.offset = 1.0f;
    r.amplitude = 0.1f;
  } else if (ends_with(name, "e_score_correction_bias")) {
    r.amplitude = 0.05f;
  } else if (ends_with(name, "embed_tokens.weight")) {
    r.amplitude = 1.0f;
  } else {
    r.amplitude = std::sqrt(3.0f / static_cast<float>(fan_in));
    if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight")) r.amplitude *= 0.5f;
  }
  return r;
}

bool SyntheticWeightSource::synthetic_recipe(const std::string& name, const Shape& full_shape,
                                             SyntheticRecipe* recipe) {
  record(name);
  *recipe = recipe_of(name, full_shape);
  return true;
}

Tensor SyntheticWeightSource::read(const std::string& name, const Shape& full_shape, Slice rows, Slice cols) {
  record(name);
  const SyntheticRecipe recipe = recipe_of(name, full_shape);
  const int64_t num_rows = full_shape[0];
  const int64_t num_cols = full_shape.size() == 2 ? full_shape[1] : 1;
  if (rows.end < 0) rows.end = num_rows;
  if (cols.end < 0) cols.end = num_cols;
  MS_CHECK(0 <= rows.begin && rows.begin <= rows.end && rows.end <= num_rows && 0 <= cols.begin &&
               cols.begin <= cols.end && cols.end <= num_cols,
           "synthetic tensor '{}': slice outside shape {}", name, shape_str(full_shape));
  const int64_t out_rows = rows.end - rows.begin, out_cols = cols.end - cols.begin;
  Tensor out(DType::F32, full_shape.size() == 2 ? Shape{out_rows, out_cols} : Shape{out_rows});
  float* dst = out.f32();
  for (int64_t r = 0; r < out_rows; ++r)
    for (int64_t c = 0; c < out_cols; ++c) {
      const uint64_t index = static_cast<uint64_t>((rows.begin + r) * num_cols + cols.begin + c);
      dst[r * out_cols + c] = recipe.offset + recipe.amplitude * uniform_pm1(recipe.seed, index);
    }
  return out;
}

}  // namespace moeserve
