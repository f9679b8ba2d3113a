// Where weights come from: a safetensors checkpoint, or a seeded synthetic generator. Both
// hand out fp32 slices of named tensors, so a rank reads only the rows/columns it owns.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "core/tensor.h"
#include "model/config.h"
#include "model/packed_weights.h"
#include "model/safetensors.h"

namespace moeserve {

class ResidentWeightSource;  // model/resident_weights.h

// How a synthetic tensor is generated: element (r, c) of the full tensor is
// offset + amplitude * uniform_pm1(seed, r * cols + c).
struct SyntheticRecipe {
  uint64_t seed = 0;
  float offset = 0.0f;
  float amplitude = 0.0f;
};

// How a synthetic packed weight is generated where it lives: its values are random words
// (ops::FillRandomWordsParams: word i of the full tensor is random_word(value_seed, i) &
// value_mask), its scales follow `scales` over the full scale grid (int4 [N, K/group], fp8
// [ceil(N/bn), ceil(K/bk)]).
struct SyntheticPackedRecipe {
  uint64_t value_seed = 0;
  uint32_t value_mask = 0xffffffffu;
  SyntheticRecipe scales;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Reads rows x cols of `name` whose full shape must be `full_shape` (1-D: rows only).
  virtual Tensor read(const std::string& name, const Shape& full_shape, Slice rows = Slice::all(),
                      Slice cols = Slice::all()) = 0;
  // Reads a slice of the quantized linear `s.module`, packed (model/packed_weights.h).
  virtual PackedWeight read_packed(const PackedSlice& s) = 0;
  virtual std::string describe() const = 0;
  // Synthetic sources describe their tensors instead of materialising them, so that a
  // backend can generate the weights where they live (ops::FillUniformParams). Records
  // the tensor as touched, like read().
  virtual bool synthetic_recipe(const std::string& name, const Shape& full_shape, SyntheticRecipe* recipe) {
    return false;
  }
  // The same for a packed weight of full shape [n, k].
  virtual bool synthetic_packed_recipe(const std::string& module, int64_t n, int64_t k, const ops::QuantLayout& layout,
                                       SyntheticPackedRecipe* recipe) {
    return false;
  }

  // Non-null when every weight is copied from resident shards instead (a re-plan).
  virtual ResidentWeightSource* resident() { return nullptr; }

  // Every tensor name read so far (tests prove a rank touched only what it owns).
  std::set<std::string> touched() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return touched_;
  }

 protected:
  void record(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    touched_.insert(name);
  }

 private:
  mutable std::mutex mutex_;
  std::set<std::string> touched_;
};

// Weights from a checkpoint directory (shared by several ranks: reads are thread-safe).
class CheckpointWeightSource final : public WeightSource {
 public:
  explicit CheckpointWeightSource(std::shared_ptr<const Checkpoint> checkpoint) : checkpoint_(std::move(checkpoint)) {}
  Tensor read(const std::string& name, const Shape& full_shape, Slice rows, Slice cols) override;
  PackedWeight read_packed(const PackedSlice& s) override;
  std::string describe() const override { return checkpoint_->directory(); }

 private:
  std::shared_ptr<const Checkpoint> checkpoint_;
};

// Deterministic synthetic weights: element i of tensor `name` is a pure function of
// (seed, name, i), scaled so that activations stay O(1) through many layers.
class SyntheticWeightSource final : public WeightSource {
 public:
  SyntheticWeightSource(ModelConfig config, uint64_t seed) : config_(std::move(config)), seed_(seed) {}
  Tensor read(const std::string& name, const Shape& full_shape, Slice rows, Slice cols) override;
  PackedWeight read_packed(const PackedSlice& s) override;  // throws: packed weights are generated in place
  std::string describe() const override;
  bool synthetic_recipe(const std::string& name, const Shape& full_shape, SyntheticRecipe* recipe) override;
  bool synthetic_packed_recipe(const std::string& module, int64_t n, int64_t k, const ops::QuantLayout& layout,
                               SyntheticPackedRecipe* recipe) override;

 private:
  SyntheticRecipe recipe_of(const std::string& name, const Shape& full_shape) const;
  ModelConfig config_;
  uint64_t seed_;
};

}  // namespace moeserve
