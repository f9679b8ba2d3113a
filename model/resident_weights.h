// A weight source that reads nothing: every rectangle the loader places is copied from the
// shards an engine's ranks already hold (model/weight_index.h), so that a re-plan assembles the
// new plan's shards from resident weights, never from the checkpoint. Synthetic and checkpoint
// weights alike: the copies are the bytes a fresh load under the new plan would write.
#pragma once

#include <string>
#include <vector>

#include "model/weight_index.h"
#include "model/weight_source.h"

namespace moeserve {

struct ResidentWeights {
  std::vector<const WeightIndex*> ranks;  // by old rank; they must outlive the load
  WeightMover* mover = nullptr;
  std::string describe;  // what the old ranks hold (their model and plan), for errors
};

class ResidentWeightSource final : public WeightSource {
 public:
  explicit ResidentWeightSource(ResidentWeights resident) : resident_(std::move(resident)) {}
  // The loader copies instead (assemble); a read means a tensor the index does not describe.
  Tensor read(const std::string& name, const Shape& full_shape, Slice rows, Slice cols) override;
  PackedWeight read_packed(const PackedSlice& s) override;
  std::string describe() const override { return "resident weights of " + resident_.describe; }
  ResidentWeightSource* resident() override { return this; }

  // Fills `dst` from the old ranks' rectangles (plan_moves, then the mover).
  void assemble(const Placement& dst);
  const ReshardStats& stats() const { return stats_; }

 private:
  ResidentWeights resident_;
  ReshardStats stats_;
};

}  // namespace moeserve
