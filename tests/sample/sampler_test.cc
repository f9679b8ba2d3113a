// sample::Sampler on the CPU backend, over a vocabulary split into slices the way a plan splits
// it (attn_tp in-process ranks, each with `parts` vocab parts): greedy draws are each row's
// argmax (ties to the smallest id, across slices too); candidates merged over the slices are
// the whole row's candidates; whole-row draws on the device (kSampled, draw_rows) are
// cpu::sample_row's tokens for the same seed and step; kLogits brings the rows back whole.
#include "sample/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/sampling.h"
#include "comm/in_process.h"

namespace moeserve::sample {
namespace {

constexpr int64_t kVocab = 1024, kRows = 5, kCapacity = 8;

struct Split {
  int ranks;  // attn_tp
  int parts;  // vocab parts per rank
  int slices() const { return ranks * parts; }
  int64_t vocab_part() const { return kVocab / slices(); }
  int64_t candidates() const { return std::min(kCandidatesPerSlice, vocab_part()); }
};

// Logits [kRows, kVocab] with few exact ties; row 0's maximum appears in the first and the
// last slice of every split, so its argmax is the smaller of the two ids.
std::vector<float> make_logits() {
  std::vector<float> logits(static_cast<size_t>(kRows * kVocab));
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t v = 0; v < kVocab; ++v)
      logits[r * kVocab + v] = 4.0f * static_cast<float>(std::sin(0.37 * static_cast<double>(v * (r + 3)) + r));
  logits[3] = logits[kVocab - 5] = 9.5f;
  return logits;
}

// One rank's device buffers, laid out as the model's workspace lays them out.
struct RankBuffers {
  std::vector<ops::BufferPtr> owned;
  SamplerBuffers view;
};

ops::Buffer* add(RankBuffers& b, ops::Backend& backend, int64_t elements, size_t elem) {
  b.owned.push_back(backend.alloc(static_cast<size_t>(elements) * elem));
  return b.owned.back().get();
}

RankBuffers rank_buffers(ops::Backend& backend, const Split& split, int rank, const std::vector<float>& logits) {
  RankBuffers b;
  const int64_t vp = split.vocab_part(), c = split.candidates(), parts = split.parts, tp = split.ranks;
  SamplerBuffers& v = b.view;
  v.capacity = kCapacity;
  v.logits = add(b, backend, parts * kRows * vp, 4);  // [parts, rows, vocab_part]
  std::vector<float> local(static_cast<size_t>(parts * kRows * vp));
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t i = 0; i < vp; ++i)
        local[(p * kRows + r) * vp + i] = logits[r * kVocab + (rank * parts + p) * vp + i];
  backend.upload(*v.logits, 0, local.data(), local.size() * 4);
  v.temperatures = add(b, backend, kCapacity, 4);
  v.greedy_pairs = add(b, backend, parts * 2 * kCapacity, 4);
  v.cand_values = add(b, backend, parts * kCapacity * c, 4);
  v.cand_ids = add(b, backend, parts * kCapacity * c, 4);
  v.cand_normaliser = add(b, backend, parts * kCapacity, 8);
  if (tp > 1) {
    v.gathered_logits = add(b, backend, tp * parts * kRows * vp, 4);
    v.gathered_pairs = add(b, backend, tp * parts * 2 * kCapacity, 4);
    v.gathered_cand_values = add(b, backend, tp * parts * kCapacity * c, 4);
    v.gathered_cand_ids = add(b, backend, tp * parts * kCapacity * c, 4);
    v.gathered_cand_normaliser = add(b, backend, tp * parts * kCapacity, 8);
  }
  return b;
}

std::vector<float> temperatures() { return {0.0f, 0.7f, 1.0f, 1.3f, 0.5f}; }

std::vector<ops::SamplingOptions> draws() {
  std::vector<ops::SamplingOptions> out;
  for (int64_t r = 0; r < kRows; ++r)
    out.push_back({.temperature = r == 0 ? 0.0f : 0.6f + 0.2f * static_cast<float>(r),
                   .top_k = r == 2 ? 40 : 0,
                   .top_p = r == 3 ? 0.9f : 1.0f,
                   .min_p = r == 4 ? 0.05f : 0.0f,
                   .seed = 1234 + static_cast<uint64_t>(r),
                   .step = 7 * static_cast<uint64_t>(r)});
  return out;
}

// Runs `fn(rank, sampler, buffers)` on one thread per rank of `split`, an in-process attn_tp
// group between them; returns rank by rank what fn returned.
template <typename T>
std::vector<T> on_ranks(const Split& split, const std::function<T(Sampler&, const SamplerBuffers&)>& fn) {
  const std::vector<float> logits = make_logits();
  comm::InProcessWorld world(split.ranks);
  std::vector<int> members(static_cast<size_t>(split.ranks));
  for (int r = 0; r < split.ranks; ++r) members[r] = r;
  std::vector<T> results(static_cast<size_t>(split.ranks));
  std::vector<std::string> errors(static_cast<size_t>(split.ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < split.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<ops::Backend> backend = cpu::make_cpu_backend();
        std::unique_ptr<comm::Communicator> tp = split.ranks > 1 ? world.communicator(r, "attn_tp", members) : nullptr;
        RankBuffers buffers = rank_buffers(*backend, split, r, logits);
        const std::vector<float> t = temperatures();
        backend->upload(*buffers.view.temperatures, 0, t.data(), t.size() * 4);
        Sampler sampler({.backend = *backend,
                         .attn_tp = tp.get(),
                         .vocab_size = kVocab,
                         .vocab_begin = r * split.parts * split.vocab_part(),
                         .vocab_local = split.parts * split.vocab_part(),
                         .parts = split.parts,
                         .vocab_slices = split.slices(),
                         .candidates_per_slice = split.candidates()});
        results[r] = fn(sampler, buffers.view);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        world.abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < split.ranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return results;
}

ForwardBatch batch_drawing(DrawKind draw) {
  ForwardBatch batch;
  batch.logit_rows.resize(kRows);
  batch.draw = draw;
  batch.temperatures = temperatures();
  batch.sampling = draws();
  return batch;
}

// reduce() then finish() of a `draw` step on every rank.
std::vector<Drawn> drawn_on_ranks(const Split& split, DrawKind draw) {
  return on_ranks<Drawn>(split, [&](Sampler& sampler, const SamplerBuffers& b) {
    sampler.reduce(b, kRows, draw);
    return sampler.finish(b, batch_drawing(draw));
  });
}

class SamplerSplits : public ::testing::TestWithParam<Split> {};

TEST_P(SamplerSplits, GreedyDrawsAreEachRowsArgmaxTiesToTheSmallestId) {
  const std::vector<float> logits = make_logits();
  for (const Drawn& drawn : drawn_on_ranks(GetParam(), DrawKind::kGreedy)) {
    ASSERT_EQ(drawn.rows.dtype(), DType::I32);
    ASSERT_EQ(drawn.rows.numel(), kRows);
    for (int64_t r = 0; r < kRows; ++r)
      EXPECT_EQ(drawn.rows.i32()[r], cpu::sample_row(logits.data() + r * kVocab, kVocab, {})) << "row " << r;
    EXPECT_EQ(drawn.rows.i32()[0], 3);
  }
}

TEST_P(SamplerSplits, CandidatesMergedOverTheSlicesAreTheWholeRowsCandidates) {
  const std::vector<float> logits = make_logits();
  const std::vector<float> t = temperatures();
  const Split split = GetParam();
  for (const Drawn& drawn : drawn_on_ranks(split, DrawKind::kCandidates)) {
    const SampleCandidates& c = drawn.candidates;
    ASSERT_EQ(c.rows, kRows);
    ASSERT_EQ(c.count, std::min(kCandidatesPerSlice, split.slices() * split.candidates()));
    for (int64_t r = 0; r < kRows; ++r) {
      std::vector<float> values(static_cast<size_t>(c.count));
      std::vector<int32_t> ids(values.size());
      double normaliser = 0;
      cpu::top_candidates_row(logits.data() + r * kVocab, kVocab, c.count, t[r], values.data(), ids.data(),
                              &normaliser);
      EXPECT_EQ(std::vector<float>(c.values.begin() + r * c.count, c.values.begin() + (r + 1) * c.count), values)
          << "row " << r;
      EXPECT_EQ(std::vector<int32_t>(c.ids.begin() + r * c.count, c.ids.begin() + (r + 1) * c.count), ids)
          << "row " << r;
      // The slices' sums rescaled to the row maximum: the whole row's sum up to rounding.
      EXPECT_NEAR(c.normaliser[r], normaliser, 1e-12 * normaliser) << "row " << r;
    }
  }
}

TEST_P(SamplerSplits, DeviceDrawsAreTheHostSamplersTokens) {
  const std::vector<float> logits = make_logits();
  const std::vector<ops::SamplingOptions> options = draws();
  for (const Drawn& drawn : drawn_on_ranks(GetParam(), DrawKind::kSampled)) {
    ASSERT_EQ(drawn.rows.numel(), kRows);
    for (int64_t r = 0; r < kRows; ++r)
      EXPECT_EQ(drawn.rows.i32()[r], cpu::sample_row(logits.data() + r * kVocab, kVocab, options[r])) << "row " << r;
  }
}

TEST_P(SamplerSplits, FallbackDrawsOfChosenRowsAreTheHostSamplersTokens) {
  const std::vector<float> logits = make_logits();
  const std::vector<ops::SamplingOptions> options = draws();
  const std::vector<int64_t> rows = {3, 1};
  const auto tokens = on_ranks<std::vector<int32_t>>(GetParam(), [&](Sampler& sampler, const SamplerBuffers& b) {
    sampler.reduce(b, kRows, DrawKind::kCandidates);
    sampler.finish(b, batch_drawing(DrawKind::kCandidates));
    return sampler.draw_rows(rows, {options[3], options[1]});
  });
  for (const std::vector<int32_t>& t : tokens) {
    ASSERT_EQ(t.size(), 2u);
    EXPECT_EQ(t[0], cpu::sample_row(logits.data() + 3 * kVocab, kVocab, options[3]));
    EXPECT_EQ(t[1], cpu::sample_row(logits.data() + 1 * kVocab, kVocab, options[1]));
  }
}

TEST_P(SamplerSplits, LogitsComeBackWhole) {
  const std::vector<float> logits = make_logits();
  for (const Drawn& drawn : drawn_on_ranks(GetParam(), DrawKind::kLogits)) {
    ASSERT_EQ(drawn.rows.dtype(), DType::F32);
    ASSERT_EQ(drawn.rows.numel(), kRows * kVocab);
    EXPECT_EQ(std::vector<float>(drawn.rows.f32(), drawn.rows.f32() + kRows * kVocab), logits);
  }
}

TEST(Sampler, FallbackRowsMustBeAmongTheLastStepsRows) {
  const auto errors = on_ranks<std::string>({.ranks = 1, .parts = 1}, [&](Sampler& sampler, const SamplerBuffers& b) {
    sampler.reduce(b, kRows, DrawKind::kGreedy);
    sampler.finish(b, batch_drawing(DrawKind::kGreedy));
    try {
      sampler.draw_rows({kRows}, {ops::SamplingOptions{}});
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  });
  EXPECT_NE(errors[0].find("not among the last step's 5 logit rows"), std::string::npos) << errors[0];
}

INSTANTIATE_TEST_SUITE_P(VocabSplits, SamplerSplits,
                         ::testing::Values(Split{1, 1}, Split{1, 2}, Split{2, 1}, Split{2, 2}, Split{4, 1}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.ranks) + "_parts" + std::to_string(info.param.parts);
                         });

}  // namespace
}  // namespace moeserve::sample
