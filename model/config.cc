#include "model/config.h"

#include <climits>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace moeserve {

namespace {

using json = nlohmann::json;

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// Reads fields of one JSON object, naming `source` and the field in every error.
class FieldReader {
 public:
  FieldReader(const json& object, std::string source, std::string path_prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(path_prefix)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }

  // An integer (or a float with an integral value) within +-(2^31 - 1): every integer field of
  // the architecture fits, and products of a few of them stay within int64.
  int64_t integer(const char* key) const {
    const json& v = required(key);
    const bool integral = v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                                    std::floor(v.get<double>()) == v.get<double>());
    MS_CHECK(integral, "{}: field '{}{}' must be an integer, got {}", source_, prefix_, key, v.dump());
    constexpr int64_t kMax = INT32_MAX;
    const bool in_range = v.is_number_unsigned()  ? v.get<uint64_t>() <= static_cast<uint64_t>(kMax)
                          : v.is_number_integer() ? v.get<int64_t>() >= -kMax && v.get<int64_t>() <= kMax
                                                  : std::fabs(v.get<double>()) <= static_cast<double>(kMax);
    MS_CHECK(in_range, "{}: field '{}{}' is {}, out of range (integer fields must be within +-{})", source_, prefix_,
             key, v.dump(), kMax);
    return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
  }
  int64_t integer_or(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

  double number(const char* key) const {
    const json& v = required(key);
    MS_CHECK(v.is_number() && std::isfinite(v.get<double>()), "{}: field '{}{}' must be a finite number, got {}",
             source_, prefix_, key, v.dump());
    return v.get<double>();
  }
  double number_or(const char* key, double fallback) const { return has(key) ? number(key) : fallback; }

  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    MS_CHECK(v.is_boolean(), "{}: field '{}{}' must be true or false, got {}", source_, prefix_, key, v.dump());
    return v.get<bool>();
  }

  std::string string(const char* key) const {
    const json& v = required(key);
    MS_CHECK(v.is_string(), "{}: field '{}{}' must be a string, got {}", source_, prefix_, key, v.dump());
    return v.get<std::string>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    return has(key) ? string(key) : fallback;
  }

  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& required(const char* key) const {
    MS_CHECK(has(key), "{}: missing field '{}{}'", source_, prefix_, key);
    return object_.at(key);
  }

  const json& object_;
  std::string source_;
  std::string prefix_;
};

RopeScaling parse_rope_scaling(const json& object, const std::string& source, const std::string& path) {
  FieldReader f(object, source, path);
  RopeScaling r;
  r.type = f.has("rope_type") ? f.string("rope_type") : f.string_or("type", "default");
  if (r.type == "default") return r;
  MS_CHECK(r.type == "yarn", "{}: field '{}type' is '{}'; only 'yarn' and 'default' are supported", source, path,
           r.type);
  r.factor = f.number("factor");
  r.beta_fast = f.number_or("beta_fast", 32.0);
  r.beta_slow = f.number_or("beta_slow", 1.0);
  if (r.beta_fast == 0) r.beta_fast = 32.0;  // transformers: `get("beta_fast") or 32`
  if (r.beta_slow == 0) r.beta_slow = 1.0;
  r.mscale = f.number_or("mscale", 0.0);
  r.mscale_all_dim = f.number_or("mscale_all_dim", 0.0);
  r.attention_factor = f.number_or("attention_factor", 0.0);
  r.original_max_position_embeddings = f.integer("original_max_position_embeddings");
  r.truncate = f.boolean_or("truncate", true);
  return r;
}

// quantization_config: under text_config (then it wins) or at the top level.
QuantizationConfig read_quantization(const json& root, const json& text, const std::string& source,
                                     const std::string& path, const std::string& tensor_prefix) {
  auto present = [](const json& o) {
    return o.contains("quantization_config") && !o.at("quantization_config").is_null();
  };
  if (&text != &root && present(text))
    return parse_quantization_config(text.at("quantization_config"), source, path + "quantization_config.",
                                     tensor_prefix);
  if (present(root))
    return parse_quantization_config(root.at("quantization_config"), source, "quantization_config.", tensor_prefix);
  return {};
}

// The object holding the text model's fields: the root, or (Kimi K2.5 / VL) its text_config,
// whose tensors are under language_model. and whose fields are reported under `path`.
const json& text_model_of(const json& root, const std::string& source, const std::string& outer_type, ModelConfig& c,
                          std::string& path) {
  if (outer_type != "kimi_k25" && outer_type != "kimi_vl") {
    MS_CHECK(outer_type == "deepseek_v3" || outer_type == "kimi_k2",
             "{}: field 'model_type' is '{}'; supported: deepseek_v3, kimi_k2, kimi_k25", source, outer_type);
    return root;
  }
  MS_CHECK(root.contains("text_config") && root.at("text_config").is_object(),
           "{}: missing field 'text_config' required by model_type '{}'", source, outer_type);
  path = "text_config.";
  c.tensor_prefix = "language_model.";
  const json& text = root.at("text_config");
  const std::string inner = FieldReader(text, source, path).string_or("model_type", "deepseek_v3");
  MS_CHECK(inner == "deepseek_v3" || inner == "kimi_k2",
           "{}: field 'text_config.model_type' is '{}'; supported: deepseek_v3, kimi_k2", source, inner);
  return text;
}

// The routed-expert fields: required once some layer is an MoE layer.
void read_moe_fields(const FieldReader& f, ModelConfig& c, const std::string& source, const std::string& path) {
  c.n_routed_experts = f.integer("n_routed_experts");
  c.moe_intermediate_size = f.integer("moe_intermediate_size");
  c.num_experts_per_tok = f.integer("num_experts_per_tok");
  c.n_shared_experts = f.integer_or("n_shared_experts", 0);
  c.n_group = f.integer_or("n_group", 1);
  c.topk_group = f.integer_or("topk_group", 1);
  c.norm_topk_prob = f.boolean_or("norm_topk_prob", true);
  c.routed_scaling_factor = f.number_or("routed_scaling_factor", 1.0);
  const std::string scoring = f.string_or("scoring_func", "sigmoid");
  MS_CHECK(scoring == "sigmoid", "{}: field '{}scoring_func' is '{}'; only 'sigmoid' is supported", source, path,
           scoring);
  const std::string topk_method = f.string_or("topk_method", "noaux_tc");
  MS_CHECK(topk_method == "noaux_tc", "{}: field '{}topk_method' is '{}'; only 'noaux_tc' is supported", source, path,
           topk_method);
  const int64_t moe_layer_freq = f.integer_or("moe_layer_freq", 1);
  MS_CHECK(moe_layer_freq == 1, "{}: field '{}moe_layer_freq' is {}; only 1 is supported", source, path,
           moe_layer_freq);
}

void read_rope_fields(const FieldReader& f, const json& text, ModelConfig& c, const std::string& source,
                      const std::string& path) {
  // Published checkpoints: top-level rope_theta + rope_scaling{type}; transformers 5 saves
  // rope_parameters{rope_type, rope_theta}.
  if (f.has("rope_parameters")) {
    const json& rp = text.at("rope_parameters");
    MS_CHECK(rp.is_object(), "{}: field '{}rope_parameters' must be an object", source, path);
    c.rope_scaling = parse_rope_scaling(rp, source, path + "rope_parameters.");
    c.rope_theta = FieldReader(rp, source, path + "rope_parameters.").number_or("rope_theta", 10000.0);
    if (f.has("rope_theta")) c.rope_theta = f.number("rope_theta");
  } else {
    c.rope_theta = f.number_or("rope_theta", 10000.0);
    if (f.has("rope_scaling")) {
      const json& rs = text.at("rope_scaling");
      MS_CHECK(rs.is_object(), "{}: field '{}rope_scaling' must be an object or null", source, path);
      c.rope_scaling = parse_rope_scaling(rs, source, path + "rope_scaling.");
    }
  }
}

// Upper bounds on the architecture's sizes, far above any published model, so that the
// products that size weights and workspaces stay far from int64's range.
void check_size_bounds(const ModelConfig& c) {
  auto at_most = [](const char* name, int64_t value, int64_t max) {
    MS_CHECK(value <= max, "config: field '{}' is {}, more than the supported maximum {}", name, value, max);
  };
  constexpr int64_t kMaxWidth = int64_t{1} << 20, kMaxCount = int64_t{1} << 16;
  // The weight accounting lists each layer's tensors by name: 4096 layers (67 times
  // DeepSeek-V3's 61) keep that list small enough to recompute for every plan the advisor ranks.
  constexpr int64_t kMaxLayers = int64_t{1} << 12;
  at_most("vocab_size", c.vocab_size, int64_t{1} << 24);
  at_most("hidden_size", c.hidden_size, kMaxWidth);
  at_most("intermediate_size", c.intermediate_size, kMaxWidth);
  at_most("moe_intermediate_size", c.moe_intermediate_size, kMaxWidth);
  at_most("q_lora_rank", c.q_lora_rank, kMaxWidth);
  at_most("kv_lora_rank", c.kv_lora_rank, kMaxWidth);
  at_most("qk_nope_head_dim", c.qk_nope_head_dim, kMaxCount);
  at_most("qk_rope_head_dim", c.qk_rope_head_dim, kMaxCount);
  at_most("v_head_dim", c.v_head_dim, kMaxCount);
  at_most("num_hidden_layers", c.num_hidden_layers, kMaxLayers);
  at_most("num_attention_heads", c.num_attention_heads, kMaxCount);
  at_most("n_routed_experts", c.n_routed_experts, kMaxCount);
  at_most("n_shared_experts", c.n_shared_experts, kMaxCount);
  at_most("num_nextn_predict_layers", c.num_nextn_predict_layers, kMaxCount);
  MS_CHECK(c.num_nextn_predict_layers >= 0, "config: field 'num_nextn_predict_layers' must be >= 0, got {}",
           c.num_nextn_predict_layers);
  MS_CHECK(c.intermediate_size >= 0, "config: field 'intermediate_size' must be >= 0, got {}", c.intermediate_size);
}

}  // namespace

double ModelConfig::attention_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope_scaling.type != "default" && rope_scaling.mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

double ModelConfig::rope_attention_factor() const {
  if (rope_scaling.type != "yarn") return 1.0;
  if (rope_scaling.attention_factor != 0.0) return rope_scaling.attention_factor;
  if (rope_scaling.mscale != 0.0 && rope_scaling.mscale_all_dim != 0.0)
    return yarn_get_mscale(rope_scaling.factor, rope_scaling.mscale) /
           yarn_get_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
  return yarn_get_mscale(rope_scaling.factor, 1.0);
}

void ModelConfig::validate() const {
  auto positive = [&](const char* name, int64_t value) {
    MS_CHECK(value > 0, "config: field '{}' must be positive, got {}", name, value);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("kv_lora_rank", kv_lora_rank);
  positive("qk_nope_head_dim", qk_nope_head_dim);
  positive("qk_rope_head_dim", qk_rope_head_dim);
  positive("v_head_dim", v_head_dim);
  MS_CHECK(q_lora_rank >= 0, "config: field 'q_lora_rank' must be null or positive, got {}", q_lora_rank);
  MS_CHECK(qk_rope_head_dim % 2 == 0, "config: field 'qk_rope_head_dim' must be even, got {}", qk_rope_head_dim);
  MS_CHECK(first_k_dense_replace >= 0 && first_k_dense_replace <= num_hidden_layers,
           "config: field 'first_k_dense_replace' ({}) must be within [0, num_hidden_layers={}]", first_k_dense_replace,
           num_hidden_layers);
  if (first_k_dense_replace > 0) positive("intermediate_size", intermediate_size);
  if (num_moe_layers() > 0) {
    positive("n_routed_experts", n_routed_experts);
    positive("moe_intermediate_size", moe_intermediate_size);
    positive("num_experts_per_tok", num_experts_per_tok);
    positive("n_group", n_group);
    positive("topk_group", topk_group);
    MS_CHECK(n_shared_experts >= 0, "config: field 'n_shared_experts' must be >= 0, got {}", n_shared_experts);
    MS_CHECK(num_experts_per_tok <= n_routed_experts,
             "config: field 'num_experts_per_tok' ({}) exceeds 'n_routed_experts' ({})", num_experts_per_tok,
             n_routed_experts);
    MS_CHECK(n_routed_experts % n_group == 0, "config: field 'n_group' ({}) must divide 'n_routed_experts' ({})",
             n_group, n_routed_experts);
    MS_CHECK(topk_group <= n_group, "config: field 'topk_group' ({}) exceeds 'n_group' ({})", topk_group, n_group);
    MS_CHECK(n_routed_experts / n_group >= 2,
             "config: field 'n_group' ({}) leaves fewer than 2 experts per group (group scores use the top 2)",
             n_group);
    MS_CHECK(num_experts_per_tok <= topk_group * (n_routed_experts / n_group),
             "config: field 'num_experts_per_tok' ({}) exceeds the experts in 'topk_group' ({}) groups of {}",
             num_experts_per_tok, topk_group, n_routed_experts / n_group);
  }
  MS_CHECK(rms_norm_eps > 0, "config: field 'rms_norm_eps' must be positive, got {}", rms_norm_eps);
  MS_CHECK(rope_theta > 0, "config: field 'rope_theta' must be positive, got {}", rope_theta);
  if (rope_scaling.type == "yarn") {
    MS_CHECK(rope_scaling.factor > 0, "config: field 'rope_scaling.factor' must be positive, got {}",
             rope_scaling.factor);
    MS_CHECK(rope_scaling.original_max_position_embeddings > 0,
             "config: field 'rope_scaling.original_max_position_embeddings' must be positive");
  }
  positive("max_position_embeddings", max_position_embeddings);
  check_size_bounds(*this);
  // Every byte count of the weight accounting is a multiple of a parameter count: bounding the
  // total keeps them all far from int64's range (2^50 is a thousand times Kimi K2's 1.03 T).
  const int64_t total = count_parameters(*this).total;
  MS_CHECK(total <= kMaxParameters, "config: the fields describe {} parameters, more than the supported 2^50", total);
}

ModelConfig ModelConfig::from_json(const json& root, const std::string& source) {
  MS_CHECK(root.is_object(), "{}: config must be a JSON object", source);
  FieldReader top(root, source, "");
  ModelConfig c;
  const std::string outer_type = top.string("model_type");
  std::string path;
  const json* text = &text_model_of(root, source, outer_type, c, path);
  FieldReader f(*text, source, path);
  c.model_type = outer_type;
  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.num_hidden_layers = f.integer("num_hidden_layers");
  c.num_attention_heads = f.integer("num_attention_heads");
  c.q_lora_rank = f.integer_or("q_lora_rank", 0);
  c.kv_lora_rank = f.integer("kv_lora_rank");
  c.qk_nope_head_dim = f.integer("qk_nope_head_dim");
  c.qk_rope_head_dim = f.integer("qk_rope_head_dim");
  c.v_head_dim = f.integer("v_head_dim");
  c.first_k_dense_replace = f.integer_or("first_k_dense_replace", 0);
  c.intermediate_size =
      c.first_k_dense_replace > 0 ? f.integer("intermediate_size") : f.integer_or("intermediate_size", 0);
  if (c.first_k_dense_replace < c.num_hidden_layers) read_moe_fields(f, c, source, path);
  const std::string act = f.string_or("hidden_act", "silu");
  MS_CHECK(act == "silu", "{}: field '{}hidden_act' is '{}'; only 'silu' is supported", source, path, act);
  MS_CHECK(!f.boolean_or("attention_bias", false), "{}: field '{}attention_bias' is true; not supported", source, path);
  c.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6);
  c.max_position_embeddings = f.integer("max_position_embeddings");
  c.rope_interleave = f.boolean_or("rope_interleave", true);
  read_rope_fields(f, *text, c, source, path);
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", top.boolean_or("tie_word_embeddings", false));
  c.num_nextn_predict_layers = f.integer_or("num_nextn_predict_layers", 0);
  if (f.has("bos_token_id") && text->at("bos_token_id").is_number_integer()) c.bos_token_id = f.integer("bos_token_id");
  if (f.has("eos_token_id") && text->at("eos_token_id").is_number_integer()) c.eos_token_id = f.integer("eos_token_id");
  c.torch_dtype = f.has("torch_dtype") ? f.string("torch_dtype") : f.string_or("dtype", "bfloat16");
  c.quantization = read_quantization(root, *text, source, path, c.tensor_prefix);
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  MS_CHECK(in.good(), "{}: cannot open config file", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  json root;
  try {
    root = json::parse(buffer.str());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double
    fail("{}: invalid JSON: {}", path, e.what());
  }
  return from_json(root, path);
}

namespace {

// Parameter arithmetic that fails instead of wrapping around: fields within their bounds can
// still multiply past int64 (2^20 hidden x 2^20 expert width x 2^16 experts x 2^16 layers).
class Count {
 public:
  Count(int64_t value) : value_(value) {}  // NOLINT: implicit, so that formulas read as formulas
  friend Count operator*(Count a, Count b) {
    int64_t r;
    if (__builtin_mul_overflow(a.value_, b.value_, &r)) overflow();
    return r;
  }
  friend Count operator+(Count a, Count b) {
    int64_t r;
    if (__builtin_add_overflow(a.value_, b.value_, &r)) overflow();
    return r;
  }
  Count& operator+=(Count b) { return *this = *this + b; }
  int64_t value() const { return value_; }

 private:
  [[noreturn]] static void overflow() { fail("config: the fields describe more parameters than 64 bits count"); }
  int64_t value_;
};

}  // namespace

ParameterCounts count_parameters(const ModelConfig& c) {
  const Count h = c.hidden_size;
  const Count heads = c.num_attention_heads;
  Count attention = 2 * h;  // input and post-attention norms
  if (c.q_lora_rank > 0) {
    attention += h * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * heads * c.qk_head_dim();
  } else {
    attention += h * heads * c.qk_head_dim();
  }
  attention += h * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank;
  attention += c.kv_lora_rank * heads * (c.qk_nope_head_dim + c.v_head_dim);
  attention += heads * c.v_head_dim * h;

  const Count dense_mlp = 3 * h * c.intermediate_size;
  const Count expert = 3 * h * c.moe_intermediate_size;
  const Count shared = 3 * h * c.moe_intermediate_size * c.n_shared_experts;
  const Count router = c.n_routed_experts * h + c.n_routed_experts;

  const Count embed = c.vocab_size * h;
  const Count head = c.tie_word_embeddings ? 0 : c.vocab_size * h;
  const Count dense_layers = c.first_k_dense_replace;
  const Count moe_layers = c.num_moe_layers();

  const Count routed = moe_layers * c.n_routed_experts * expert;
  const Count common = embed + head + h /*final norm*/ + c.num_hidden_layers * attention + dense_layers * dense_mlp +
                       moe_layers * (shared + router);
  ParameterCounts p;
  p.routed_experts = routed.value();
  p.total = (common + routed).value();
  p.active_per_token = (common + moe_layers * c.num_experts_per_tok * expert).value();
  return p;
}

}  // namespace moeserve
