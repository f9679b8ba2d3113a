#include "model/weight_index.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve {
namespace {

using parallel::Range;

struct Rect {
  Range rows, cols;  // cols in bytes
  bool empty() const { return rows.size() <= 0 || cols.size() <= 0; }
};

Range intersect(Range a, Range b) { return {std::max(a.begin, b.begin), std::min(a.end, b.end)}; }

// r minus its part `cut` (cut inside r): up to four rectangles (above, below, left, right).
void subtract(const Rect& r, const Rect& cut, std::vector<Rect>& out) {
  const Rect pieces[] = {{{r.rows.begin, cut.rows.begin}, r.cols},
                         {{cut.rows.end, r.rows.end}, r.cols},
                         {cut.rows, {r.cols.begin, cut.cols.begin}},
                         {cut.rows, {cut.cols.end, r.cols.end}}};
  for (const Rect& p : pieces)
    if (!p.empty()) out.push_back(p);
}

// The copy of `piece` (inside both src and dst) from src to dst.
WeightMove move_of(const Placement& src, const Placement& dst, const Rect& piece) {
  auto at = [](const Placement& p, const Rect& r) {
    return p.data + (r.rows.begin - p.rows.begin) * p.col_bytes.size() + (r.cols.begin - p.col_bytes.begin);
  };
  return {.src_rank = src.rank,
          .dst_rank = dst.rank,
          .src = at(src, piece),
          .dst = at(dst, piece),
          .rows = piece.rows.size(),
          .row_bytes = piece.cols.size(),
          .src_pitch = src.col_bytes.size(),
          .dst_pitch = dst.col_bytes.size()};
}

// The old rectangles of dst's matrix, the destination rank's own first (a local copy), then
// by rank.
std::vector<const Placement*> sources_of(const Placement& dst, const std::vector<const WeightIndex*>& old_ranks) {
  std::vector<const Placement*> out;
  for (const WeightIndex* index : old_ranks)
    for (const Placement& p : index->of(dst.matrix)) {
      MS_CHECK(p.row_bytes == dst.row_bytes,
               "re-plan from resident weights: tensor '{}' is held with {}-byte rows on rank {} but the new plan "
               "stores {}-byte rows (another dtype or backend)",
               dst.matrix, p.row_bytes, p.rank, dst.row_bytes);
      out.push_back(&p);
    }
  std::stable_sort(out.begin(), out.end(), [&](const Placement* a, const Placement* b) {
    return (a->rank != dst.rank) < (b->rank != dst.rank);
  });
  return out;
}

}  // namespace

void WeightIndex::add(Placement p) {
  by_matrix_[p.matrix].push_back(std::move(p));
  ++count_;
}

const std::vector<Placement>& WeightIndex::of(const std::string& matrix) const {
  static const std::vector<Placement> none;
  auto it = by_matrix_.find(matrix);
  return it == by_matrix_.end() ? none : it->second;
}

std::vector<WeightMove> plan_moves(const Placement& dst, const std::vector<const WeightIndex*>& old_ranks) {
  std::vector<Rect> remaining = {{dst.rows, dst.col_bytes}};
  std::vector<WeightMove> moves;
  for (const Placement* src : sources_of(dst, old_ranks)) {
    std::vector<Rect> next;
    for (const Rect& r : remaining) {
      const Rect piece{intersect(r.rows, src->rows), intersect(r.cols, src->col_bytes)};
      if (piece.empty()) {
        next.push_back(r);
        continue;
      }
      moves.push_back(move_of(*src, dst, piece));
      subtract(r, piece, next);
    }
    remaining = std::move(next);
    if (remaining.empty()) return moves;
  }
  if (remaining.empty()) return moves;  // an empty destination
  const Rect& r = remaining.front();
  fail("re-plan from resident weights: no rank holds rows [{}, {}) bytes [{}, {}) of tensor '{}' (rank {} needs them)",
       r.rows.begin, r.rows.end, r.cols.begin, r.cols.end, dst.matrix, dst.rank);
}

void BackendMover::copy(const WeightMove& m) {
  backend_.copy_rows({.dst = m.dst,
                      .src = m.src,
                      .rows = static_cast<size_t>(m.rows),
                      .row_bytes = static_cast<size_t>(m.row_bytes),
                      .src_pitch = static_cast<size_t>(m.src_pitch),
                      .dst_pitch = static_cast<size_t>(m.dst_pitch)});
}

}  // namespace moeserve
