// Structured output through xgrammar's C++ core: one engine per tokenizer (its vocabulary
// given to xgrammar once), grammars compiled once per key (the spec's kind and text) and
// shared by every request that asks for them, a matcher per request (a TokenConstraint the
// step loop drives). xgrammar stays behind this header: nothing else includes it.
//
//   grammar::GrammarEngine engine(grammar::make_vocabulary(tok, {.model_vocab_size = 163840, ...}));
//   auto matcher = engine.matcher({grammar::GrammarKind::kJsonSchema, schema_text}, stop_ids);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/vocabulary.h"
#include "step/token_constraint.h"

namespace moeserve::grammar {

enum class GrammarKind {
  kJsonObject,     // any JSON object (response_format json_object); text unused
  kJsonSchema,     // text: a JSON schema (response_format json_schema)
  kStructuralTag,  // text: an xgrammar structural tag (tool_call_grammar.h)
  kEbnf,           // text: an EBNF grammar, root rule "root"
  // text: a tool call's structural tag (tool_call_grammar.h: sequences and choices of const
  // strings and JSON schemas), built with the JSON whitespace bounded as for kJsonSchema
  kToolCall,
};

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string text;
  // json_schema's "strict": false lets objects carry properties the schema does not name.
  bool strict = true;
};

class GrammarEngine {
 public:
  explicit GrammarEngine(GrammarVocabulary vocabulary);
  ~GrammarEngine();
  GrammarEngine(const GrammarEngine&) = delete;
  GrammarEngine& operator=(const GrammarEngine&) = delete;

  // Compiles `spec` (cached by key; thread-safe). Throws Error naming what is wrong with it
  // (invalid JSON, an unsupported schema, a malformed structural tag or EBNF).
  void compile(const GrammarSpec& spec);
  // A fresh matcher over `spec`'s grammar (compiled first if needed). It terminates on one of
  // `stop_ids` after the grammar completes (empty: the vocabulary's stop ids; with none at
  // all, as soon as the grammar completes).
  std::unique_ptr<TokenConstraint> matcher(const GrammarSpec& spec, const std::vector<int32_t>& stop_ids = {});

  int64_t vocab_size() const;
  int64_t mask_words() const { return (vocab_size() + 31) / 32; }
  int64_t cached_grammars() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::grammar
