// How many KV cache pages `serve` gives each DP replica: --kv-pages when given, else on GPUs
// what --mem-fraction-static leaves after the weights (SGLang's rule: weights + KV cache take
// that fraction of each GPU's memory, the rest is for activations, CUDA graphs and cuBLAS),
// and on CPU ranks a fixed default.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "parallel/plan.h"

namespace moeserve::apps {

// The CPU default: host memory is not measured, and a CPU step is slow anyway.
constexpr int64_t kDefaultCpuKvPages = 2048;
// SGLang's default on 80+ GB GPUs is about this (it lowers it for small ones).
constexpr double kDefaultMemFractionStatic = 0.85;

struct KvSizingParams {
  const ModelConfig& config;
  const parallel::ParallelPlan& plan;
  std::string backend;             // "cuda": measured; anything else: kDefaultCpuKvPages
  int64_t page_size = 64;          // tokens per page
  int64_t kv_pages = 0;            // --kv-pages; > 0 wins over the fraction
  double mem_fraction_static = 0;  // --mem-fraction-static; 0: kDefaultMemFractionStatic
  bool kv_cache_fp8 = false;       // --kv-cache-dtype fp8_e4m3: one byte per cached element
  bool mtp = false;                // the MTP layer loaded (NEXTN): the last stage holds more (mtp_extra)
};

struct KvSizing {
  int64_t pages = 0;   // per DP replica, one of them kept for batch padding
  int64_t tokens = 0;  // (pages - 1) * page_size: what requests can hold
  std::string how;     // for the start-up line: "--kv-pages", or the fraction and memory
};

// Throws when the fraction is outside (0, 1) or leaves no room for the cache on some GPU (the
// error names the GPU, its memory and its weights).
KvSizing size_kv_cache(const KvSizingParams& params);

}  // namespace moeserve::apps
