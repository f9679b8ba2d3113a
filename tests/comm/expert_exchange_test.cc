// comm::ExpertExchange: the layout of a known routing (counts, sent rows, positions) without a
// communicator; and on in-process ranks with the CPU backend, random routing -> dispatch -> a
// per-expert function -> combine equals a plain single-process reference, bit for bit.
#include "comm/expert_exchange.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "comm/in_process.h"

namespace moeserve::comm {
namespace {

TEST(ExpertLayout, CountsRowsAndPositionsOfAKnownRouting) {
  // 4 ranks: expert groups {0, 1} on ranks 0-1 and {2, 3} on ranks 2-3, two column parts each.
  const ExpertPlacement placement{.ranks = 4, .moe_tp = 2, .experts_per_group = 2, .top_k = 2};
  const std::vector<int32_t> topk_ids = {0, 3, 2, 0, 1, 2};  // [3 tokens, top_k]
  const ExpertLayout layout = expert_layout(placement, topk_ids, /*row_begin=*/5);
  EXPECT_EQ(layout.tokens, 3);
  EXPECT_EQ(layout.send_expert_counts, (std::vector<int32_t>{2, 1, 2, 1, 2, 1, 2, 1}));
  EXPECT_EQ(layout.send_rows, (std::vector<size_t>{3, 3, 3, 3}));
  // Per destination, by expert, then token and k order; rows are offset by row_begin.
  EXPECT_EQ(layout.send_source_rows, (std::vector<int32_t>{5, 6, 7, 5, 6, 7, 6, 7, 5, 6, 7, 5}));
  // (i * top_k + k) * moe_tp + j -> sent row.
  EXPECT_EQ(layout.position, (std::vector<int64_t>{0, 3, 8, 11, 6, 9, 1, 4, 2, 5, 7, 10}));
}

TEST(ExpertLayout, NoTokensSendNothing) {
  const ExpertLayout layout = expert_layout({.ranks = 2, .moe_tp = 1, .experts_per_group = 3, .top_k = 2}, {}, 0);
  EXPECT_EQ(layout.tokens, 0);
  EXPECT_EQ(layout.send_expert_counts, (std::vector<int32_t>(6, 0)));
  EXPECT_EQ(layout.send_rows, (std::vector<size_t>{0, 0}));
  EXPECT_TRUE(layout.send_source_rows.empty());
}

struct World {
  int ranks, moe_tp, experts;
};

class ExpertExchangeWorlds : public ::testing::TestWithParam<World> {};

constexpr int64_t kHidden = 5, kTopK = 2, kMargin = 1;  // kMargin rows on each side are not routed

int64_t tokens_of(int rank) { return (rank * 3 + 2) % 5; }  // some ranks route nothing

// Column part j of expert e applied to a row: the parts sum to the expert's output.
float expert_part(int64_t e, int j, float x) {
  return x * static_cast<float>(e + 1) + 0.25f * static_cast<float>(j + 1);
}

struct RankInput {
  std::vector<float> x;        // [tokens + 2 * kMargin, hidden]
  std::vector<int32_t> ids;    // [tokens, top_k]
  std::vector<float> weights;  // [tokens, top_k]
};

RankInput input_of(int rank, int experts) {
  std::mt19937 rng(1234 + rank);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_int_distribution<int32_t> expert(0, experts - 1);
  const int64_t n = tokens_of(rank);
  RankInput in;
  for (int64_t i = 0; i < (n + 2 * kMargin) * kHidden; ++i) in.x.push_back(uniform(rng));
  for (int64_t i = 0; i < n * kTopK; ++i) {
    in.ids.push_back(expert(rng));
    in.weights.push_back(uniform(rng));
  }
  return in;
}

// The whole exchange on one rank; returns out [tokens + 2 * kMargin, hidden] fp32.
std::vector<float> exchange_on_rank(const World& w, int rank, Communicator& group, const RankInput& in) {
  std::unique_ptr<ops::Backend> backend = cpu::make_cpu_backend();
  const int64_t experts_per_group = w.experts / (w.ranks / w.moe_tp);
  ExpertExchange exchange(
      {.backend = *backend,
       .group = group,
       .placement = {.ranks = w.ranks, .moe_tp = w.moe_tp, .experts_per_group = experts_per_group, .top_k = kTopK},
       .local_expert_begin = rank / w.moe_tp * experts_per_group,
       .hidden = kHidden});
  const int64_t rows = tokens_of(rank) + 2 * kMargin;
  ops::BufferPtr x = backend->alloc(in.x.size() * 4), out = backend->alloc(rows * kHidden * 4);
  backend->upload(*x, 0, in.x.data(), in.x.size() * 4);
  ExpertExchange::Handle handle = exchange.layout(in.ids, kMargin);
  const ExpertExchange::Received received = exchange.dispatch(x->data(), handle);
  // CPU backend memory is host memory: the per-expert function runs in place.
  const auto* rx = static_cast<const float*>(received.x);
  auto* ry = static_cast<float*>(received.y);
  for (int64_t r = 0; r < received.rows; ++r) {
    EXPECT_EQ(received.weights[r], 1.0f);
    for (int64_t n = 0; n < kHidden; ++n)
      ry[r * kHidden + n] = expert_part(received.expert_ids[r], rank % w.moe_tp, rx[r * kHidden + n]);
  }
  exchange.combine(received.y, in.weights, handle, {.out = out->data(), .rows = rows, .out_f32 = true});
  std::vector<float> host(rows * kHidden);
  backend->download(host.data(), *out, 0, host.size() * 4);
  return host;
}

// out[t] = sum over k, then column part j, of weight[t, k] * part j of expert ids[t, k].
std::vector<float> reference(const World& w, int rank, const RankInput& in) {
  const int64_t n = tokens_of(rank);
  std::vector<float> out((n + 2 * kMargin) * kHidden, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < kTopK; ++k)
      for (int j = 0; j < w.moe_tp; ++j)
        for (int64_t c = 0; c < kHidden; ++c) {
          const int64_t t = kMargin + i;
          const float part = expert_part(in.ids[i * kTopK + k], j, in.x[t * kHidden + c]);
          out[t * kHidden + c] += in.weights[i * kTopK + k] * part;
        }
  return out;
}

TEST_P(ExpertExchangeWorlds, DispatchExpertsCombineEqualsSingleProcessReference) {
  const World w = GetParam();
  InProcessWorld world(w.ranks);
  std::vector<int> members(w.ranks);
  for (int r = 0; r < w.ranks; ++r) members[r] = r;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<RankInput> inputs;
  for (int r = 0; r < w.ranks; ++r) {
    comms.push_back(world.communicator(r, "moe", members));
    inputs.push_back(input_of(r, w.experts));
  }
  std::vector<std::vector<float>> results(w.ranks);
  std::vector<std::string> errors(w.ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < w.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        results[r] = exchange_on_rank(w, r, *comms[r], inputs[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        world.abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < w.ranks; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(results[r], reference(w, r, inputs[r])) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, ExpertExchangeWorlds,
                         ::testing::Values(World{1, 1, 3}, World{2, 1, 4}, World{3, 1, 6}, World{4, 2, 4},
                                           World{4, 4, 3}),
                         [](const ::testing::TestParamInfo<World>& info) {
                           const World& w = info.param;
                           return "ranks" + std::to_string(w.ranks) + "_moe_tp" + std::to_string(w.moe_tp) +
                                  "_experts" + std::to_string(w.experts);
                         });

}  // namespace
}  // namespace moeserve::comm
