// QuantizationConfig: what a checkpoint's `quantization_config` says about how its weights are
// stored (compressed-tensors pack-quantized W4A16 as in Kimi K2.6, or DeepSeek-V3's block FP8),
// and stored_bytes(): the one formula per storage format behind every byte count of the
// weight accounting (plan show, --mem-per-rank, inspect), built on the ops' packed layout
// (ops/quant_layout.h) so that the checkpoint, the loader and the backends count alike.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops/quant_layout.h"

namespace moeserve {

enum class QuantMethod { none, int4_pack_quantized, fp8_block };
// Which weights a method covers: only the routed experts' linears (K2.6: every other linear is
// on the ignore list), or every linear but the ignored ones.
enum class QuantCoverage { none, routed_experts, linears_except_ignored };

struct QuantizationConfig {
  QuantMethod method = QuantMethod::none;
  int64_t group_size = 0;  // int4: weights per bf16 scale along K (32, 64 or 128)
  int64_t block_n = 0;     // fp8: one fp32 scale per block_n x block_k weights
  int64_t block_k = 0;
  QuantCoverage coverage = QuantCoverage::none;
  std::vector<std::string> ignore;  // module names and "re:" patterns kept at the activation dtype

  // "" | "int4-pack-quantized" | "fp8"
  std::string name() const;
  // "INT4 routed experts, group 32" | "FP8 e4m3 linears, block 128x128" | "none"
  std::string describe() const;
  // Whether the linear module `module` (a tensor name without ".weight", with or without the
  // model's tensor prefix) is on the ignore list.
  bool ignored(const std::string& module) const;
  // Whether the linear `module` is stored quantized; `routed_expert` says it is one of the
  // routed experts' projections. Embeddings, norms and the router are never quantized.
  bool quantizes(const std::string& module, bool routed_expert) const;

 private:
  std::shared_ptr<const std::vector<std::regex>> patterns_;  // the "re:" entries, compiled
  std::string tensor_prefix_;                                // stripped before matching
  friend QuantizationConfig parse_quantization_config(const nlohmann::json&, const std::string&, const std::string&,
                                                      const std::string&);
};

// Parses `object` (a config's `quantization_config`); `path` names it in errors (e.g.
// "quantization_config." or "text_config.quantization_config."), `tensor_prefix` the model's.
// Throws Error naming the first unsupported field.
QuantizationConfig parse_quantization_config(const nlohmann::json& object, const std::string& source,
                                             const std::string& path, const std::string& tensor_prefix);

// How one tensor is stored in the checkpoint.
struct WeightFormat {
  QuantMethod method = QuantMethod::none;
  int64_t element_bytes = 2;  // none: bytes per element (the activation dtype)
  int64_t group_size = 0;     // int4_pack_quantized
  int64_t block_n = 0;        // fp8_block
  int64_t block_k = 0;
};

// A weight's [N, K] (out, in) shape; 1-D tensors are [N, 1].
struct WeightShape {
  int64_t rows = 0;
  int64_t cols = 1;
};

// The ops' layout of a weight stored in `format` (WeightQuant::none when not quantized).
ops::QuantLayout quant_layout(const WeightFormat& format);

// Bytes the checkpoint stores for a weight of `shape` in `format`: the packed values and the
// scales of ops/quant_layout.h without the padding between them (backend buffers add it):
//   none:  N*K*element_bytes
//   int4:  N*K/2 (8 per int32 along K) + bf16 scales N*(K/group)*2
//   fp8:   N*K (e4m3) + fp32 weight_scale_inv 4*ceil(N/bn)*ceil(K/bk)
int64_t stored_bytes(const WeightShape& shape, const WeightFormat& format);

// How the checkpoint stores each linear of a model: the one lookup behind the accounting, the
// loader and the step cost. The routed experts of a layer share a format per projection
// (ignore patterns that single out one expert are not told apart): matched once per layer.
class WeightFormats {
 public:
  WeightFormats(const QuantizationConfig& q, int64_t element_bytes) : q_(q), element_bytes_(element_bytes) {}
  // Not quantized: norms, embeddings, the router, biases.
  WeightFormat plain() const { return {QuantMethod::none, element_bytes_, 0, 0, 0}; }
  // The linear `module` (a tensor name without ".weight"); `routed_expert`: a
  // "...mlp.experts.E.<proj>" projection.
  WeightFormat linear(const std::string& module, bool routed_expert);

 private:
  const QuantizationConfig& q_;
  int64_t element_bytes_;
  std::unordered_map<std::string, bool> expert_quantized_;  // by module with the expert index cut out
};

}  // namespace moeserve
