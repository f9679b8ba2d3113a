// The rank layout: literal tables for a few plans, and an exhaustive check of rank_coord,
// rank_of and shard_of for every rank of every preset at 1, 2, 4 and 8 ranks.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "parallel/plan.h"
#include "parallel/plan_parse.h"

namespace moeserve::parallel {
namespace {

// synthetic:tiny: 8 layers, 8 heads, vocab 512, dense 128, shared 32, 16 experts of 32.
ShardDims tiny_dims() { return {8, 8, 512, 128, 32, 16, 32}; }

struct CoordRow {
  int rank, stage, dp, tp, moe, ep, moe_tp;
};

void expect_table(const std::string& name, const std::vector<CoordRow>& table) {
  const ParallelPlan plan = parse_plan(name);
  ASSERT_EQ(plan.world(), static_cast<int>(table.size())) << name;
  for (const CoordRow& row : table) {
    const RankCoord c = rank_coord(plan, row.rank);
    SCOPED_TRACE(name + " rank " + std::to_string(row.rank));
    EXPECT_EQ(c.stage, row.stage);
    EXPECT_EQ(c.dp_index, row.dp);
    EXPECT_EQ(c.tp_index, row.tp);
    EXPECT_EQ(c.moe_index, row.moe);
    EXPECT_EQ(c.ep_index, row.ep);
    EXPECT_EQ(c.moe_tp_index, row.moe_tp);
  }
}

TEST(RankLayout, Tp2Pp4Table) {
  expect_table("tp2pp4", {{0, 0, 0, 0, 0, 0, 0},
                          {1, 0, 0, 1, 1, 0, 1},
                          {2, 1, 0, 0, 0, 0, 0},
                          {3, 1, 0, 1, 1, 0, 1},
                          {4, 2, 0, 0, 0, 0, 0},
                          {5, 2, 0, 1, 1, 0, 1},
                          {6, 3, 0, 0, 0, 0, 0},
                          {7, 3, 0, 1, 1, 0, 1}});
}

TEST(RankLayout, Ep4Tp2Table) {
  expect_table("ep4tp2", {{0, 0, 0, 0, 0, 0, 0},
                          {1, 0, 0, 1, 1, 0, 1},
                          {2, 0, 0, 2, 2, 1, 0},
                          {3, 0, 0, 3, 3, 1, 1},
                          {4, 0, 0, 4, 4, 2, 0},
                          {5, 0, 0, 5, 5, 2, 1},
                          {6, 0, 0, 6, 6, 3, 0},
                          {7, 0, 0, 7, 7, 3, 1}});
}

TEST(RankLayout, Ep8DpTable) {
  std::vector<CoordRow> table;
  for (int r = 0; r < 8; ++r) table.push_back({r, 0, r, 0, r, r, 0});
  expect_table("ep8-dp", table);
}

TEST(RankLayout, Ep2Pp2Table) {
  expect_table("ep2pp2", {{0, 0, 0, 0, 0, 0, 0}, {1, 0, 0, 1, 1, 1, 0}, {2, 1, 0, 0, 0, 0, 0}, {3, 1, 0, 1, 1, 1, 0}});
}

TEST(RankLayout, Ep2Tp2PpDpTable) {
  // ep2tp2pp2-dp: 4 attention replicas per stage, MoE 2 groups x 2 TP.
  expect_table("ep2tp2pp2-dp", {{0, 0, 0, 0, 0, 0, 0},
                                {1, 0, 1, 0, 1, 0, 1},
                                {2, 0, 2, 0, 2, 1, 0},
                                {3, 0, 3, 0, 3, 1, 1},
                                {4, 1, 0, 0, 0, 0, 0},
                                {5, 1, 1, 0, 1, 0, 1},
                                {6, 1, 2, 0, 2, 1, 0},
                                {7, 1, 3, 0, 3, 1, 1}});
}

TEST(RankLayout, ShardTable) {
  // tp2pp4 rank 5: stage 2 (layers 4-5), second TP half of heads, vocab, dense and shared
  // columns; MoE TP 2: every expert, second half of each expert's columns.
  RankShard s = shard_of(parse_plan("tp2pp4"), tiny_dims(), 5);
  EXPECT_EQ(s.layers, (Range{4, 6}));
  EXPECT_EQ(s.heads, (Range{4, 8}));
  EXPECT_EQ(s.vocab, (Range{256, 512}));
  EXPECT_EQ(s.dense_intermediate, (Range{64, 128}));
  EXPECT_EQ(s.shared_intermediate, (Range{16, 32}));
  EXPECT_EQ(s.experts, (Range{0, 16}));
  EXPECT_EQ(s.expert_intermediate, (Range{16, 32}));
  EXPECT_FALSE(s.first_stage);
  EXPECT_FALSE(s.last_stage);
  // ep4tp2 rank 3: attention TP 8 (head 3), EP group 1 (experts 4-7), MoE-TP half 1.
  s = shard_of(parse_plan("ep4tp2"), tiny_dims(), 3);
  EXPECT_EQ(s.layers, (Range{0, 8}));
  EXPECT_EQ(s.heads, (Range{3, 4}));
  EXPECT_EQ(s.vocab, (Range{192, 256}));
  EXPECT_EQ(s.experts, (Range{4, 8}));
  EXPECT_EQ(s.expert_intermediate, (Range{16, 32}));
  EXPECT_TRUE(s.first_stage && s.last_stage);
  // ep8-dp rank 6: attention replicated (all heads, whole vocab), experts 12-13 whole.
  s = shard_of(parse_plan("ep8-dp"), tiny_dims(), 6);
  EXPECT_EQ(s.heads, (Range{0, 8}));
  EXPECT_EQ(s.vocab, (Range{0, 512}));
  EXPECT_EQ(s.shared_intermediate, (Range{0, 32}));
  EXPECT_EQ(s.experts, (Range{12, 14}));
  EXPECT_EQ(s.expert_intermediate, (Range{0, 32}));
  // pp8 rank 7: the last layer, everything else whole.
  s = shard_of(parse_plan("pp8"), tiny_dims(), 7);
  EXPECT_EQ(s.layers, (Range{7, 8}));
  EXPECT_TRUE(s.last_stage);
  EXPECT_FALSE(s.first_stage);
}

TEST(RankLayout, SplitRangeUneven) {
  EXPECT_EQ(split_range(10, 4, 0), (Range{0, 3}));
  EXPECT_EQ(split_range(10, 4, 1), (Range{3, 6}));
  EXPECT_EQ(split_range(10, 4, 2), (Range{6, 8}));
  EXPECT_EQ(split_range(10, 4, 3), (Range{8, 10}));
  EXPECT_EQ(split_range(3, 4, 3), (Range{3, 3}));
}

TEST(RankLayout, PresetNamesCoverTheAcceptanceList) {
  const auto names = preset_names(8);
  const std::set<std::string> have(names.begin(), names.end());
  EXPECT_EQ(have.size(), names.size());
  for (const char* required : {"single", "tp2", "tp4", "tp8", "pp2", "pp4", "pp8", "ep2", "ep4", "ep8", "ep4-dp",
                               "ep8-dp", "ep4tp2", "tp2pp4", "ep2pp2"})
    EXPECT_TRUE(have.count(required)) << required;
  for (const auto& n : names) EXPECT_LE(parse_plan(n).world(), 8) << n;
}

// Every rank of every preset at 1-8 ranks: rank_of inverts rank_coord, coordinates are in
// range and enumerate each stage's ranks dp-major, tp-minor; shards tile every dimension.
TEST(RankLayout, EveryRankOfEveryPreset) {
  const ShardDims dims = tiny_dims();
  int plans_checked = 0;
  for (const std::string& name : preset_names(8)) {
    const ParallelPlan plan = parse_plan(name);
    ++plans_checked;
    std::set<std::tuple<int, int, int>> seen;
    std::vector<int> layer_owners(dims.layers, 0), expert_col_owners(dims.experts * dims.expert_intermediate, 0);
    std::vector<int> head_owners(dims.heads, 0);
    for (int r = 0; r < plan.world(); ++r) {
      const RankCoord c = rank_coord(plan, r);
      SCOPED_TRACE(name + " rank " + std::to_string(r));
      EXPECT_EQ(c.rank, r);
      EXPECT_EQ(rank_of(plan, c.stage, c.dp_index, c.tp_index), r);
      EXPECT_TRUE(0 <= c.stage && c.stage < plan.pp);
      EXPECT_TRUE(0 <= c.dp_index && c.dp_index < plan.attn_dp);
      EXPECT_TRUE(0 <= c.tp_index && c.tp_index < plan.attn_tp);
      EXPECT_EQ(c.moe_index, c.dp_index * plan.attn_tp + c.tp_index);
      EXPECT_EQ(c.ep_index * plan.moe_tp + c.moe_tp_index, c.moe_index);
      EXPECT_TRUE(0 <= c.ep_index && c.ep_index < plan.moe_ep);
      EXPECT_TRUE(seen.insert({c.stage, c.dp_index, c.tp_index}).second);

      const RankShard s = shard_of(plan, dims, r);
      EXPECT_EQ(s.coord.rank, r);
      EXPECT_EQ(s.vocab.size() * plan.attn_tp, dims.vocab);
      EXPECT_EQ(s.experts.size() * plan.moe_ep, dims.experts);
      EXPECT_EQ(s.first_stage, c.stage == 0);
      EXPECT_EQ(s.last_stage, c.stage == plan.pp - 1);
      if (c.dp_index == 0 && c.tp_index == 0)
        for (int64_t l = s.layers.begin; l < s.layers.end; ++l) ++layer_owners[l];
      if (c.stage == 0 && c.dp_index == 0)
        for (int64_t h = s.heads.begin; h < s.heads.end; ++h) ++head_owners[h];
      if (c.stage == 0)
        for (int64_t e = s.experts.begin; e < s.experts.end; ++e)
          for (int64_t col = s.expert_intermediate.begin; col < s.expert_intermediate.end; ++col)
            ++expert_col_owners[e * dims.expert_intermediate + col];
    }
    EXPECT_EQ(static_cast<int>(seen.size()), plan.world()) << name;
    // Each layer belongs to one stage, each head to one TP rank of a replica, each expert
    // column to one rank of a stage.
    for (int n : layer_owners) EXPECT_EQ(n, 1) << name;
    for (int n : head_owners) EXPECT_EQ(n, 1) << name;
    for (int n : expert_col_owners) EXPECT_EQ(n, 1) << name;
  }
  EXPECT_EQ(plans_checked, 30);  // 19 tp/ep/pp shapes + 10 of them with -dp + single
}

}  // namespace
}  // namespace moeserve::parallel
