// Read bandwidth of the quantized kernels on K2.6 expert shapes against this GPU's measured
// copy bandwidth (backend/cuda/ceilings.h), at batch 1 / 8 / 32 / 64 / 128. Disabled by
// default (it is a measurement, not a check); run it with
//   cuda_backend_tests --gtest_also_run_disabled_tests --gtest_filter='CudaQuantBench.*'
// Each timing replays a CUDA graph of many calls whose weights together exceed L2 (a decode
// step's access pattern: every call streams weights it did not just read). Bytes read: the
// packed values and scales of every weight the call reads (the routed local experts' w13 and
// w2, or the projection) plus its activations.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/ceilings.h"
#include "backend/cuda/cuda_backend.h"
#include "core/random.h"
#include "ops/ops.h"
#include "tests/backend/quant_test_weights.h"

namespace moeserve {
namespace {

constexpr int64_t kHidden = 7168, kInter = 2048, kExperts = 384, kTopK = 8;  // Kimi K2.6
constexpr int kCallsPerGraph = 16, kReplays = 5;
const int64_t kBatches[] = {1, 8, 32, 64, 128};

struct Layout {
  const char* name;
  ops::QuantLayout layout;
};
const Layout kLayouts[] = {{"int4-g32", test::int4_layout(32)}, {"fp8-128x128", test::fp8_layout()}};

class CudaQuantBench : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    copy_gbs_ = cuda::measure_ceilings(0).copy_gbs;
    gpu_ = cuda::make_cuda_backend(0);
    std::printf("[quant-bench] measured copy bandwidth %.0f GB/s\n", copy_gbs_);
  }
  ops::BufferPtr random_buffer(int64_t bytes, uint64_t seed) {
    auto b = gpu_->alloc(static_cast<size_t>(bytes));
    gpu_->fill_random_words({static_cast<uint32_t*>(b->data()), bytes / 4, 0, seed});
    return b;
  }
  ops::BufferPtr bf16_activations(int64_t rows, int64_t cols, uint64_t seed) {
    auto b = gpu_->alloc(static_cast<size_t>(rows * cols * 2));
    gpu_->fill_uniform({b->data(), rows, cols, cols, 0, 0, seed, 0.0f, 1.0f});
    return b;
  }
  // Microseconds per call: a graph of kCallsPerGraph calls (call(i)), best of kReplays.
  template <typename Call>
  double time_us(Call&& call) {
    for (int i = 0; i < kCallsPerGraph; ++i) call(i);  // sizes workspaces, warms up
    gpu_->synchronize();
    gpu_->begin_capture();
    for (int i = 0; i < kCallsPerGraph; ++i) call(i);
    auto graph = gpu_->end_capture();
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaStream_t stream = cuda::stream_of(*gpu_);
    gpu_->replay(*graph);
    double best = 1e30;
    for (int r = 0; r < kReplays; ++r) {
      cudaEventRecord(start, stream);
      gpu_->replay(*graph);
      cudaEventRecord(stop, stream);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      best = std::min(best, 1000.0 * ms / kCallsPerGraph);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return best;
  }
  void report(const std::string& what, int64_t batch, double us, double bytes) {
    const double gbs = bytes / (us * 1e3);
    std::printf("[quant-bench] %-44s batch %4lld: %9.1f us, %8.1f MB read, %6.0f GB/s = %5.1f%% of copy\n",
                what.c_str(), static_cast<long long>(batch), us, bytes / 1e6, gbs, 100.0 * gbs / copy_gbs_);
    std::fflush(stdout);
  }

  std::unique_ptr<ops::Backend> gpu_;
  double copy_gbs_ = 0;
};

// Quantized projections of the expert shapes: [2 * inter, hidden] (w13) and [hidden, inter]
// (w2); enough copies that one graph's calls read ~1 GB of distinct weights.
TEST_F(CudaQuantBench, DISABLED_QuantizedGemv) {
  for (const Layout& l : kLayouts) {
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{2 * kInter, kHidden}, {kHidden, kInter}}) {
      const int64_t bytes = ops::quant_buffer_bytes(n, k, l.layout);
      std::vector<ops::BufferPtr> weights;
      for (int i = 0; i < kCallsPerGraph; ++i) weights.push_back(random_buffer(bytes, 100 + i));
      for (int64_t batch : kBatches) {
        auto x = bf16_activations(batch, k, 7);
        auto y = gpu_->alloc(static_cast<size_t>(batch * n * 2));
        const double us = time_us([&](int i) {
          ops::LinearParams p{x->data(), weights[i]->data(), y->data(), batch, k, n, k, n};
          p.weight_quant = l.layout;
          gpu_->linear(p);
        });
        report(std::string("linear ") + l.name + " " + std::to_string(n) + "x" + std::to_string(k), batch, us,
               static_cast<double>(bytes + batch * (k + n) * 2));
      }
    }
  }
}

// Decode-step grouped experts: all 384 experts local (one H200), top-8 routing drawn at
// random per call; bytes: the distinct routed experts' packed w13 and w2.
TEST_F(CudaQuantBench, DISABLED_DecodeMoe) {
  for (const Layout& l : kLayouts) {
    const int64_t bytes13 = (ops::quant_buffer_bytes(2 * kInter, kHidden, l.layout) + 255) / 256 * 256;
    const int64_t bytes2 = (ops::quant_buffer_bytes(kHidden, kInter, l.layout) + 255) / 256 * 256;
    auto w13 = random_buffer(bytes13 * kExperts, 1), w2 = random_buffer(bytes2 * kExperts, 2);
    std::vector<const void*> p13, p2;
    for (int64_t e = 0; e < kExperts; ++e) {
      p13.push_back(static_cast<const char*>(w13->data()) + e * bytes13);
      p2.push_back(static_cast<const char*>(w2->data()) + e * bytes2);
    }
    auto t13 = gpu_->alloc(p13.size() * sizeof(void*)), t2 = gpu_->alloc(p2.size() * sizeof(void*));
    gpu_->upload(*t13, 0, p13.data(), p13.size() * sizeof(void*));
    gpu_->upload(*t2, 0, p2.data(), p2.size() * sizeof(void*));
    for (int64_t batch : kBatches) {
      auto x = bf16_activations(batch, kHidden, 9);
      auto out = gpu_->alloc(static_cast<size_t>(batch * kHidden * 2));
      std::vector<ops::BufferPtr> ids_of_call;
      double bytes = 0;
      std::vector<float> weights(batch * kTopK, 0.125f);
      auto d_weights = gpu_->alloc(weights.size() * 4);
      gpu_->upload(*d_weights, 0, weights.data(), weights.size() * 4);
      for (int i = 0; i < kCallsPerGraph; ++i) {
        std::vector<int32_t> ids(batch * kTopK);
        std::set<int32_t> distinct;
        for (int64_t t = 0; t < batch; ++t) {
          std::set<int32_t> mine;  // top-k: distinct experts per token
          for (uint64_t j = 0; static_cast<int64_t>(mine.size()) < kTopK; ++j)
            mine.insert(static_cast<int32_t>(random_word(1000 + i, t * 64 + j) % kExperts));
          std::copy(mine.begin(), mine.end(), ids.begin() + t * kTopK);
          distinct.insert(mine.begin(), mine.end());
        }
        bytes += static_cast<double>(distinct.size()) * (bytes13 + bytes2) / kCallsPerGraph;
        ids_of_call.push_back(gpu_->alloc(ids.size() * 4));
        gpu_->upload(*ids_of_call.back(), 0, ids.data(), ids.size() * 4);
      }
      const double us = time_us([&](int i) {
        ops::MoeExpertsParams p{x->data(),
                                static_cast<const int32_t*>(ids_of_call[i]->data()),
                                static_cast<const float*>(d_weights->data()),
                                static_cast<const void* const*>(t13->data()),
                                static_cast<const void* const*>(t2->data()),
                                out->data(),
                                batch,
                                kTopK,
                                kHidden,
                                kInter,
                                0,
                                kExperts};
        p.routed_experts = kExperts;
        p.expert_quant = l.layout;
        gpu_->moe_experts(p);
      });
      report(std::string("moe_experts ") + l.name + " 384 experts top-8", batch, us, bytes);
    }
  }
}

}  // namespace
}  // namespace moeserve
