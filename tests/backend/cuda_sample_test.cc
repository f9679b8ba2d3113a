// The CUDA sampling ops (top candidates, whole-row draws, greedy argmax) against the CPU
// reference on fresh random inputs (label: gpu); the checks of cuda_ops_test.cc's header.
#include <array>

#include "tests/backend/cuda_test_fixture.h"

namespace moeserve {
namespace {

// A suite of its own: gtest refuses one suite name over two translation units' fixtures.
class CudaSampleOps : public CudaOps {};

// Sampling candidates against the CPU reference: the same top `count` (values, ids with the
// slice offset, in order; the first is the row's maximum), and the fp64 normaliser to 1e-12 relative (the
// sums differ only in order). Rows with ties and signed zeros, greedy rows (normaliser 1),
// vocabularies that split into uneven segments, counts from 1 to the 1024 maximum.
TEST_F(CudaSampleOps, TopCandidatesMatchTheCpu) {
  for (int64_t vocab : {1000, 81920, 163840})
    for (int64_t count : {1, 64, 256, 1024}) {
      if (count > vocab) continue;
      const int64_t rows = 3;
      auto logits = random(rows * vocab, 6.0f);
      for (int64_t v = 0; v < vocab; v += 7) logits[v] = std::round(logits[v]);  // many exact ties
      logits[1 * vocab + 5] = -0.0f;
      logits[1 * vocab + 9] = 0.0f;
      for (int64_t v = 0; v < vocab; ++v) logits[2 * vocab + v] = 1.5f;  // one flat row: ties everywhere
      const std::vector<float> temperatures = {0.7f, 0.0f, 1.3f};
      std::vector<float> values(rows * count);
      std::vector<int32_t> ids(rows * count);
      std::vector<double> norm(rows);
      cpu->top_candidates(
          {logits.data(), temperatures.data(), values.data(), ids.data(), norm.data(), rows, vocab, count, 4096});
      auto d_l = to_gpu_raw(logits), d_t = to_gpu_raw(temperatures);
      auto d_v = poisoned_f32(rows * count);
      auto d_i = to_gpu_raw(std::vector<int32_t>(rows * count, -1));
      auto d_n = to_gpu_raw(std::vector<double>(rows, std::nan("")));
      gpu->top_candidates({static_cast<float*>(d_l->data()), static_cast<float*>(d_t->data()),
                           static_cast<float*>(d_v->data()), static_cast<int32_t*>(d_i->data()),
                           static_cast<double*>(d_n->data()), rows, vocab, count, 4096});
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << ", count " << count);
      std::vector<int32_t> got_ids(rows * count);
      gpu->download(got_ids.data(), *d_i, 0, got_ids.size() * 4);
      std::vector<double> got_norm(rows);
      gpu->download(got_norm.data(), *d_n, 0, rows * 8);
      EXPECT_EQ(got_ids, ids);
      const std::vector<float> got_values = from_gpu_f32(*d_v, values.size());
      EXPECT_EQ(got_values, values);
      for (int64_t r = 0; r < rows; ++r)  // a row's first candidate is its maximum
        EXPECT_EQ(got_values[r * count],
                  *std::max_element(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab));
      for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(got_norm[r], norm[r], 1e-12 * norm[r]) << "row " << r;
    }
}

// Whole-row draws on the device (what the serving loop uses when a draw reaches past a row's
// candidates) pick the host's token for every option: flat rows (top-p over most of the
// vocabulary), peaked rows, exact ties, -0 / +0, and a vocabulary gathered in slices.
TEST_F(CudaSampleOps, SampleDrawsTheHostsTokenOverWholeRows) {
  std::vector<ops::SamplingOptions> kinds;
  for (float temperature : {0.0f, 0.6f, 1.0f, 1.7f})
    for (int32_t top_k : {0, 1, 40, 5000})
      for (float top_p : {1.0f, 0.9f, 0.3f})
        for (float min_p : {0.0f, 0.05f}) kinds.push_back({temperature, top_k, top_p, min_p, 0, 0});
  for (int64_t vocab : {1000, 50002, 163840})
    for (int64_t slices : {1, 2}) {
      // Row kinds: flat (logits within 0.1), peaked (a few loud ids), ties everywhere.
      const int64_t logit_rows = 12;
      std::vector<float> logits = random(logit_rows * vocab, 0.05f);
      for (int64_t r = 3; r < 6; ++r)
        for (int64_t v = 0; v < vocab; v += 97) logits[r * vocab + v] = 8.0f + 0.01f * static_cast<float>(v % 13);
      for (int64_t r = 6; r < 9; ++r)
        for (int64_t v = 0; v < vocab; ++v) logits[r * vocab + v] = std::round(logits[r * vocab + v] * 40.0f);
      logits[9 * vocab + 3] = -0.0f;
      logits[9 * vocab + 4] = 0.0f;
      // Every option kind twice (two seeds), on rows taken in a scrambled order.
      const int64_t rows = 2 * static_cast<int64_t>(kinds.size());
      std::vector<ops::SamplingOptions> options(rows);
      std::vector<int32_t> row_ids(rows);
      for (int64_t r = 0; r < rows; ++r) {
        options[r] = kinds[r % kinds.size()];
        options[r].seed = 1000 + r;
        options[r].step = static_cast<uint64_t>(r) * 7;
        row_ids[r] = static_cast<int32_t>((r * 5 + r / 3) % logit_rows);
      }
      // The device reads [slices, logit_rows, vocab / slices]; the host the rows themselves.
      const int64_t width = vocab / slices;
      std::vector<float> sliced(logits.size());
      for (int64_t s = 0; s < slices; ++s)
        for (int64_t r = 0; r < logit_rows; ++r)
          std::copy_n(logits.begin() + r * vocab + s * width, width, sliced.begin() + (s * logit_rows + r) * width);
      auto d_l = to_gpu_raw(sliced);
      auto d_t = to_gpu_raw(std::vector<int32_t>(rows, -1));
      ops::SampleParams params{static_cast<float*>(d_l->data()), options.data(), static_cast<int32_t*>(d_t->data()),
                               rows, vocab};
      params.row_ids = row_ids.data();
      params.slices = slices;
      params.logit_rows = logit_rows;
      gpu->sample(params);
      std::vector<int32_t> got(rows);
      gpu->download(got.data(), *d_t, 0, rows * 4);
      for (int64_t r = 0; r < rows; ++r) {
        const ops::SamplingOptions& o = options[r];
        EXPECT_EQ(got[r], cpu::sample_row(logits.data() + row_ids[r] * vocab, vocab, o))
            << "vocab " << vocab << " slices " << slices << " logit row " << row_ids[r] << ": temperature "
            << o.temperature << " top_k " << o.top_k << " top_p " << o.top_p << " min_p " << o.min_p;
      }
    }
}

TEST_F(CudaSampleOps, GreedySampleIsArgmax) {
  const int64_t rows = 3, vocab = 50000;
  auto logits = random(rows * vocab, 5.0f);
  logits[1 * vocab + 777] = 100.0f;
  auto d_l = to_gpu_raw(logits);
  auto d_t = to_gpu_raw(std::vector<int32_t>(rows, -1));
  std::vector<ops::SamplingOptions> options(rows);
  gpu->sample({static_cast<float*>(d_l->data()), options.data(), static_cast<int32_t*>(d_t->data()), rows, vocab});
  std::vector<int32_t> got(rows);
  gpu->download(got.data(), *d_t, 0, rows * 4);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(got[r], cpu::sample_row(logits.data() + r * vocab, vocab, options[r])) << r;
  EXPECT_EQ(got[1], 777);

  // argmax_rows: values and ids offset by a vocab slice's first id, as on the CPU.
  std::vector<float> ref_values(rows);
  std::vector<int32_t> ref_ids(rows);
  cpu->argmax_rows({logits.data(), ref_values.data(), ref_ids.data(), rows, vocab, 4096});
  auto d_v = poisoned_f32(rows);
  auto d_i = to_gpu_raw(std::vector<int32_t>(rows, -1));
  gpu->argmax_rows({static_cast<float*>(d_l->data()), static_cast<float*>(d_v->data()),
                    static_cast<int32_t*>(d_i->data()), rows, vocab, 4096});
  std::vector<int32_t> ids(rows);
  gpu->download(ids.data(), *d_i, 0, rows * 4);
  EXPECT_EQ(ids, ref_ids);
  EXPECT_EQ(from_gpu_f32(*d_v, rows), ref_values);
}

}  // namespace
}  // namespace moeserve
