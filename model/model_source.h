// Opening a model by its spec:
//   synthetic:NAME[:layers=N][:seed=S][:dtype=bf16]
//                                       built-in synthetic model (tiny, small, kimi-k2.6,
//                                       kimi-k2, deepseek-v3, moonlight); kimi-k2.6 has INT4
//                                       routed experts (group 32) and deepseek-v3 FP8 128x128
//                                       blocks like the published checkpoints, unless dtype=bf16
//   DIR                                 Hugging Face directory (config.json + safetensors)
//   FILE.json                           a bare config.json (shapes only: inspect, plan show)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weight_source.h"

namespace moeserve {

struct ModelSource {
  std::string spec;
  ModelConfig config;
  bool synthetic = false;
  std::shared_ptr<const Checkpoint> checkpoint;  // null for synthetic and bare configs
  uint64_t seed = 0;                             // synthetic only
  std::string directory;                         // model directory ("" for synthetic)

  // A fresh weight source (each rank gets its own so `touched()` is per rank). Throws for a
  // bare config, which has no weights.
  std::unique_ptr<WeightSource> weights() const;
};

ModelSource open_model(const std::string& spec);

// published: quantized as the published checkpoint is (kimi-k2.6, deepseek-v3); bf16: none.
enum class SyntheticDtype { published, bf16 };

// The config of a synthetic preset, with its layer count overridden when layers > 0.
ModelConfig synthetic_config(const std::string& name, int64_t layers = 0,
                             SyntheticDtype dtype = SyntheticDtype::published);
std::vector<std::string> synthetic_preset_names();

// The published checkpoints' quantization: Kimi K2.6's INT4 routed experts (group 32, every
// other linear ignored) and DeepSeek-V3's FP8 128x128 blocks, parsed like a config.json's
// (tensor names under `tensor_prefix`); none for other names.
QuantizationConfig published_quantization(const std::string& name, const std::string& tensor_prefix);

}  // namespace moeserve
