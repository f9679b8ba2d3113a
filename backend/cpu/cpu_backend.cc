#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <numeric>
#include <vector>

#include "backend/cpu/quant_dequant.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/random.h"
#include "core/thread_pool.h"

namespace moeserve::cpu {

namespace {

using namespace moeserve::ops;

// Host memory, 64-byte aligned: a whole allocation, or a view of part of another one's (a
// re-plan's alias) that shares its ownership. Zeroed up front (as Tensor is).
class HostBuffer final : public Buffer {
 public:
  HostBuffer(size_t nbytes, bool zeroed) : nbytes_(nbytes) {
    // aligned_alloc as Tensor does: a malloc'd block aligned by hand grew the server's RSS by
    // 136 MB over tests/python/serve/test_load.py's 1,000 requests, this does not.
    const size_t rounded = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    void* raw = std::aligned_alloc(64, rounded);
    if (raw == nullptr) throw std::bad_alloc();
    if (zeroed) std::memset(raw, 0, rounded);
    storage_ = std::shared_ptr<std::byte>(static_cast<std::byte*>(raw), [](std::byte* p) { std::free(p); });
  }
  HostBuffer(const HostBuffer& of, size_t offset, size_t nbytes)
      : storage_(of.storage_), offset_(of.offset_ + offset), nbytes_(nbytes) {}
  void* data() override { return storage_.get() + offset_; }
  size_t nbytes() const override { return nbytes_; }

 private:
  std::shared_ptr<std::byte> storage_;
  size_t offset_ = 0;
  size_t nbytes_;
};

inline const float* F(const void* p) { return static_cast<const float*>(p); }
inline float* F(void* p) { return static_cast<float*>(p); }

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

ThreadPool& pool() { return ThreadPool::global(); }

// y[r] = dot(w[r, :], x) for r in [0, rows)
void matvec(const float* w, const float* x, float* y, int64_t rows, int64_t cols, bool accumulate) {
  pool().parallel_for(static_cast<size_t>(rows), 16, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const float v = dot(w + r * cols, x, cols);
      y[r] = accumulate ? y[r] + v : v;
    }
  });
}

// out [n, k] = the packed weight dequantized to fp32 (ops/quant_layout.h), rows in parallel.
void dequantize_into(std::vector<float>& out, const void* weight, int64_t n, int64_t k, const QuantLayout& layout) {
  out.resize(static_cast<size_t>(n * k));
  pool().parallel_for(static_cast<size_t>(n), 16, [&](size_t begin, size_t end) {
    dequantize_rows({.weight = weight,
                     .n = n,
                     .k = k,
                     .layout = layout,
                     .row0 = static_cast<int64_t>(begin),
                     .rows = static_cast<int64_t>(end - begin),
                     .out = out.data() + begin * k});
  });
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuNumerics numerics) : bf16_(numerics == CpuNumerics::kBf16) {}
  std::string name() const override { return bf16_ ? "cpu-bf16" : "cpu"; }
  DType activation_dtype() const override { return DType::F32; }

  BufferPtr alloc(size_t nbytes) override { return std::make_unique<HostBuffer>(nbytes, /*zeroed=*/true); }
  BufferPtr alloc_for_overwrite(size_t nbytes) override {
    return std::make_unique<HostBuffer>(nbytes, /*zeroed=*/false);
  }
  // Views start 64-byte aligned, as allocations do (the kernels' vector loads may assume it).
  BufferPtr alias(Buffer& src, size_t offset, size_t nbytes) override {
    const auto* host = dynamic_cast<const HostBuffer*>(&src);
    if (host == nullptr || offset % 64 != 0 || offset + nbytes > src.nbytes()) return nullptr;
    return std::make_unique<HostBuffer>(*host, offset, nbytes);
  }
  void copy_rows(const CopyRowsParams& p) override {
    auto* dst = static_cast<std::byte*>(p.dst);
    const auto* src = static_cast<const std::byte*>(p.src);
    if (p.row_bytes == p.src_pitch && p.row_bytes == p.dst_pitch) {  // contiguous: one copy
      std::memcpy(dst, src, p.rows * p.row_bytes);
      return;
    }
    for (size_t r = 0; r < p.rows; ++r) std::memcpy(dst + r * p.dst_pitch, src + r * p.src_pitch, p.row_bytes);
  }
  void upload(Buffer& dst, size_t offset, const void* src, size_t nbytes) override {
    MS_CHECK(offset + nbytes <= dst.nbytes(), "upload of {} bytes at {} overruns a {}-byte buffer", nbytes, offset,
             dst.nbytes());
    std::memcpy(static_cast<std::byte*>(dst.data()) + offset, src, nbytes);
  }
  void download(void* dst, const Buffer& src, size_t offset, size_t nbytes) override {
    MS_CHECK(offset + nbytes <= src.nbytes(), "download of {} bytes at {} overruns a {}-byte buffer", nbytes, offset,
             src.nbytes());
    std::memcpy(dst, static_cast<const std::byte*>(const_cast<Buffer&>(src).data()) + offset, nbytes);
  }
  void upload_weight_into(Buffer& dst, size_t offset, const Tensor& host_f32, bool keep_f32) override {
    upload(dst, offset, host_f32.raw(), host_f32.nbytes());
    if (bf16_ && !keep_f32) {
      float* w = reinterpret_cast<float*>(static_cast<std::byte*>(dst.data()) + offset);
      for (size_t i = 0; i < host_f32.nbytes() / sizeof(float); ++i) w[i] = round_to_bf16(w[i]);
    }
  }
  void synchronize() override {}

  void embedding(const EmbeddingParams& p) override {
    for (int64_t t = 0; t < p.tokens; ++t) {
      float* out = F(p.out) + t * p.hidden;
      const int64_t id = p.ids[t];
      if (id >= p.vocab_begin && id < p.vocab_end) {
        std::memcpy(out, F(p.table) + (id - p.vocab_begin) * p.hidden, p.hidden * sizeof(float));
      } else {
        std::fill(out, out + p.hidden, 0.0f);
      }
    }
  }

  void rms_norm(const RmsNormParams& p) override {
    pool().parallel_for(p.rows, 4, [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r) {
        const float* x = F(p.x) + r * p.x_stride;
        float* y = F(p.y) + r * p.y_stride;
        const float mean_square = dot(x, x, p.dim) / static_cast<float>(p.dim);
        const float inv = 1.0f / std::sqrt(mean_square + p.eps);
        // bf16: weight * (x * inv).to(bf16), rounded (transformers' DeepseekV3RMSNorm).
        for (int64_t i = 0; i < p.dim; ++i) y[i] = store(F(p.weight)[i] * store(x[i] * inv));
      }
    });
  }

  void add(const AddParams& p) override {
    float* acc = F(p.acc);
    const float* x = F(p.x);
    if (p.acc_f32 || !bf16_) {
      for (int64_t i = 0; i < p.count; ++i) acc[i] += x[i];
      return;
    }
    for (int64_t i = 0; i < p.count; ++i) acc[i] = store(acc[i] + (p.x_f32 ? store(x[i]) : x[i]));
  }

  // A quantized weight is the unquantized op on its exact fp32 values (no bf16 rounding of
  // the weight under kBf16: the CUDA kernels multiply by the fp32 dequantized value too).
  void linear(const LinearParams& p) override {
    MS_CHECK(!p.accumulate || p.y_f32, "linear: accumulate needs an fp32 output (y_f32)");
    if (!p.weight_quant.quantized()) return linear_f32(p, F(p.weight));
    check_quant_shape("linear weight", p.out_features, p.in_features, p.weight_quant);
    std::vector<float> weight;  // [out_features, in_features]
    dequantize_into(weight, p.weight, p.out_features, p.in_features, p.weight_quant);
    linear_f32(p, weight.data());
  }
  void rope(const RopeParams& p) override {
    const int64_t half = p.rope_dim / 2;
    for (int64_t t = 0; t < p.tokens; ++t) {
      const float pos = static_cast<float>(p.positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        // torch: freqs = pos.float() * inv_freq (fp32), then cos/sin, then * attention_factor.
        const float angle = pos * p.inv_freq[i];
        const float c = std::cos(angle) * p.attention_factor;
        const float s = std::sin(angle) * p.attention_factor;
        for (int64_t h = 0; h < p.heads; ++h) {
          float* v = F(p.x) + t * p.token_stride + h * p.head_stride;
          const int64_t a = p.interleaved ? 2 * i : i;
          const int64_t b = p.interleaved ? 2 * i + 1 : i + half;
          const float x1 = v[a], x2 = v[b];
          v[a] = store(x1 * c - x2 * s);
          v[b] = store(x2 * c + x1 * s);
        }
      }
    }
  }

  void silu_mul(const SiluMulParams& p) override {
    for (int64_t t = 0; t < p.tokens; ++t) {
      const float* gu = F(p.gate_up) + t * 2 * p.inter;
      float* out = F(p.out) + t * p.inter;
      for (int64_t n = 0; n < p.inter; ++n) out[n] = silu_times(gu[n], gu[p.inter + n]);
    }
  }

  void mla_q_absorb(const MlaQAbsorbParams& p) override {
    pool().parallel_for(static_cast<size_t>(p.tokens * p.heads), 1, [&](size_t begin, size_t end) {
      for (size_t task = begin; task < end; ++task) {
        const int64_t t = static_cast<int64_t>(task) / p.heads, h = static_cast<int64_t>(task) % p.heads;
        const float* q_nope = F(p.q) + (t * p.heads + h) * p.q_head_stride;
        const float* w_uk = F(p.kv_b) + h * (p.nope + p.v) * p.latent;  // [nope, latent]
        float* out = F(p.q_latent) + (t * p.heads + h) * p.latent;
        std::fill(out, out + p.latent, 0.0f);
        for (int64_t d = 0; d < p.nope; ++d) {
          const float q = q_nope[d];
          const float* row = w_uk + d * p.latent;
          for (int64_t l = 0; l < p.latent; ++l) out[l] += q * row[l];
        }
        for (int64_t l = 0; l < p.latent; ++l) out[l] = store(out[l]);
      }
    });
  }

  void mla_v_up(const MlaVUpParams& p) override {
    pool().parallel_for(static_cast<size_t>(p.tokens * p.heads), 1, [&](size_t begin, size_t end) {
      for (size_t task = begin; task < end; ++task) {
        const int64_t t = static_cast<int64_t>(task) / p.heads, h = static_cast<int64_t>(task) % p.heads;
        const float* lat = F(p.attn_latent) + (t * p.heads + h) * p.latent;
        const float* w_uv = F(p.kv_b) + (h * (p.nope + p.v) + p.nope) * p.latent;  // [v, latent]
        float* out = F(p.out) + (t * p.heads + h) * p.v;
        for (int64_t j = 0; j < p.v; ++j) out[j] = store(dot(w_uv + j * p.latent, lat, p.latent));
      }
    });
  }

  // fp8: the cache keeps each element's e4m3 code as its (exact) float value, as the GPU's
  // byte decodes; mla_attention applies the scale.
  void kv_write(const KvWriteParams& p) override {
    for (int64_t t = 0; t < p.tokens; ++t) {
      float* row = F(p.cache) + static_cast<int64_t>(p.slots[t]) * p.width;
      const float* entry = F(p.entries) + t * p.width;
      if (!p.fp8) {
        std::memcpy(row, entry, p.width * sizeof(float));
        continue;
      }
      for (int64_t i = 0; i < p.width; ++i) row[i] = f8_e4m3_to_f32(f32_to_f8_e4m3(entry[i] / p.fp8_scale));
    }
  }

  void mla_attention(const MlaAttentionParams& p) override {
    const int64_t width = p.latent + p.rope;
    // An fp8 cache holds codes: the scores and the output take its scale (as the GPU kernel).
    const float score_scale = p.cache_fp8 ? p.scale * p.cache_scale : p.scale;
    const float value_scale = p.cache_fp8 ? p.cache_scale : 1.0f;
    pool().parallel_for(static_cast<size_t>(p.tokens * p.heads), 1, [&](size_t begin, size_t end) {
      std::vector<float> scores;
      for (size_t task = begin; task < end; ++task) {
        const int64_t t = static_cast<int64_t>(task) / p.heads, h = static_cast<int64_t>(task) % p.heads;
        const float* q_lat = F(p.q_latent) + (t * p.heads + h) * p.latent;
        const float* q_rope = F(p.q_rope) + (t * p.heads + h) * p.q_head_stride + p.rope_offset;
        const int32_t* table = p.block_tables + static_cast<int64_t>(p.seq_of_token[t]) * p.max_pages_per_seq;
        const int64_t length = static_cast<int64_t>(p.positions[t]) + 1;
        scores.resize(length);
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < length; ++j) {
          const float* entry =
              F(p.cache) + (static_cast<int64_t>(table[j / p.page_size]) * p.page_size + j % p.page_size) * width;
          const float s = (dot(q_lat, entry, p.latent) + dot(q_rope, entry + p.latent, p.rope)) * score_scale;
          scores[j] = s;
          max_score = std::max(max_score, s);
        }
        float denom = 0.0f;
        for (int64_t j = 0; j < length; ++j) denom += (scores[j] = std::exp(scores[j] - max_score));
        float* out = F(p.out) + (t * p.heads + h) * p.latent;
        std::fill(out, out + p.latent, 0.0f);
        for (int64_t j = 0; j < length; ++j) {
          const float* entry =
              F(p.cache) + (static_cast<int64_t>(table[j / p.page_size]) * p.page_size + j % p.page_size) * width;
          const float w = scores[j] / denom;
          for (int64_t l = 0; l < p.latent; ++l) out[l] += w * entry[l];
        }
        for (int64_t l = 0; l < p.latent; ++l) out[l] = store(out[l] * value_scale);
      }
    });
  }

  void moe_route(const MoeRouteParams& p) override {
    const int64_t group_size = p.experts / p.n_group;
    pool().parallel_for(p.tokens, 1, [&](size_t begin, size_t end) {
      std::vector<float> scores(p.experts), choice(p.experts), group_scores(p.n_group);
      std::vector<int64_t> order(std::max(p.experts, p.n_group));
      for (size_t t = begin; t < end; ++t) {
        const float* x = F(p.x) + t * p.hidden;
        for (int64_t e = 0; e < p.experts; ++e) {
          const float logit = dot(p.weight + e * p.hidden, x, p.hidden);
          scores[e] = 1.0f / (1.0f + std::exp(-logit));
          choice[e] = scores[e] + p.bias[e];
        }
        // Group score = sum of the group's two best biased scores.
        for (int64_t g = 0; g < p.n_group; ++g) {
          float best = -std::numeric_limits<float>::infinity(), second = best;
          for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) {
            if (choice[e] > best) {
              second = best;
              best = choice[e];
            } else if (choice[e] > second) {
              second = choice[e];
            }
          }
          group_scores[g] = best + second;
        }
        auto by_score_desc = [](const std::vector<float>& s) {
          return [&s](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
        };
        std::iota(order.begin(), order.begin() + p.n_group, 0);
        std::partial_sort(order.begin(), order.begin() + p.topk_group, order.begin() + p.n_group,
                          by_score_desc(group_scores));
        std::vector<bool> group_kept(p.n_group, false);
        for (int64_t i = 0; i < p.topk_group; ++i) group_kept[order[i]] = true;
        for (int64_t e = 0; e < p.experts; ++e)
          if (!group_kept[e / group_size]) choice[e] = -std::numeric_limits<float>::infinity();
        std::iota(order.begin(), order.begin() + p.experts, 0);
        std::partial_sort(order.begin(), order.begin() + p.top_k, order.begin() + p.experts, by_score_desc(choice));
        float sum = 0.0f;
        for (int64_t k = 0; k < p.top_k; ++k) sum += scores[order[k]];
        const float denom = sum + 1e-20f;
        for (int64_t k = 0; k < p.top_k; ++k) {
          float w = scores[order[k]];
          if (p.norm_topk_prob) w /= denom;
          p.topk_ids[t * p.top_k + k] = static_cast<int32_t>(order[k]);
          p.topk_weights[t * p.top_k + k] = w * p.routed_scaling_factor;
        }
      }
    });
  }

  // Expert by expert: each local expert's w13 / w2 (dequantized to fp32 once when quantized)
  // is applied to every (token, k) pair routed to it; then each token sums its pairs in k
  // order, so the result does not depend on the partition or the thread count.
  void moe_experts(const MoeExpertsParams& p) override {
    const bool quantized = p.expert_quant.quantized();
    if (quantized) {
      check_quant_shape("moe_experts w13", 2 * p.inter, p.hidden, p.expert_quant);
      check_quant_shape("moe_experts w2", p.hidden, p.inter, p.expert_quant);
    }
    std::vector<std::vector<int64_t>> pairs_of_expert(static_cast<size_t>(p.expert_end - p.expert_begin));
    for (int64_t i = 0; i < p.tokens * p.top_k; ++i) {
      const int64_t e = p.topk_ids[i];
      if (e >= p.expert_begin && e < p.expert_end) pairs_of_expert[e - p.expert_begin].push_back(i);
    }
    std::vector<float> down(static_cast<size_t>(p.tokens * p.top_k * p.hidden));  // [tokens * top_k, hidden]
    std::vector<float> w13_f32, w2_f32;  // a quantized expert's [2 * inter, hidden], [hidden, inter]
    for (size_t local = 0; local < pairs_of_expert.size(); ++local) {
      if (pairs_of_expert[local].empty()) continue;
      const float* w13 = F(p.w13[local]);
      const float* w2 = F(p.w2[local]);
      if (quantized) {
        dequantize_into(w13_f32, p.w13[local], 2 * p.inter, p.hidden, p.expert_quant);
        dequantize_into(w2_f32, p.w2[local], p.hidden, p.inter, p.expert_quant);
        w13 = w13_f32.data();
        w2 = w2_f32.data();
      }
      expert_down(p, w13, w2, pairs_of_expert[local], down.data());
    }
    pool().parallel_for(static_cast<size_t>(p.tokens), 1, [&](size_t begin, size_t end) {
      std::vector<float> routed(p.hidden);
      for (size_t t = begin; t < end; ++t) {
        std::fill(routed.begin(), routed.end(), 0.0f);
        for (int64_t k = 0; k < p.top_k; ++k) {
          const int64_t pair = static_cast<int64_t>(t) * p.top_k + k, e = p.topk_ids[pair];
          if (e < p.expert_begin || e >= p.expert_end) continue;
          const float w = p.topk_weights[pair];
          for (int64_t n = 0; n < p.hidden; ++n) routed[n] += w * down[pair * p.hidden + n];
        }
        write_routed(p, F(p.out) + t * p.hidden, routed.data());
      }
    });
  }

  void fill_uniform(const FillUniformParams& p) override {
    pool().parallel_for(static_cast<size_t>(p.rows), 64, [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r)
        for (int64_t c = 0; c < p.cols; ++c) {
          const float v =
              p.offset +
              p.amplitude * uniform_pm1(p.seed, static_cast<uint64_t>((p.row0 + r) * p.full_cols + p.col0 + c));
          if (p.out_bf16) {
            static_cast<uint16_t*>(p.out)[r * p.cols + c] = f32_to_bf16(v);
          } else {
            F(p.out)[r * p.cols + c] = p.out_f32 ? v : store(v);
          }
        }
    });
  }

  void fill_random_words(const FillRandomWordsParams& p) override {
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t i = 0; i < p.words; ++i)
        p.out[r * p.words + i] = random_word(p.seed, static_cast<uint64_t>(p.word0 + r * p.index_stride + i)) & p.mask;
  }

  void gather_rows(const GatherRowsParams& p) override {
    for (int64_t r = 0; r < p.num_rows; ++r)
      std::memcpy(F(p.dst) + r * p.width, F(p.src) + static_cast<int64_t>(p.rows[r]) * p.width,
                  p.width * sizeof(float));
  }

  void row_combine(const RowCombineParams& p) override {
    pool().parallel_for(static_cast<size_t>(p.rows), 1, [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r) {
        float* out = F(p.out) + r * p.width;
        if (!p.accumulate) std::fill(out, out + p.width, 0.0f);
        for (int32_t i = p.offsets[r]; i < p.offsets[r + 1]; ++i) {
          const float w = p.weights[i];
          const float* row = F(p.src) + static_cast<int64_t>(p.src_rows[i]) * p.width;
          for (int64_t n = 0; n < p.width; ++n) out[n] += w * row[n];
        }
        if (!p.out_f32)
          for (int64_t n = 0; n < p.width; ++n) out[n] = store(out[n]);
      }
    });
  }

  void argmax_rows(const ArgmaxRowsParams& p) override {
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* row = p.logits + r * p.vocab;
      const int64_t best = std::max_element(row, row + p.vocab) - row;  // first maximum
      p.values[r] = row[best];
      p.ids[r] = static_cast<int32_t>(best + p.id_offset);
    }
  }

  void apply_token_bitmask(const TokenBitmaskParams& p) override {
    for (int64_t r = 0; r < p.rows; ++r) {
      const int32_t* mask = p.bitmask + r * p.words;
      if (std::all_of(mask, mask + p.words, [](int32_t w) { return w == -1; })) continue;  // unconstrained
      float* row = p.logits + r * p.vocab;
      for (int64_t i = 0; i < p.vocab; ++i) {
        const int64_t id = i + p.id_offset;
        if (!((static_cast<uint32_t>(mask[id / 32]) >> (id % 32)) & 1u)) row[i] = -INFINITY;
      }
    }
  }

  void top_candidates(const TopCandidatesParams& p) override {
    pool().parallel_for(static_cast<size_t>(p.rows), 1, [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r) {
        top_candidates_row(p.logits + r * p.vocab, p.vocab, p.count, p.temperatures[r], p.values + r * p.count,
                           p.ids + r * p.count, p.normaliser + r);
        for (int64_t i = 0; i < p.count; ++i) p.ids[r * p.count + i] += static_cast<int32_t>(p.id_offset);
      }
    });
  }

  void logit_adjust(const LogitAdjustParams& p) override {
    const int64_t local = p.parts * p.vocab_part;
    for (int32_t i = 0; i < *p.count && i < p.capacity; ++i) {
      const LogitAdjustEntry& e = p.entries[i];
      const int64_t id = e.token - p.vocab_begin;
      if (e.row < 0 || e.row >= p.rows || id < 0 || id >= local) continue;  // another rank's slice
      float& logit = p.logits[((id / p.vocab_part) * p.rows + e.row) * p.vocab_part + id % p.vocab_part];
      logit = adjusted_logit(logit, e);
    }
  }

  void sample(const SampleParams& p) override {
    const int64_t logit_rows = checked_logit_rows(p), width = p.vocab / p.slices;
    pool().parallel_for(static_cast<size_t>(p.rows), 1, [&](size_t begin, size_t end) {
      std::vector<float> row;
      for (size_t r = begin; r < end; ++r) {
        const int64_t id = sample_logit_row(p, static_cast<int64_t>(r));
        const float* logits = p.logits + id * width;
        if (p.slices > 1) {  // the row's slices, one after the other
          row.resize(static_cast<size_t>(p.vocab));
          for (int64_t s = 0; s < p.slices; ++s)
            std::memcpy(row.data() + s * width, p.logits + (s * logit_rows + id) * width, width * sizeof(float));
          logits = row.data();
        }
        p.tokens[r] = sample_row(logits, p.vocab, p.options[r]);
      }
    });
  }

 private:
  // down[pair, :] = w2 @ silu_mul(w13 @ x[pair / top_k]) for the pairs routed to one expert.
  // bf16: gate, up and the down projection are bf16 linear outputs, silu(gate) is rounded too
  // (transformers' DeepseekV3MLP; the CUDA expert kernels round at the same points). Many
  // pairs: parallel over pairs; few: parallel inside each matvec (same dots, same result).
  void expert_down(const MoeExpertsParams& p, const float* w13, const float* w2, const std::vector<int64_t>& pairs,
                   float* down) const {
    auto run = [&](int64_t pair, std::vector<float>& gate_up, std::vector<float>& act, bool inner_parallel) {
      const float* x = F(p.x) + (pair / p.top_k) * p.hidden;
      float* d = down + pair * p.hidden;
      if (inner_parallel) {
        matvec(w13, x, gate_up.data(), 2 * p.inter, p.hidden, false);
        for (float& v : gate_up) v = store(v);
      } else {
        for (int64_t n = 0; n < 2 * p.inter; ++n) gate_up[n] = store(dot(w13 + n * p.hidden, x, p.hidden));
      }
      for (int64_t n = 0; n < p.inter; ++n) act[n] = silu_times(gate_up[n], gate_up[p.inter + n]);
      if (inner_parallel) {
        matvec(w2, act.data(), d, p.hidden, p.inter, false);
        for (int64_t n = 0; n < p.hidden; ++n) d[n] = store(d[n]);
      } else {
        for (int64_t n = 0; n < p.hidden; ++n) d[n] = store(dot(w2 + n * p.inter, act.data(), p.inter));
      }
    };
    if (pairs.size() >= pool().size()) {
      pool().parallel_for(pairs.size(), 1, [&](size_t begin, size_t end) {
        std::vector<float> gate_up(2 * p.inter), act(p.inter);
        for (size_t j = begin; j < end; ++j) run(pairs[j], gate_up, act, false);
      });
      return;
    }
    std::vector<float> gate_up(2 * p.inter), act(p.inter);
    for (const int64_t pair : pairs) run(pair, gate_up, act, true);
  }

  // The routed sum of one token is added to what `out` holds in one addition (out = out + routed).
  void write_routed(const MoeExpertsParams& p, float* out, const float* routed) const {
    for (int64_t n = 0; n < p.hidden; ++n) {
      const float sum = p.accumulate ? out[n] + routed[n] : routed[n];
      out[n] = p.out_f32 ? sum : store(sum);
    }
  }

  // y = x @ weight^T with weight fp32 [out_features, in_features].
  void linear_f32(const LinearParams& p, const float* weight) const {
    // Parallel over (row, output block) so that both decode (1 row) and prefill use all cores.
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (p.out_features + kBlock - 1) / kBlock;
    pool().parallel_for(static_cast<size_t>(p.rows * blocks), 1, [&](size_t begin, size_t end) {
      for (size_t task = begin; task < end; ++task) {
        const int64_t r = static_cast<int64_t>(task) / blocks;
        const int64_t n0 = (static_cast<int64_t>(task) % blocks) * kBlock;
        const int64_t n1 = std::min(p.out_features, n0 + kBlock);
        const float* x = F(p.x) + r * p.x_stride;
        float* y = F(p.y) + r * p.y_stride;
        for (int64_t n = n0; n < n1; ++n) {
          const float v = dot(weight + n * p.in_features, x, p.in_features);
          const float sum = p.accumulate ? y[n] + v : v;
          y[n] = p.y_f32 ? sum : store(sum);
        }
      }
    });
  }

  // A value the CUDA kernels store in bf16: rounded under kBf16, as is under kFp32.
  float store(float v) const { return bf16_ ? round_to_bf16(v) : v; }
  // silu(gate) * up; under kBf16 silu(gate) is rounded first and the product after.
  float silu_times(float gate, float up) const { return store(store(silu(gate)) * up); }

  const bool bf16_;
};

}  // namespace

float dot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: vectorisable and in a fixed order.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

std::unique_ptr<ops::Backend> make_cpu_backend(CpuNumerics numerics) { return std::make_unique<CpuBackend>(numerics); }

}  // namespace moeserve::cpu
