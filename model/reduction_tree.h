// The sums a split computes across parts and ranks (ModelRunOptions::reduction_plan): partial
// branches added in one fixed pairwise tree, so that every plan nesting in the reduction plan
// computes the same bits. check_reduction_plan (model/deepseek_v3.h) is defined here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/communicator.h"
#include "model/workspace.h"
#include "ops/ops.h"

namespace moeserve {

// buffer[0, count) summed over `group` (a no-op without one or with one member); `site`
// labels the all-reduce.
void all_reduce(comm::Communicator* group, ops::Buffer& buffer, int64_t count, const char* site, DType dtype);

// parts[0] = the pairwise tree sum of parts [n, count] fp32: ((p0 + p1) + (p2 + p3)) + ...
// (n a power of two). A rank holding parts [r * n, (r + 1) * n) of a larger tree computes
// that tree's subtree, so the ranks' results added in the same tree give the whole tree.
void tree_sum(ops::Backend& backend, std::byte* parts, int n, int64_t count);

// A branch's sum: its partials over `parts` on this rank, then over `group` (`site` labels
// the collective).
struct BranchTree {
  comm::Communicator* group;
  const char* site;
  int parts;
  int64_t hidden;
};
// With a reduction plan: the rank's partials a.branch_parts [parts, T, hidden] fp32 added in
// the tree (into part 0, a.branch), then the ranks' results in the same tree; returns the
// branch sum [T, hidden] fp32.
const void* sum_in_tree(ops::Backend& backend, const BranchTree& tree, Activations& a);

}  // namespace moeserve
