// A weight source that reads nothing: every rectangle the loader places is copied from the
// shards an engine's ranks already hold (model/weight_index.h), so that a re-plan assembles the
// new plan's shards from resident weights, never from the checkpoint. Synthetic and checkpoint
// weights alike: the copies are the bytes a fresh load under the new plan would write.
//
// Nothing that can be shared is copied (CPU ranks: between any two; GPUs: on the same GPU):
// a new buffer whose bytes an old buffer holds contiguously, in the same order, becomes a view
// of it (a whole expert moving between ranks, a head slice of a replicated projection), and
// the old engine's KV cache buffers of the right size are taken over instead of allocated
// and zeroed again (their stale pages are as harmless as a freed page's: every sequence
// writes its slots before attention reads them).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/weight_index.h"
#include "model/weight_source.h"
#include "ops/ops.h"

namespace moeserve {

// Buffers an old engine gave up (its KV caches), taken by size by the new one's ranks.
class SpareBuffers {
 public:
  void give(ops::BufferPtr buffer);
  // A spare of exactly `nbytes` that `backend` can use (its alias: the same GPU), or null.
  ops::BufferPtr take(ops::Backend& backend, size_t nbytes);

 private:
  std::mutex mutex_;
  std::vector<ops::BufferPtr> spare_;
};

struct ResidentWeights {
  std::vector<const WeightIndex*> ranks;  // by old rank; they must outlive the load
  WeightMover* mover = nullptr;           // the new rank's
  std::string describe;                   // what the old ranks hold (their model and plan), for errors
  bool one_address_space = false;         // every old rank's buffer can be viewed from every new rank
  std::shared_ptr<SpareBuffers> spare;    // the old engine's KV caches, or null
};

// A rectangle the loader is about to place at byte `offset` of a new buffer.
struct PlannedPlacement {
  Placement where;  // data and buffer unset
  int64_t offset = 0;
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
  // A view (backend.alias) of the one old buffer that holds every piece of a new `bytes`-byte
  // buffer at its offset; on success each piece's data and buffer point into the view. Null
  // when no old buffer does, or the backend cannot alias: the caller allocates and copies.
  ops::BufferPtr view(ops::Backend& backend, int64_t bytes, std::vector<PlannedPlacement>& pieces);
  // A KV cache buffer of `nbytes` the old engine gave up that `backend` can use, or null
  // (allocate one).
  ops::BufferPtr take_spare(ops::Backend& backend, size_t nbytes);
  const ReshardStats& stats() const { return stats_; }

 private:
  // The old rectangle of dst's matrix that holds dst's rows whole with exactly its columns
  // (dst's bytes contiguous in it), at address `at` when given; null when none.
  const Placement* holder_of(const Placement& dst, const std::byte* at) const;

  ResidentWeights resident_;
  ReshardStats stats_;
};

}  // namespace moeserve
