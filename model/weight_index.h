// Where each stored matrix of a rank's weights lies in its backend memory, and how to assemble
// another plan's shard from what the ranks already hold (a re-plan from resident weights).
//
// Every weight the loader places is a rectangle of a stored matrix: a dense tensor (rows x
// columns in the backend's dtype), or the values or scales of a packed one (int4: [n, k/8]
// 32-bit words and [n, k/group] bf16 scales; fp8: [n, k] bytes and the [ceil(n/bn),
// ceil(k/bk)] fp32 scale grid), each row-major in its buffer. The index records them by
// (matrix, rows, column bytes), so one code path moves dense and packed weights alike: a
// quantized weight moves packed, with its scales.
//
// A move plan covers one destination rectangle with pieces of the old ranks' rectangles (the
// destination rank's own first, then the lowest rank): a list of 2-D copies (source rank and
// bytes, destination rank and bytes), executed by a WeightMover (ranks of one process: the backend's
// copy, memcpy or a 2-D cudaMemcpy from the same GPU or a peer; across hosts: not implemented).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops/ops.h"
#include "parallel/plan.h"

namespace moeserve {

// A rectangle of stored matrix `matrix`: rows `rows`, bytes `col_bytes` of each row (the
// full matrix's row is `row_bytes` long), starting at `data` with rows col_bytes.size() apart.
struct Placement {
  std::string matrix;  // "<tensor name>", or "<module>.values" / "<module>.scales" when packed
  parallel::Range rows, col_bytes;
  int64_t row_bytes = 0;  // of the full matrix: tells a bf16 copy from an fp32 one of the same tensor
  std::byte* data = nullptr;
  int rank = 0;
  ops::Buffer* buffer = nullptr;  // the backend buffer `data` lies in (a re-plan may view it instead of copying)
};

// Every rectangle one rank holds.
class WeightIndex {
 public:
  void add(Placement p);
  // The rank's rectangles of `matrix` (empty when it holds none).
  const std::vector<Placement>& of(const std::string& matrix) const;
  int64_t count() const { return count_; }
  const std::unordered_map<std::string, std::vector<Placement>>& matrices() const { return by_matrix_; }

 private:
  std::unordered_map<std::string, std::vector<Placement>> by_matrix_;
  int64_t count_ = 0;
};

// One 2-D copy: `rows` rows of `row_bytes` bytes, `src_pitch` / `dst_pitch` apart.
struct WeightMove {
  int src_rank = 0, dst_rank = 0;
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  int64_t rows = 0, row_bytes = 0, src_pitch = 0, dst_pitch = 0;
  int64_t bytes() const { return rows * row_bytes; }
};

// The copies that fill `dst` from the old ranks' indexes (indexed by old rank). Throws, naming
// the matrix and the rows and bytes no old rank holds, when they do not cover it.
std::vector<WeightMove> plan_moves(const Placement& dst, const std::vector<const WeightIndex*>& old_ranks);

// Executes moves.
class WeightMover {
 public:
  virtual ~WeightMover() = default;
  virtual void copy(const WeightMove& move) = 0;
};
// Ranks of one process: the destination rank's backend copies (CPU ranks: memcpy; GPUs: a
// 2-D copy through unified addressing, from the same GPU or a peer).
class BackendMover final : public WeightMover {
 public:
  explicit BackendMover(ops::Backend& backend) : backend_(backend) {}
  void copy(const WeightMove& move) override;

 private:
  ops::Backend& backend_;
};

// What a re-plan from resident weights moved onto one rank.
struct ReshardStats {
  int64_t moves = 0;
  int64_t local_bytes = 0;  // from the same rank's old shard
  int64_t peer_bytes = 0;   // from another rank's
  int64_t views = 0;        // buffers that view an old shard's bytes instead of copying them
  int64_t viewed_bytes = 0;
  int64_t reused_cache_bytes = 0;  // KV cache buffers taken over from the old engine
};

}  // namespace moeserve
