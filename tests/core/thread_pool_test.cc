#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

namespace moeserve {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (size_t n : {0u, 1u, 7u, 1000u, 4097u}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 3, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) hits[i]++;
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::atomic<int> total{0};
  pool.parallel_for(8, 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      pool.parallel_for(10, 1, [&](size_t b2, size_t e2) { total += static_cast<int>(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 80);
}

TEST(ThreadPool, ResultsIndependentOfThreadCount) {
  std::vector<float> data(10000);
  std::iota(data.begin(), data.end(), 0.5f);
  auto run = [&](size_t threads) {
    ThreadPool pool(threads);
    std::vector<float> out(100);
    pool.parallel_for(out.size(), 1, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        float s = 0;
        for (size_t j = 0; j < 100; ++j) s += data[i * 100 + j] * 1e-3f;
        out[i] = s;
      }
    });
    return out;
  };
  EXPECT_EQ(run(1), run(2));
  EXPECT_EQ(run(1), run(7));
}

}  // namespace moeserve
