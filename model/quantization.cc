#include "model/quantization.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moeserve {

namespace {

using json = nlohmann::json;

constexpr int64_t kMaxBlockSize = int64_t{1} << 16;

// Where a field sits, for errors: "<source>: field '<path><key>'".
struct Where {
  const std::string& source;
  std::string path;
  Where in(const std::string& key) const { return {source, path + key + "."}; }
  std::string field(const std::string& key) const { return fmt::format("{}: field '{}{}'", source, path, key); }
};

const json* member(const json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || object.at(key).is_null()) return nullptr;
  return &object.at(key);
}

std::string string_field(const json& object, const char* key, const Where& at, const std::string& fallback) {
  const json* v = member(object, key);
  if (v == nullptr) return fallback;
  MS_CHECK(v->is_string(), "{} must be a string, got {}", at.field(key), v->dump());
  return v->get<std::string>();
}

std::vector<std::string> ignore_list(const json& object, const char* key, const Where& at) {
  std::vector<std::string> out;
  const json* v = member(object, key);
  if (v == nullptr) return out;
  MS_CHECK(v->is_array(), "{} must be a list of module names and 're:' patterns, got {}", at.field(key), v->dump());
  for (const json& entry : *v) {
    MS_CHECK(entry.is_string(), "{} must hold strings, got {}", at.field(key), entry.dump());
    out.push_back(entry.get<std::string>());
  }
  return out;
}

// A scheme's `weights`: symmetric int4 with static scales per group of 32, 64 or 128 along K.
int64_t parse_int4_weights(const json& weights, const Where& w) {
  const json* bits = member(weights, "num_bits");
  MS_CHECK(bits != nullptr && *bits == 4, "{} is {}; only 4-bit pack-quantized weights are supported",
           w.field("num_bits"), bits ? bits->dump() : "missing");
  const std::string type = string_field(weights, "type", w, "int");
  MS_CHECK(type == "int", "{} is '{}'; only 'int' is supported", w.field("type"), type);
  const json* symmetric = member(weights, "symmetric");
  MS_CHECK(symmetric == nullptr || *symmetric == true, "{} is {}; only symmetric int4 is supported",
           w.field("symmetric"), symmetric ? symmetric->dump() : "");
  const std::string strategy = string_field(weights, "strategy", w, "");
  MS_CHECK(strategy == "group", "{} is '{}'; only 'group' is supported", w.field("strategy"), strategy);
  const json* dynamic = member(weights, "dynamic");
  MS_CHECK(dynamic == nullptr || *dynamic == false, "{} is {}; only static weight scales are supported",
           w.field("dynamic"), dynamic ? dynamic->dump() : "");
  const json* size = member(weights, "group_size");
  const bool supported = size != nullptr && (*size == 32 || *size == 64 || *size == 128);
  MS_CHECK(supported, "{} is {}; supported: 32, 64, 128", w.field("group_size"), size ? size->dump() : "missing");
  return size->get<int64_t>();
}

// The one quantization scheme of a compressed-tensors config: its weights' settings (an
// object), checked to be symmetric int4 by group without activation quantization.
int64_t parse_int4_group(const json& q, const Where& at) {
  const json* groups = member(q, "config_groups");
  MS_CHECK(groups != nullptr && groups->is_object() && groups->size() == 1, "{} must hold exactly one scheme (got {})",
           at.field("config_groups"), groups ? groups->dump() : "none");
  const std::string name = groups->begin().key();
  const json& group = groups->begin().value();
  const Where g = at.in("config_groups").in(name);
  const json* targets = member(group, "targets");
  MS_CHECK(targets != nullptr && *targets == json::array({"Linear"}), "{} is {}; only [\"Linear\"] is supported",
           g.field("targets"), targets ? targets->dump() : "missing");
  MS_CHECK(member(group, "input_activations") == nullptr,
           "{} is set; activation quantization is not supported (W4A16 only)", g.field("input_activations"));
  MS_CHECK(member(group, "output_activations") == nullptr,
           "{} is set; output quantization is not supported (W4A16 only)", g.field("output_activations"));
  const json* weights = member(group, "weights");
  MS_CHECK(weights != nullptr && weights->is_object(), "{} must be an object", g.field("weights"));
  return parse_int4_weights(*weights, g.in("weights"));
}

void parse_fp8(const json& q, const Where& at, QuantizationConfig& c) {
  const std::string fmt_name = string_field(q, "fmt", at, "e4m3");
  MS_CHECK(fmt_name == "e4m3", "{} is '{}'; only 'e4m3' is supported", at.field("fmt"), fmt_name);
  const std::string scheme = string_field(q, "activation_scheme", at, "dynamic");
  MS_CHECK(scheme == "dynamic", "{} is '{}'; only 'dynamic' is supported", at.field("activation_scheme"), scheme);
  const json* block = member(q, "weight_block_size");
  // Blocks of 1..2^16 (DeepSeek's are 128): a larger one is a corrupt field, not a format.
  auto block_size = [](const json& v) {
    return v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= kMaxBlockSize;
  };
  MS_CHECK(
      block != nullptr && block->is_array() && block->size() == 2 && block_size((*block)[0]) && block_size((*block)[1]),
      "{} is {}; expected two integers [n, k] in [1, {}] (per-tensor fp8 is not supported)",
      at.field("weight_block_size"), block ? block->dump() : "missing", kMaxBlockSize);
  c.method = QuantMethod::fp8_block;
  c.block_n = (*block)[0].get<int64_t>();
  c.block_k = (*block)[1].get<int64_t>();
  c.coverage = QuantCoverage::linears_except_ignored;
  c.ignore = ignore_list(q, "modules_to_not_convert", at);
  for (const std::string& entry : ignore_list(q, "ignored_layers", at)) c.ignore.push_back(entry);
  c.ignore.push_back("lm_head");  // DeepSeek's checkpoints keep the head in bf16
}

}  // namespace

QuantizationConfig parse_quantization_config(const json& q, const std::string& source, const std::string& path,
                                             const std::string& tensor_prefix) {
  const Where at{source, path};
  MS_CHECK(q.is_object(), "{}: field '{}' must be an object", source, path.substr(0, path.size() - 1));
  QuantizationConfig c;
  const std::string method = string_field(q, "quant_method", at, "");
  if (method == "fp8") {
    parse_fp8(q, at, c);
  } else {
    MS_CHECK(method == "compressed-tensors", "{} is '{}'; supported: 'compressed-tensors' (pack-quantized), 'fp8'",
             at.field("quant_method"), method);
    const std::string format = string_field(q, "format", at, "");
    MS_CHECK(format == "pack-quantized", "{} is '{}'; only 'pack-quantized' is supported", at.field("format"), format);
    c.method = QuantMethod::int4_pack_quantized;
    c.group_size = parse_int4_group(q, at);
    c.ignore = ignore_list(q, "ignore", at);
  }
  auto patterns = std::make_shared<std::vector<std::regex>>();
  for (const std::string& entry : c.ignore) {
    if (entry.rfind("re:", 0) != 0) continue;
    try {
      patterns->emplace_back(entry.substr(3));
    } catch (const std::regex_error& e) {
      fail("{}: pattern '{}' is not a regular expression: {}",
           at.field(c.method == QuantMethod::fp8_block ? "modules_to_not_convert" : "ignore"), entry, e.what());
    }
  }
  c.patterns_ = std::move(patterns);
  c.tensor_prefix_ = tensor_prefix;
  if (c.method == QuantMethod::int4_pack_quantized) {
    // Routed experts only when every other kind of linear is ignored (Kimi K2.6).
    const std::string l = tensor_prefix + "model.layers.1.";
    const bool others_ignored = c.ignored(tensor_prefix + "lm_head") && c.ignored(l + "self_attn.q_a_proj") &&
                                c.ignored(l + "self_attn.kv_b_proj") && c.ignored(l + "self_attn.o_proj") &&
                                c.ignored(l + "mlp.shared_experts.down_proj") && c.ignored(l + "mlp.gate_proj");
    c.coverage = others_ignored ? QuantCoverage::routed_experts : QuantCoverage::linears_except_ignored;
  }
  return c;
}

std::string QuantizationConfig::name() const {
  switch (method) {
    case QuantMethod::int4_pack_quantized:
      return "int4-pack-quantized";
    case QuantMethod::fp8_block:
      return "fp8";
    case QuantMethod::none:
      break;
  }
  return "";
}

std::string QuantizationConfig::describe() const {
  const char* what = coverage == QuantCoverage::routed_experts ? "routed experts" : "linears";
  switch (method) {
    case QuantMethod::int4_pack_quantized:
      return fmt::format("INT4 {}, group {}", what, group_size);
    case QuantMethod::fp8_block:
      return fmt::format("FP8 e4m3 {}, block {}x{}", what, block_n, block_k);
    case QuantMethod::none:
      break;
  }
  return "none";
}

bool QuantizationConfig::ignored(const std::string& module) const {
  // compressed-tensors matches a module's name exactly or with re.match (anchored at the start);
  // the name is tried with and without the model's tensor prefix.
  const bool prefixed = !tensor_prefix_.empty() && module.rfind(tensor_prefix_, 0) == 0;
  const std::string names[] = {module, prefixed ? module.substr(tensor_prefix_.size()) : module};
  for (const std::string& entry : ignore)
    for (const std::string& n : names)
      if (entry.rfind("re:", 0) != 0 && n == entry) return true;
  if (patterns_)
    for (const std::regex& re : *patterns_)
      for (const std::string& n : names)
        if (std::regex_search(n, re, std::regex_constants::match_continuous)) return true;
  return false;
}

bool QuantizationConfig::quantizes(const std::string& module, bool routed_expert) const {
  if (method == QuantMethod::none) return false;
  if (coverage == QuantCoverage::routed_experts && !routed_expert) return false;
  return !ignored(module);
}

ops::QuantLayout quant_layout(const WeightFormat& format) {
  switch (format.method) {
    case QuantMethod::int4_pack_quantized:
      return {.quant = ops::WeightQuant::int4_group, .group_size = format.group_size};
    case QuantMethod::fp8_block:
      return {.quant = ops::WeightQuant::fp8_block, .block_n = format.block_n, .block_k = format.block_k};
    case QuantMethod::none:
      break;
  }
  return {};
}

int64_t stored_bytes(const WeightShape& shape, const WeightFormat& format) {
  const ops::QuantLayout layout = quant_layout(format);
  if (!layout.quantized()) return shape.rows * shape.cols * format.element_bytes;
  return ops::quant_value_bytes(shape.rows, shape.cols, layout) +
         ops::quant_scale_bytes(shape.rows, shape.cols, layout);
}

WeightFormat WeightFormats::linear(const std::string& module, bool routed_expert) {
  const WeightFormat quantized{q_.method, element_bytes_, q_.group_size, q_.block_n, q_.block_k};
  if (!routed_expert || q_.method == QuantMethod::none) return q_.quantizes(module, false) ? quantized : plain();
  const std::string marker = "mlp.experts.";
  const size_t index = module.find(marker);
  MS_CHECK(index != std::string::npos, "routed expert '{}': no '{}' in the name", module, marker);
  const size_t after = index + marker.size();
  const size_t dot = module.find('.', after);
  const std::string key = module.substr(0, after) + (dot == std::string::npos ? "" : module.substr(dot));
  auto it = expert_quantized_.find(key);
  if (it == expert_quantized_.end()) it = expert_quantized_.emplace(key, q_.quantizes(module, true)).first;
  return it->second ? quantized : plain();
}

}  // namespace moeserve
