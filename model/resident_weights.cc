#include "model/resident_weights.h"

#include "core/error.h"

namespace moeserve {

Tensor ResidentWeightSource::read(const std::string& name, const Shape&, Slice, Slice) {
  fail("re-plan from resident weights: tensor '{}' was asked for as a read, not a copy ({})", name, describe());
}

PackedWeight ResidentWeightSource::read_packed(const PackedSlice& s) {
  fail("re-plan from resident weights: packed tensor '{}' was asked for as a read, not a copy ({})", s.module,
       describe());
}

void ResidentWeightSource::assemble(const Placement& dst) {
  MS_CHECK(resident_.mover != nullptr, "re-plan from resident weights: no mover ({})", describe());
  record(dst.matrix);
  for (const WeightMove& m : plan_moves(dst, resident_.ranks)) {
    resident_.mover->copy(m);
    ++stats_.moves;
    (m.src_rank == m.dst_rank ? stats_.local_bytes : stats_.peer_bytes) += m.bytes();
  }
}

}  // namespace moeserve
