#include "model/resident_weights.h"

#include <cstdint>

#include "core/error.h"

namespace moeserve {

void SpareBuffers::give(ops::BufferPtr buffer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (buffer) spare_.push_back(std::move(buffer));
}

ops::BufferPtr SpareBuffers::take(ops::Backend& backend, size_t nbytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if ((*it)->nbytes() != nbytes) continue;
    ops::BufferPtr out = backend.alias(**it, 0, nbytes);  // the spare's bytes, kept alive by the view
    if (!out) continue;
    spare_.erase(it);
    return out;
  }
  return nullptr;
}

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

const Placement* ResidentWeightSource::holder_of(const Placement& dst, const std::byte* at) const {
  for (const WeightIndex* index : resident_.ranks)
    for (const Placement& p : index->of(dst.matrix)) {
      if (p.buffer == nullptr || p.row_bytes != dst.row_bytes || !(p.col_bytes == dst.col_bytes)) continue;
      if (!resident_.one_address_space && p.rank != dst.rank) continue;
      if (p.rows.begin > dst.rows.begin || p.rows.end < dst.rows.end) continue;
      const std::byte* start = p.data + (dst.rows.begin - p.rows.begin) * p.col_bytes.size();
      if (at == nullptr || start == at) return &p;
    }
  return nullptr;
}

ops::BufferPtr ResidentWeightSource::view(ops::Backend& backend, int64_t bytes, std::vector<PlannedPlacement>& pieces) {
  if (pieces.empty()) return nullptr;
  const Placement* first = holder_of(pieces[0].where, nullptr);
  if (first == nullptr) return nullptr;
  // Where the new buffer would begin inside the old one, as byte offsets of the old buffer.
  const auto old_begin = reinterpret_cast<uintptr_t>(first->buffer->data());
  const auto piece0 =
      reinterpret_cast<uintptr_t>(first->data) +
      static_cast<uintptr_t>((pieces[0].where.rows.begin - first->rows.begin) * first->col_bytes.size());
  if (piece0 < old_begin + static_cast<uintptr_t>(pieces[0].offset)) return nullptr;
  const uintptr_t offset = piece0 - static_cast<uintptr_t>(pieces[0].offset) - old_begin;
  if (offset + static_cast<uintptr_t>(bytes) > first->buffer->nbytes()) return nullptr;
  const std::byte* base = static_cast<const std::byte*>(first->buffer->data()) + offset;
  for (size_t i = 1; i < pieces.size(); ++i) {
    const Placement* h = holder_of(pieces[i].where, base + pieces[i].offset);
    if (h == nullptr || h->buffer != first->buffer) return nullptr;
  }
  ops::BufferPtr out = backend.alias(*first->buffer, static_cast<size_t>(offset), static_cast<size_t>(bytes));
  if (!out) return nullptr;
  for (PlannedPlacement& piece : pieces) {
    record(piece.where.matrix);
    piece.where.data = static_cast<std::byte*>(out->data()) + piece.offset;
    piece.where.buffer = out.get();
  }
  ++stats_.views;
  stats_.viewed_bytes += bytes;
  return out;
}

ops::BufferPtr ResidentWeightSource::take_spare(ops::Backend& backend, size_t nbytes) {
  if (!resident_.spare) return nullptr;
  ops::BufferPtr out = resident_.spare->take(backend, nbytes);
  if (out) stats_.reused_cache_bytes += static_cast<int64_t>(nbytes);
  return out;
}

}  // namespace moeserve
