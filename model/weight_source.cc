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

PackedWeight CheckpointWeightSource::read_packed(const PackedSlice& s) {
  record(s.module + (s.layout.quant == ops::WeightQuant::int4_group ? ".weight_packed" : ".weight"));
  return moeserve::read_packed(*checkpoint_, s);
}

PackedWeight SyntheticWeightSource::read_packed(const PackedSlice& s) {
  fail("synthetic tensor '{}': packed synthetic weights are generated where they live (synthetic_packed_recipe)",
       s.module);
}

bool SyntheticWeightSource::synthetic_packed_recipe(const std::string& module, int64_t n, int64_t k,
                                                    const ops::QuantLayout& layout, SyntheticPackedRecipe* recipe) {
  const std::string name = module + ".weight";
  record(name);
  // The bf16 recipe's uniform(-a, a) has variance a^2 / 3; packed values v of mean square
  // E[v^2] times scales near s have variance s^2 E[v^2], so s = a / sqrt(3 E[v^2]) keeps each
  // projection's output scale (the scales vary by +-25% around s).
  //   int4: v = nibble - 8, nibbles uniform in [0, 15]: E[v^2] = 344 / 16 = 21.5
  //   fp8:  the top exponent bit of every byte cleared (exponent 0..7, |v| <= 1.875, never NaN):
  //         E[v^2] = (1/8) * E[(1 + m/8)^2] * sum_{e=1..7} 4^(e-7) (subnormals negligible)
  const bool int4 = layout.quant == ops::WeightQuant::int4_group;
  const double mantissa_square = (1.0 + 2.0 * 3.5 / 8.0 + 17.5 / 64.0);
  double exponents = 0;
  for (int e = 1; e <= 7; ++e) exponents += std::pow(4.0, e - 7);
  const double mean_square = int4 ? 21.5 : mantissa_square * exponents / 8.0;
  const SyntheticRecipe dense = recipe_of(name, {n, k});
  const float s = static_cast<float>(dense.amplitude / std::sqrt(3.0 * mean_square));
  recipe->value_seed = splitmix64(dense.seed ^ 0x7061636bULL);  // "pack"
  recipe->value_mask = int4 ? 0xffffffffu : 0xbfbfbfbfu;
  recipe->scales = {.seed = splitmix64(dense.seed ^ 0x7363616cULL), .offset = s, .amplitude = 0.25f * s};  // "scal"
  return true;
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
