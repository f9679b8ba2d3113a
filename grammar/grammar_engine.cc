#include "grammar/grammar_engine.h"

#include <xgrammar/xgrammar.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "grammar/grammar_matcher.h"

namespace moeserve::grammar {
namespace {

// Compiled grammars kept before the cache starts over (a schema's grammar is tens of KB).
constexpr size_t kMaxCachedGrammars = 4096;
// Whitespace between JSON tokens, at most this many characters per gap: any layout a client
// parses, but no endless run of blanks from a model that likes them.
constexpr int kMaxWhitespace = 4;

const char* kind_name(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonObject:
      return "json_object";
    case GrammarKind::kJsonSchema:
      return "json_schema";
    case GrammarKind::kStructuralTag:
      return "structural_tag";
    case GrammarKind::kEbnf:
      return "ebnf";
    case GrammarKind::kToolCall:
      return "tool_call";
  }
  return "?";
}

// xgrammar 0.1.27 matches a string with minLength / maxLength by [^"\\\r\n]{m,n}, which lets
// raw control characters through (JSON forbids them). The same bound as a pattern excludes them.
void bound_strings(nlohmann::json& node) {
  if (node.is_array())
    for (auto& item : node) bound_strings(item);
  if (!node.is_object()) return;
  for (auto& item : node.items()) bound_strings(item.value());
  const bool bounded = node.contains("minLength") || node.contains("maxLength");
  if (!bounded || node.value("type", nlohmann::json()) != "string" || node.contains("pattern") ||
      node.contains("format"))
    return;
  const std::string max = node.contains("maxLength") ? node["maxLength"].dump() : "";
  node["pattern"] = fmt::format("[^\"\\\\\\x00-\\x1f]{{{},{}}}", node.value("minLength", 0), max);
  node.erase("minLength");
  node.erase("maxLength");
}

std::string with_bounded_strings(const std::string& schema) {
  nlohmann::json parsed = nlohmann::json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return schema;  // xgrammar names the error
  bound_strings(parsed);
  return parsed.dump();
}

// `text` as an EBNF string literal (UTF-8 passes as it is).
std::string ebnf_literal(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// A tool call's structural tag as one grammar. xgrammar's own structural tags let their JSON
// take any run of whitespace, which a small model fills until max_tokens.
xgrammar::Grammar tool_call_tree(const nlohmann::json& node) {
  const std::string type = node.value("type", "");
  if (type == "const_string") return xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(node.at("value")));
  if (type == "json_schema")
    return xgrammar::Grammar::FromJSONSchema(with_bounded_strings(node.at("json_schema").dump()),
                                             /*any_whitespace=*/true, std::nullopt, std::nullopt, /*strict_mode=*/true,
                                             kMaxWhitespace);
  MS_CHECK(type == "sequence" || type == "or", "tool_call: unexpected element type \"{}\"", type);
  std::vector<xgrammar::Grammar> parts;
  for (const nlohmann::json& element : node.at("elements")) parts.push_back(tool_call_tree(element));
  return type == "sequence" ? xgrammar::Grammar::Concat(parts) : xgrammar::Grammar::Union(parts);
}

xgrammar::TokenizerInfo tokenizer_info(const GrammarVocabulary& v) {
  // RAW: the strings are already each id's bytes; "" marks an id no grammar may produce. The
  // tokenizer's ids only: xgrammar clears every id it cannot match one by one on each mask it
  // fills, and a model's padding (163840 ids over a 256-id byte tokenizer) made that the
  // mask's main cost; the matcher clears the padding's words itself.
  return xgrammar::TokenizerInfo(v.token_bytes, xgrammar::VocabType::RAW, static_cast<int>(v.token_bytes.size()),
                                 std::vector<int32_t>(v.stop_ids.begin(), v.stop_ids.end()));
}

}  // namespace

struct GrammarEngine::Impl {
  GrammarVocabulary vocabulary;
  xgrammar::GrammarCompiler compiler;
  std::mutex mutex;
  std::map<std::pair<GrammarKind, std::string>, xgrammar::CompiledGrammar> cache;  // by (kind, text and strict)

  std::shared_ptr<const VocabTables> tables;  // see MatcherParams

  explicit Impl(GrammarVocabulary v)
      : vocabulary(std::move(v)),
        compiler(tokenizer_info(vocabulary), /*max_threads=*/1, /*cache_enabled=*/false),
        tables(std::make_shared<VocabTables>(vocabulary.token_bytes, vocabulary.stop_ids, vocabulary.vocab_size)) {}

  xgrammar::CompiledGrammar build(const GrammarSpec& spec) {
    switch (spec.kind) {
      case GrammarKind::kJsonObject:
        // Not strict: an object schema that names no properties then allows any.
        return compiler.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/true, std::nullopt, std::nullopt,
                                          /*strict_mode=*/false, kMaxWhitespace);
      case GrammarKind::kJsonSchema:
        return compiler.CompileJSONSchema(with_bounded_strings(spec.text), /*any_whitespace=*/true, std::nullopt,
                                          std::nullopt, spec.strict, kMaxWhitespace);
      case GrammarKind::kStructuralTag:  // its json_schema parts as above
        return compiler.CompileStructuralTag(with_bounded_strings(spec.text));
      case GrammarKind::kToolCall:
        return compiler.CompileGrammar(tool_call_tree(nlohmann::json::parse(spec.text).at("format")));
      case GrammarKind::kEbnf:
        return compiler.CompileGrammar(spec.text, "root");
    }
    throw Error("grammar: unknown grammar kind");
  }

  xgrammar::CompiledGrammar get(const GrammarSpec& spec) {
    auto key = std::make_pair(spec.kind, spec.text + (spec.strict ? '1' : '0'));
    {
      std::lock_guard lock(mutex);
      if (auto it = cache.find(key); it != cache.end()) return it->second;
    }
    xgrammar::CompiledGrammar compiled = [&] {
      try {
        return build(spec);
      } catch (const std::exception& e) {  // xgrammar reports bad input as std::exception subclasses
        throw Error(fmt::format("{}: {}", kind_name(spec.kind), e.what()));
      }
    }();
    std::lock_guard lock(mutex);
    if (cache.size() >= kMaxCachedGrammars) cache.clear();
    cache.emplace(std::move(key), compiled);
    return compiled;
  }
};

GrammarEngine::GrammarEngine(GrammarVocabulary vocabulary) : impl_(std::make_unique<Impl>(std::move(vocabulary))) {}
GrammarEngine::~GrammarEngine() = default;

void GrammarEngine::compile(const GrammarSpec& spec) { impl_->get(spec); }

std::unique_ptr<TokenConstraint> GrammarEngine::matcher(const GrammarSpec& spec, const std::vector<int32_t>& stop_ids) {
  const xgrammar::CompiledGrammar compiled = impl_->get(spec);
  return make_matcher({compiled, stop_ids.empty() ? impl_->vocabulary.stop_ids : stop_ids, impl_->tables});
}

int64_t GrammarEngine::vocab_size() const { return impl_->vocabulary.vocab_size; }

int64_t GrammarEngine::cached_grammars() const {
  std::lock_guard lock(impl_->mutex);
  return static_cast<int64_t>(impl_->cache.size());
}

}  // namespace moeserve::grammar
