// Fuzz target: a config.json as `inspect` and the loader read it (ModelConfig::from_file, with its
// quantization_config). An accepted config must pass validate() again, and everything the CLI
// computes from it at once (parameter counts, stored bytes per format, the quantization's
// description and ignore patterns) must run without overflow (UBSan) and give positive sizes.
#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "model/config.h"
#include "model/deepseek_v3_weights.h"

namespace {

// Linear modules the quantization is asked about by the weight accounting.
constexpr const char* kModules[] = {
    "lm_head", "model.layers.0.self_attn.q_a_proj", "model.layers.3.mlp.experts.7.gate_proj",
    "model.layers.3.mlp.shared_experts.down_proj", "language_model.model.layers.1.self_attn.o_proj"};

void check_accepted(const moeserve::ModelConfig& config) {
  config.validate();  // throws only on a defect: from_json validated it
  const moeserve::ParameterCounts counts = moeserve::count_parameters(config);
  MS_FUZZ_ASSERT(counts.total > 0 && counts.active_per_token > 0 && counts.routed_experts >= 0,
                 "non-positive parameter counts");
  MS_FUZZ_ASSERT(counts.active_per_token <= counts.total, "more active than total parameters");
  MS_FUZZ_ASSERT(moeserve::stored_model_bytes(config) > 0, "non-positive stored bytes");
  MS_FUZZ_ASSERT(!config.quantization.describe().empty(), "empty quantization description");
  for (const char* module : kModules) config.quantization.quantizes(module, /*routed_expert=*/true);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::clear_scratch_dir();
  moeserve::fuzz::write_scratch_file("config.json", moeserve::fuzz::as_text(data, size));
  moeserve::ModelConfig config;
  try {
    config = moeserve::ModelConfig::from_file(moeserve::fuzz::scratch_dir() + "/config.json");
  } catch (const moeserve::Error&) {
    return 0;
  }
  check_accepted(config);
  return 0;
}
