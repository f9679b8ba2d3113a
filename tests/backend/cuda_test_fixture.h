// Every CUDA op against the CPU reference on fresh random inputs (label: gpu). Inputs are
// rounded to bf16 before the CPU runs them, so the comparison isolates the kernel's own
// error. The reference is the CPU backend with the CUDA backend's bf16 numerics (cpu-bf16:
// fp32 arithmetic rounded to bf16 where the kernels store bf16), and each output passes two
// checks (expect_close): the bf16 bound, a normalised error max |gpu - cpu| / max |cpu| <= 1e-2;
// and the same rounding points: every element within two bf16 ulps of itself plus 2^-10 of
// the largest, and at most 5% of a bf16 output's elements differing at all (only fp32
// summation order differs, which flips a rounding rarely; one rounding point that the kernel
// and the oracle do not share changes ~26% of the elements of silu(gate) * up or RMSNorm).
// Outputs are poisoned with NaN before each run, so an element the kernel forgets to write
// fails the comparison.
//
// The fixture shared by the CUDA op tests (cuda_ops_test.cc) and the batch-invariance tests
// (cuda_batch_invariance_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/random.h"

namespace moeserve {
namespace {

constexpr double kBf16Tolerance = 1e-2;
constexpr double kUlpsAllowed = 2.0 / 256;      // two bf16 ulps (8 significand bits), relative
constexpr double kFloorOfLargest = 1.0 / 1024;  // absolute slack, relative to max |ref|
constexpr double kMaxDifferingBf16Share = 0.05;

// mla_attention over a paged cache: random absorbed queries, rope queries and cache (bf16 as
// the GPU sees them), the CPU reference against the GPU's output.
struct MlaAttentionCase {
  int64_t heads, latent, rope, nope, page_size, max_pages, cache_pages;
  std::vector<int32_t> positions, seq_of, tables;
  float scale;
};

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    gpu = cuda::make_cuda_backend(0);
    cpu = cpu::make_cpu_backend(cpu::CpuNumerics::kBf16);
  }

  // Random values in [-scale, scale), rounded to bf16 (what the GPU will see).
  std::vector<float> random(size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = round_to_bf16(scale * uniform_pm1(seed_, counter_++));
    ++seed_;
    return v;
  }
  ops::BufferPtr to_gpu_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = f32_to_bf16(v[i]);
    auto b = gpu->alloc(std::max<size_t>(bits.size() * 2, 2));
    if (!bits.empty()) gpu->upload(*b, 0, bits.data(), bits.size() * 2);
    return b;
  }
  template <typename T>
  ops::BufferPtr to_gpu_raw(const std::vector<T>& v) {
    auto b = gpu->alloc(std::max<size_t>(v.size() * sizeof(T), 4));
    if (!v.empty()) gpu->upload(*b, 0, v.data(), v.size() * sizeof(T));
    return b;
  }
  ops::BufferPtr poisoned_bf16(size_t n) {
    std::vector<uint16_t> nan(n, 0x7fc0);
    auto b = gpu->alloc(std::max<size_t>(n * 2, 2));
    gpu->upload(*b, 0, nan.data(), n * 2);
    return b;
  }
  ops::BufferPtr poisoned_f32(size_t n) {
    std::vector<float> nan(n, std::numeric_limits<float>::quiet_NaN());
    return to_gpu_raw(nan);
  }
  std::vector<float> from_gpu_bf16(ops::Buffer& b, size_t n) {
    std::vector<uint16_t> bits(n);
    gpu->download(bits.data(), b, 0, n * 2);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = bf16_to_f32(bits[i]);
    return v;
  }
  std::vector<float> from_gpu_f32(ops::Buffer& b, size_t n) {
    std::vector<float> v(n);
    gpu->download(v.data(), b, 0, n * 4);
    return v;
  }
  // `count` experts' random weights (gate/up [2 * inter, hidden], down [hidden, inter]; bf16
  // values), on the host for the CPU reference and on the GPU with the table of their device
  // pointers that MoeExpertsParams reads (d13 / d2: the same pointers on the host).
  struct ExpertWeights {
    std::vector<std::vector<float>> w13, w2;
    std::vector<const void*> w13_ptrs, w2_ptrs;
    std::vector<ops::BufferPtr> d_w13, d_w2;
    std::vector<const void*> d13, d2;
    ops::BufferPtr d_table13, d_table2;
    const void* const* device_w13() const { return static_cast<const void* const*>(d_table13->data()); }
    const void* const* device_w2() const { return static_cast<const void* const*>(d_table2->data()); }
  };
  ExpertWeights expert_weights(int64_t count, int64_t hidden, int64_t inter) {
    ExpertWeights w;
    for (int64_t e = 0; e < count; ++e) {
      w.w13.push_back(random(2 * inter * hidden, 1.0f / 16));
      w.w2.push_back(random(hidden * inter, 1.0f / 8));
      w.w13_ptrs.push_back(w.w13.back().data());
      w.w2_ptrs.push_back(w.w2.back().data());
      w.d_w13.push_back(to_gpu_bf16(w.w13.back()));
      w.d_w2.push_back(to_gpu_bf16(w.w2.back()));
      w.d13.push_back(w.d_w13.back()->data());
      w.d2.push_back(w.d_w2.back()->data());
    }
    w.d_table13 = to_gpu_raw(w.d13);
    w.d_table2 = to_gpu_raw(w.d2);
    return w;
  }
  // kBoundOnly: the bf16 bound alone, for chains of ops, where a rounding that one op's fp32
  // summation order flipped moves every later op's result by more than the per-op check allows.
  enum class Check { kSameRoundings, kBoundOnly };
  static void expect_close(const std::vector<float>& gpu_out, const std::vector<float>& ref, const char* what,
                           Check check = Check::kSameRoundings, double tolerance = kBf16Tolerance) {
    ASSERT_EQ(gpu_out.size(), ref.size());
    double max_diff = 0, max_ref = 0;
    bool bf16_values = true;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_FALSE(std::isnan(gpu_out[i])) << what << ": element " << i << " not written (NaN)";
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(gpu_out[i] - ref[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref[i])));
      bf16_values &= gpu_out[i] == round_to_bf16(gpu_out[i]) && ref[i] == round_to_bf16(ref[i]);
    }
    EXPECT_LE(max_diff / std::max(max_ref, 1e-30), tolerance)
        << what << ": max diff " << max_diff << ", max |ref| " << max_ref;
    if (check == Check::kBoundOnly) return;
    // Same rounding points as the oracle.
    int64_t beyond = 0, differing = 0;
    size_t first_beyond = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = std::fabs(static_cast<double>(gpu_out[i]) - ref[i]);
      if (d > kUlpsAllowed * std::fabs(ref[i]) + kFloorOfLargest * max_ref && beyond++ == 0) first_beyond = i;
      differing += gpu_out[i] != ref[i];
    }
    EXPECT_EQ(beyond, 0) << what << ": " << beyond << " elements beyond two bf16 ulps of cpu-bf16, first "
                         << first_beyond << ": gpu " << gpu_out[first_beyond] << ", cpu-bf16 " << ref[first_beyond];
    if (bf16_values) {  // bf16 outputs (fp32 ones differ in their low bits everywhere)
      EXPECT_LE(static_cast<double>(differing) / std::max<size_t>(ref.size(), 1), kMaxDifferingBf16Share)
          << what << ": " << differing << " of " << ref.size() << " bf16 values differ from cpu-bf16";
    }
  }

  void check_mla_attention(const MlaAttentionCase& c, const char* what) {
    const int64_t tokens = static_cast<int64_t>(c.positions.size()), qk = c.nope + c.rope;
    auto q_lat = random(tokens * c.heads * c.latent), q = random(tokens * c.heads * qk);
    auto cache = random(c.cache_pages * c.page_size * (c.latent + c.rope));
    std::vector<float> att(tokens * c.heads * c.latent);
    cpu->mla_attention({q_lat.data(), q.data(), cache.data(), c.tables.data(), c.seq_of.data(), c.positions.data(),
                        att.data(), tokens, c.heads, c.latent, c.rope, qk, c.nope, c.page_size, c.max_pages, c.scale});
    auto d_ql = to_gpu_bf16(q_lat), d_q = to_gpu_bf16(q), d_c = to_gpu_bf16(cache), d_out = poisoned_bf16(att.size());
    auto d_t = to_gpu_raw(c.tables), d_s = to_gpu_raw(c.seq_of), d_p = to_gpu_raw(c.positions);
    gpu->mla_attention({d_ql->data(), d_q->data(), d_c->data(), static_cast<int32_t*>(d_t->data()),
                        static_cast<int32_t*>(d_s->data()), static_cast<int32_t*>(d_p->data()), d_out->data(), tokens,
                        c.heads, c.latent, c.rope, qk, c.nope, c.page_size, c.max_pages, c.scale});
    expect_close(from_gpu_bf16(*d_out, att.size()), att, what);
  }

  std::unique_ptr<ops::Backend> gpu, cpu;  // cpu: CpuNumerics::kBf16
  uint64_t seed_ = 1234, counter_ = 0;
};

}  // namespace
}  // namespace moeserve
