// Sharded loading: under every preset, each rank reads exactly the tensors and slices it
// owns. A recording weight source logs every read (name, rows, cols); the checks below derive
// what a rank may read from its RankShard alone, independently of the loader.
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "model/deepseek_v3_weights.h"
#include "parallel/plan_parse.h"
#include "tests/runtime/rank_model.h"

namespace moeserve {
namespace {

struct Read {
  std::string name;
  Shape full_shape;
  Slice rows, cols;
};

class RecordingSource final : public WeightSource {
 public:
  explicit RecordingSource(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)) {}
  Tensor read(const std::string& name, const Shape& full_shape, Slice rows, Slice cols) override {
    record(name);
    reads.push_back({name, full_shape, rows, cols});
    return inner_->read(name, full_shape, rows, cols);
  }
  PackedWeight read_packed(const PackedSlice& s) override { return inner_->read_packed(s); }
  std::string describe() const override { return inner_->describe(); }
  std::vector<Read> reads;

 private:
  std::unique_ptr<WeightSource> inner_;
};

int64_t resolved_end(Slice s, int64_t full) { return s.end < 0 ? full : s.end; }

// Checks one read of `rank` against its shard.
void check_read(const ModelConfig& c, const parallel::RankShard& s, const Read& read) {
  SCOPED_TRACE(read.name);
  const int64_t rows_begin = read.rows.begin, rows_end = resolved_end(read.rows, read.full_shape[0]);
  const int64_t cols_begin = read.cols.begin;
  const int64_t cols_end = read.full_shape.size() == 2 ? resolved_end(read.cols, read.full_shape[1]) : 1;
  auto expect_rows = [&](int64_t begin, int64_t end) {
    EXPECT_EQ(rows_begin, begin);
    EXPECT_EQ(rows_end, end);
  };
  auto expect_whole_cols = [&] {
    EXPECT_EQ(cols_begin, 0);
    EXPECT_EQ(cols_end, read.full_shape.size() == 2 ? read.full_shape[1] : 1);
  };
  static const std::regex layer_re(R"(model\.layers\.(\d+)\.(.*))");
  static const std::regex expert_re(R"(mlp\.experts\.(\d+)\.(\w+)_proj\.weight)");
  std::smatch m;
  if (read.name == "model.embed_tokens.weight") {
    EXPECT_TRUE(s.first_stage || (c.tie_word_embeddings && s.last_stage));
    expect_rows(s.vocab.begin, s.vocab.end);
    return;
  }
  if (read.name == "lm_head.weight") {
    EXPECT_TRUE(s.last_stage);
    expect_rows(s.vocab.begin, s.vocab.end);
    return;
  }
  if (read.name == "model.norm.weight") {
    EXPECT_TRUE(s.last_stage);
    return;
  }
  ASSERT_TRUE(std::regex_match(read.name, m, layer_re)) << "unexpected tensor";
  const int64_t layer = std::stoll(m[1]);
  const std::string rest = m[2];
  EXPECT_TRUE(s.layers.contains(layer)) << "layer " << layer << " outside the stage";
  const int64_t qk = c.qk_head_dim(), kvb = c.qk_nope_head_dim + c.v_head_dim;
  std::smatch e;
  if (std::regex_match(rest, e, expert_re)) {
    const int64_t expert = std::stoll(e[1]);
    EXPECT_TRUE(s.experts.contains(expert)) << "expert " << expert << " not owned";
    if (e[2] == "down") {
      expect_rows(0, c.hidden_size);
      EXPECT_EQ(cols_begin, s.expert_intermediate.begin);
      EXPECT_EQ(cols_end, s.expert_intermediate.end);
    } else {
      expect_rows(s.expert_intermediate.begin, s.expert_intermediate.end);
      expect_whole_cols();
    }
  } else if (rest == "self_attn.q_b_proj.weight" || rest == "self_attn.q_proj.weight") {
    expect_rows(s.heads.begin * qk, s.heads.end * qk);
    expect_whole_cols();
  } else if (rest == "self_attn.kv_b_proj.weight") {
    expect_rows(s.heads.begin * kvb, s.heads.end * kvb);
  } else if (rest == "self_attn.o_proj.weight") {
    EXPECT_EQ(cols_begin, s.heads.begin * c.v_head_dim);
    EXPECT_EQ(cols_end, s.heads.end * c.v_head_dim);
  } else if (rest.rfind("mlp.shared_experts.", 0) == 0 ||
             (rest.rfind("mlp.", 0) == 0 && rest.find("gate.") == std::string::npos)) {
    const parallel::Range cols =
        rest.rfind("mlp.shared_experts.", 0) == 0 ? s.shared_intermediate : s.dense_intermediate;
    if (rest.find("down_proj") != std::string::npos) {
      EXPECT_EQ(cols_begin, cols.begin);
      EXPECT_EQ(cols_end, cols.end);
    } else {
      expect_rows(cols.begin, cols.end);
    }
  } else {
    // Replicated within the stage: norms, q_a, kv_a (the MLA latent), router.
    expect_rows(0, read.full_shape[0]);
    expect_whole_cols();
  }
}

class ShardedLoading : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedLoading, EveryRankReadsOnlyWhatItOwns) {
  const ModelSource model = open_model("synthetic:tiny");
  const parallel::ParallelPlan plan = parallel::parse_plan(GetParam());
  std::vector<RecordingSource*> recorders;
  auto loaded = testing::load_plan(model, plan, [&](std::unique_ptr<WeightSource> inner) {
    auto r = std::make_unique<RecordingSource>(std::move(inner));
    recorders.push_back(r.get());
    return r;
  });
  std::map<std::string, int> expert_readers;  // expert weight tensor -> ranks that read it
  for (int r = 0; r < plan.world(); ++r) {
    SCOPED_TRACE(GetParam() + " rank " + std::to_string(r));
    const parallel::RankShard& shard = loaded.ranks[r].model->shard();
    for (const Read& read : recorders[r]->reads) {
      check_read(model.config, shard, read);
      if (read.name.find(".experts.") != std::string::npos) ++expert_readers[read.name];
    }
    // touched() names exactly the tensors of the rank's accounting (no more, no less).
    std::set<std::string> expected;
    for (const WeightSlice& w : weight_slices_of_rank(model.config, plan, r)) expected.insert(w.name);
    EXPECT_EQ(loaded.ranks[r].weights->touched(), expected);
  }
  // Every routed-expert tensor is read by exactly moe_tp ranks per stage (its column split).
  EXPECT_EQ(expert_readers.size(),
            static_cast<size_t>(model.config.num_moe_layers() * model.config.n_routed_experts * 3));
  for (const auto& [name, readers] : expert_readers) EXPECT_EQ(readers, plan.moe_tp) << name;
}

INSTANTIATE_TEST_SUITE_P(Presets, ShardedLoading,
                         ::testing::Values("single", "tp8", "pp8", "ep8", "ep8-dp", "ep4tp2", "tp2pp4", "ep2pp2",
                                           "ep2tp2-dp", "ep2tp2pp2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace moeserve
