// The grammar engine over xgrammar: JSON-schema and JSON-object matchers accept conforming
// output and reject the first byte that breaks it, masks agree with what accept() takes,
// special and padded ids are never allowed, a complete grammar ends on a stop id, rollback
// restores the state (speculative rejection), compiled grammars are cached by key, and a
// schema xgrammar refuses is an error naming the kind.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/grammar/grammar_fixture.h"

namespace moeserve::grammar {
namespace {

const std::string kSchema =
    R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a", "b"]})";

TEST(GrammarEngine, SchemaMatcherAcceptsAConformingObjectThenOnlyTheStopId) {
  auto m = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema});
  const std::string text = R"({"a": 12, "b": "x y"})";
  EXPECT_EQ(feed(*m, text), text.size());
  EXPECT_FALSE(m->terminated());
  const std::vector<int32_t> mask = next_mask(*m);
  for (int32_t id = 0; id < kModelVocab; ++id) EXPECT_EQ(allows(mask, id), id == kEos) << "id " << id;
  EXPECT_TRUE(m->accept(kEos));
  EXPECT_TRUE(m->terminated());
}

TEST(GrammarEngine, SchemaMatcherRejectsTheFirstNonConformingByte) {
  auto m = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema});
  EXPECT_EQ(feed(*m, R"({"a": "s)"), 6u);  // a string where the integer goes
  auto strict = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema});
  EXPECT_EQ(feed(*strict, R"({"c)"), 2u);  // a property the strict schema does not name
  auto lax = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema, /*strict=*/false});
  const std::string extra = R"({"a": 1, "b": "", "c": 1})";
  EXPECT_EQ(feed(*lax, extra), extra.size());
  auto object = byte_engine().matcher({GrammarKind::kJsonObject, ""});
  EXPECT_EQ(feed(*object, "[1]"), 0u);
  const std::string nested = R"({"k": [1, {"z": null}]})";
  EXPECT_EQ(feed(*object, nested), nested.size());
}

TEST(GrammarEngine, MaskAgreesWithAcceptAndNeverAllowsSpecialOrPaddedIds) {
  auto m = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema});
  feed(*m, R"({"a": 1)");
  const std::vector<int32_t> mask = next_mask(*m);
  int allowed = 0;
  for (int32_t id = 0; id < kModelVocab; ++id) {
    auto probe = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema});
    feed(*probe, R"({"a": 1)");
    const bool accepted = probe->accept(id);
    EXPECT_EQ(allows(mask, id), accepted) << "id " << id;
    allowed += accepted;
    if (id >= 256) {
      EXPECT_FALSE(accepted) << "special or padded id " << id;
    }
  }
  EXPECT_GT(allowed, 10);  // digits, whitespace, ','
}

TEST(GrammarEngine, RollbackRestoresTheStateBeforeTheRolledBackTokens) {
  auto m = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema});
  feed(*m, R"({"a)");
  const std::vector<int32_t> before = next_mask(*m);
  EXPECT_EQ(feed(*m, R"(": 5, )"), 6u);
  EXPECT_NE(next_mask(*m), before);
  m->rollback(6);
  EXPECT_EQ(next_mask(*m), before);
  const std::string rest = R"(": 7, "b": ""})";
  EXPECT_EQ(feed(*m, rest), rest.size());
}

TEST(GrammarEngine, CompiledGrammarsAreCachedByKeyAndBadSchemasNamed) {
  GrammarEngine& engine = byte_engine();
  const std::string schema = R"({"type": "object", "properties": {"cached": {"type": "boolean"}}})";
  engine.compile({GrammarKind::kJsonSchema, schema});
  const int64_t cached = engine.cached_grammars();
  engine.compile({GrammarKind::kJsonSchema, schema});
  EXPECT_EQ(engine.cached_grammars(), cached);
  engine.compile({GrammarKind::kJsonSchema, schema, /*strict=*/false});
  EXPECT_EQ(engine.cached_grammars(), cached + 1);
  try {
    engine.compile({GrammarKind::kJsonSchema, R"({"type": "object", "properties": )"});
    FAIL() << "a malformed schema compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("json_schema"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine.compile({GrammarKind::kEbnf, "root ::= undefined_rule"}), Error);
}

TEST(GrammarEngine, LengthBoundedStringsTakeNoControlCharacters) {
  const std::string schema =
      R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 5}}, "required": ["s"]})";
  auto m = byte_engine().matcher({GrammarKind::kJsonSchema, schema});
  EXPECT_EQ(feed(*m, "{\"s\": \"a\x13"), 8u);  // all but the control character
  const std::string five = R"({"s": "abcde"})";
  EXPECT_EQ(feed(*byte_engine().matcher({GrammarKind::kJsonSchema, schema}), five), five.size());
  EXPECT_EQ(feed(*byte_engine().matcher({GrammarKind::kJsonSchema, schema}), R"({"s": "abcdef)"), 12u);
}

TEST(GrammarEngine, EbnfGrammarsConstrainToTheirLanguage) {
  auto m = byte_engine().matcher({GrammarKind::kEbnf, R"(root ::= "yes" | "no")"});
  EXPECT_EQ(feed(*m, "nope"), 2u);
  EXPECT_TRUE(m->accept(kEos));
  EXPECT_TRUE(m->terminated());
}

}  // namespace
}  // namespace moeserve::grammar
