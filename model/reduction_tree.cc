#include "model/reduction_tree.h"

#include "core/error.h"
#include "model/deepseek_v3.h"
#include "model/deepseek_v3_weights.h"
#include "parallel/plan_parse.h"

namespace moeserve {
void all_reduce(comm::Communicator* group, ops::Buffer& buffer, int64_t count, const char* site, DType dtype) {
  if (group == nullptr || group->size() == 1) return;
  group->set_site(site);
  group->all_reduce_sum(buffer.data(), static_cast<size_t>(count), dtype);
}

void tree_sum(ops::Backend& backend, std::byte* parts, int n, int64_t count) {
  for (int step = 1; step < n; step *= 2)
    for (int i = 0; i + step < n; i += 2 * step) {
      ops::AddParams add{parts + i * count * 4, parts + (i + step) * count * 4, count};
      add.acc_f32 = true;
      backend.add(add);
    }
}

const void* sum_in_tree(ops::Backend& backend, const BranchTree& tree, Activations& a) {
  comm::Communicator* group = tree.group;
  const char* site = tree.site;
  const int64_t count = a.tokens * tree.hidden;
  if (tree.parts > 1) tree_sum(backend, bytes(a.branch_parts), tree.parts, count);
  const int ranks = group ? group->size() : 1;
  if (ranks <= 2) {  // two ranks: one fp32 addition, the same bits in either order
    all_reduce(group, *a.branch, count, site, DType::F32);
    return ptr(a.branch);
  }
  // A ring all-reduce adds in ring order: gather the ranks' sums and add them in the tree.
  group->set_site(site);
  group->all_gather(ptr(a.branch), ptr(a.branch_gather), static_cast<size_t>(count), DType::F32);
  tree_sum(backend, bytes(a.branch_gather), ranks, count);
  return ptr(a.branch_gather);
}

void check_reduction_plan(const ModelConfig& config, const parallel::ParallelPlan& plan, const ModelRunOptions& run) {
  const parallel::ParallelPlan& r = run.reduction_plan;
  const int ranks = r.world();
  MS_CHECK(r.pp == 1 && r.attn_dp == 1 && (ranks & (ranks - 1)) == 0,
           "--reduction-plan {}: name a plan of one stage, without attention DP, of a power-of-two number of ranks "
           "(tp8, ep8, ep4tp2, ...)",
           r.name);
  if (ranks == 1) return;
  MS_CHECK(plan.attn_dp == 1,
           "--reduction-plan {}: plan '{}' has attention DP {}: its routed tokens travel by all-to-all and their "
           "experts' outputs are summed in another order",
           r.name, plan.name, plan.attn_dp);
  MS_CHECK(ranks % plan.attn_tp == 0, "--reduction-plan {}: the {} ranks per stage of plan '{}' do not divide its {}",
           r.name, plan.attn_tp, plan.name, ranks);
  // Each rank must hold a contiguous run of the reduction plan's parts (expert group major,
  // column part minor): one expert group split further by columns, or whole groups.
  MS_CHECK(r.moe_ep % plan.moe_ep == 0 && r.moe_tp % plan.moe_tp == 0 && (plan.moe_ep == r.moe_ep || plan.moe_tp == 1),
           "--reduction-plan {}: plan '{}' splits the routed experts into {} expert group(s) x {} column part(s), "
           "which do not nest in its {} x {} (tp plans nest in a tp reduction plan, ep plans in an ep one, epAtpB "
           "in epAtpC)",
           r.name, plan.name, plan.moe_ep, plan.moe_tp, r.moe_ep, r.moe_tp);
  // Its parts must divide the model as its ranks would (heads, vocabulary, experts, columns).
  try {
    parallel::validate_plan(r, shard_dims(config));
  } catch (const Error& e) {
    fail("--reduction-plan {}: {}", r.name, e.what());
  }
}

}  // namespace moeserve
