#include "apps/kv_sizing.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <limits>

#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "parallel/memory_fit.h"
#include "runtime/rank_devices.h"

namespace moeserve::apps {

namespace {

constexpr int64_t kBf16Bytes = 2;  // the CUDA backend's weights and KV cache element

struct RankFootprint {
  int64_t weights = 0, page_bytes = 0;
};

// What rank r holds beside its KV pages, and a page's bytes. With the MTP layer (NEXTN) the
// last stage also holds that layer (counted as one of its stage's layers on average), its
// latent cache (one more layer's per token) and the hidden-state store (two hidden rows per
// cached token, model/deepseek_v3.cc).
RankFootprint footprint(const KvSizingParams& p, int rank) {
  RankFootprint f;
  f.weights = rank_weights(p.config, p.plan, rank, kBf16Bytes).held_bytes;
  const int64_t kv_element_bytes = p.kv_cache_fp8 ? 1 : kBf16Bytes;
  int64_t per_token = kv_bytes_per_token(p.config, p.plan, rank, kv_element_bytes);
  const parallel::RankShard shard = parallel::shard_of(p.plan, shard_dims(p.config), rank);
  if (p.mtp && shard.last_stage) {
    f.weights += f.weights / std::max<int64_t>(shard.layers.size(), 1);
    per_token +=
        (p.config.kv_lora_rank + p.config.qk_rope_head_dim) * kv_element_bytes + 2 * p.config.hidden_size * kBf16Bytes;
  }
  f.page_bytes = per_token * p.page_size;
  return f;
}

// Pages rank r's GPU holds: (free now - total * (1 - fraction) - its weights) / page bytes.
int64_t pages_on_gpu(const KvSizingParams& p, double fraction, int rank, std::string& tightest) {
  const runtime::GpuMemory memory = runtime::gpu_memory(rank);
  const RankFootprint f = footprint(p, rank);
  const int64_t weights = f.weights, page_bytes = f.page_bytes;
  const double reserved = static_cast<double>(memory.total_bytes) * (1.0 - fraction);
  const double room = static_cast<double>(memory.free_bytes) - reserved - static_cast<double>(weights);
  MS_CHECK(room >= 2.0 * static_cast<double>(page_bytes),
           "--mem-fraction-static {}: GPU {} has {} free of {}; keeping {} for activations and {} of weights leaves no "
           "room for the KV cache (raise the fraction, or choose a plan with more ranks)",
           fraction, rank, parallel::format_bytes(static_cast<double>(memory.free_bytes)),
           parallel::format_bytes(static_cast<double>(memory.total_bytes)), parallel::format_bytes(reserved),
           parallel::format_bytes(static_cast<double>(weights)));
  tightest = fmt::format("GPU {}: {} free of {}, {} of weights", rank,
                         parallel::format_bytes(static_cast<double>(memory.free_bytes)),
                         parallel::format_bytes(static_cast<double>(memory.total_bytes)),
                         parallel::format_bytes(static_cast<double>(weights)));
  return static_cast<int64_t>(room / static_cast<double>(page_bytes));
}

}  // namespace

KvSizing size_kv_cache(const KvSizingParams& p) {
  MS_CHECK(p.page_size > 0, "--page-size must be positive, got {}", p.page_size);
  MS_CHECK(p.kv_pages >= 0, "--kv-pages must be >= 0 (0: sized from memory), got {}", p.kv_pages);
  KvSizing out;
  if (p.kv_pages > 0) {
    out.pages = p.kv_pages;
    out.how = "--kv-pages";
  } else if (p.backend != "cuda") {
    out.pages = kDefaultCpuKvPages;
    out.how = "the CPU default";
  } else {
    const double fraction = p.mem_fraction_static > 0 ? p.mem_fraction_static : kDefaultMemFractionStatic;
    MS_CHECK(fraction < 1.0, "--mem-fraction-static {} must be in (0, 1)", fraction);
    out.pages = std::numeric_limits<int64_t>::max();
    std::string tightest;
    for (int r = 0; r < p.plan.world(); ++r) {  // every replica's pages fit its tightest rank
      std::string what;
      const int64_t pages = pages_on_gpu(p, fraction, r, what);
      if (pages < out.pages) {
        out.pages = pages;
        tightest = what;
      }
    }
    // Cache slots are int32 in the step's tables.
    out.pages = std::min(out.pages, static_cast<int64_t>(INT_MAX) / p.page_size);
    out.how = fmt::format("--mem-fraction-static {} ({})", fraction, tightest);
  }
  out.tokens = (out.pages - 1) * p.page_size;
  return out;
}

}  // namespace moeserve::apps
