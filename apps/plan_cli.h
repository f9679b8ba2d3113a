// The plan options shared by `generate`, `serve` and `plan show`: a preset (--plan / positional) or
// SGLang's explicit flags, and the memory-fit check (--mem-per-rank with --context-length
// and --max-running-requests).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/deepseek_v3.h"
#include "parallel/memory_fit.h"
#include "parallel/plan.h"
#include "parallel/plan_parse.h"

namespace moeserve::apps {

struct PlanCliArgs {
  std::string preset;
  parallel::PlanFlags flags;
  std::string mem_per_rank;    // "" : no memory check
  int64_t context_length = 0;  // 0 : the model's max_position_embeddings
  int64_t max_running_requests = 1;
  bool kv_cache_fp8 = false;  // --kv-cache-dtype fp8_e4m3: the fit counts one byte per cached element
};

// The KV-cache page and pipeline micro-batch options of the engine, shared by `generate`
// and `serve`.
struct EngineCliArgs {
  int64_t page_size = 64;  // FlashMLA's page; the prefix cache shares whole pages
  int64_t pp_max_micro_batch_size = 0;
  int64_t pp_async_batch_depth = 0;
  std::string reduction_plan = "single";
  bool batch_invariant = false;
  std::string kv_cache_dtype = "auto";
};

// Adds --reduction-plan (ModelRunOptions), and parses it.
void add_reduction_plan_flag(CLI::App* cmd, std::string& reduction_plan);
ModelRunOptions run_options_for(const std::string& reduction_plan);

// Adds --batch-invariant (EngineOptions::batch_invariant).
void add_batch_invariant_flag(CLI::App* cmd, bool& batch_invariant);

// Adds --kv-cache-dtype (vLLM's and SGLang's name): auto or bf16, or fp8_e4m3 (scale 1).
void add_kv_cache_dtype_flag(CLI::App* cmd, std::string& kv_cache_dtype);
// Whether the flag's value asks for an fp8 cache (EngineOptions::kv_cache_fp8); throws naming
// the flag for any other value.
bool kv_cache_fp8(const std::string& kv_cache_dtype);

// Adds --page-size, --pp-max-micro-batch-size, --pp-async-batch-depth, --reduction-plan,
// --batch-invariant and --kv-cache-dtype.
void add_engine_flags(CLI::App* cmd, EngineCliArgs& args);

// Adds --tp-size, --ep-size, --pp-size, --dp-size, --enable-dp-attention and the memory
// options (the preset option itself is added by the command).
void add_plan_flags(CLI::App* cmd, PlanCliArgs& args);

// The plan the options describe, validated against the model; when --mem-per-rank is given,
// also checked to fit (weights as stored, unquantized ones and KV cache at `bytes_per_element`);
// `fit`, when given, receives how it fits.
parallel::ParallelPlan plan_for_model(const PlanCliArgs& args, const ModelConfig& config, int64_t bytes_per_element,
                                      parallel::MemoryFit* fit = nullptr);

}  // namespace moeserve::apps
