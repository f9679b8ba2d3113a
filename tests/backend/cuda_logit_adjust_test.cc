// The CUDA logit-adjust op (ops::LogitAdjustParams) against the CPU reference (label: gpu):
// entries inside and outside this rank's vocab slice, rows past the batch, entries past the
// count, -inf masks, and a captured graph replayed with other entries and another count (what a
// decode step does: the entries are uploaded before each replay).
#include <random>
#include <set>

#include "tests/backend/cuda_test_fixture.h"

namespace moeserve {
namespace {

class CudaLogitAdjust : public CudaOps {};

// Distinct (row, token) entries over rows [0, rows + 1) and ids [0, vocab): some on other ranks.
std::vector<ops::LogitAdjustEntry> random_entries(int64_t n, int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::set<std::pair<int32_t, int32_t>> used;
  std::vector<ops::LogitAdjustEntry> out;
  while (static_cast<int64_t>(out.size()) < n) {
    const auto row = static_cast<int32_t>(rng() % (rows + 1)), token = static_cast<int32_t>(rng() % vocab);
    if (!used.insert({row, token}).second) continue;
    const float u = static_cast<float>(rng() % 1000) / 1000.0f;
    ops::LogitAdjustEntry e{.row = row, .token = token, .bias = (rng() % 7 == 0) ? -INFINITY : 20.0f * u - 10.0f};
    if (rng() % 2) e.repetition = 0.5f + 2.0f * u;
    if (rng() % 2) e.subtract = 3.0f * u - 1.0f;
    out.push_back(e);
  }
  return out;
}

void expect_same(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << "logit " << i;
    } else {  // the device may fuse x * repetition - subtract into one rounding
      EXPECT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, std::abs(want[i]))) << "logit " << i;
    }
  }
}

TEST_F(CudaLogitAdjust, MatchesTheCpuAndReplaysInAGraph) {
  auto fp32 = cpu::make_cpu_backend();
  const int64_t rows = 5, parts = 2, vocab_part = 4096, vocab = 4 * parts * vocab_part, begin = parts * vocab_part;
  const int64_t capacity = 3000;
  const std::vector<float> logits = random(parts * rows * vocab_part, 8.0f);
  auto d_logits = to_gpu_raw(logits);
  auto d_entries = gpu->alloc(capacity * sizeof(ops::LogitAdjustEntry));
  auto d_count = gpu->alloc(4);
  const ops::LogitAdjustParams device{static_cast<float*>(d_logits->data()),
                                      static_cast<const ops::LogitAdjustEntry*>(d_entries->data()),
                                      static_cast<const int32_t*>(d_count->data()),
                                      capacity,
                                      rows,
                                      vocab_part,
                                      parts,
                                      begin};
  auto check = [&](const std::vector<ops::LogitAdjustEntry>& entries, int32_t count, bool graph_replay,
                   ops::Graph* graph) {
    gpu->upload(*d_logits, 0, logits.data(), logits.size() * 4);
    gpu->upload(*d_entries, 0, entries.data(), entries.size() * sizeof(ops::LogitAdjustEntry));
    gpu->upload(*d_count, 0, &count, 4);
    if (graph_replay)
      gpu->replay(*graph);
    else
      gpu->logit_adjust(device);
    std::vector<float> want = logits;
    fp32->logit_adjust({want.data(), entries.data(), &count, capacity, rows, vocab_part, parts, begin});
    expect_same(from_gpu_f32(*d_logits, logits.size()), want);
  };
  for (int32_t count : {0, 1, 700, 3000}) {
    SCOPED_TRACE(testing::Message() << count << " entries");
    check(random_entries(capacity, rows, vocab, static_cast<uint32_t>(count)), count, false, nullptr);
  }
  gpu->begin_capture();
  gpu->logit_adjust(device);
  std::unique_ptr<ops::Graph> graph = gpu->end_capture();
  ASSERT_NE(graph, nullptr);
  for (int32_t count : {5, 2999}) {
    SCOPED_TRACE(testing::Message() << "replayed with " << count << " entries");
    check(random_entries(capacity, rows, vocab, 100u + static_cast<uint32_t>(count)), count, true, graph.get());
  }
}

}  // namespace
}  // namespace moeserve
