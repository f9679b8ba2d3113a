// Units of the chat-template interpreter: lexer whitespace rules, parser errors with their
// line and column, and the evaluator's Python semantics. (The whole language against jinja2
// itself is tests/python/test_chat_template_corpus.py.)
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/template.h"

namespace moeserve::tokenizer::jinja {
namespace {

std::string render(const std::string& text, const std::string& context_json = "{}") {
  const Template t(text, "t");
  std::vector<std::pair<std::string, Value>> context;
  const auto json = nlohmann::ordered_json::parse(context_json);  // kept: items() refers to it
  for (const auto& [k, v] : json.items()) context.emplace_back(k, from_json(v, false));
  return t.render(context).text;
}

std::string error_of(const std::string& text, const std::string& context_json = "{}") {
  try {
    render(text, context_json);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JinjaLexer, TokensCarryLinesAndColumns) {
  const std::vector<Token> tokens = lex("a\n  {{ x.y }}", "t");
  ASSERT_EQ(tokens.size(), 7u);
  EXPECT_EQ(tokens[0].kind, TokenKind::Data);
  EXPECT_EQ(tokens[1].kind, TokenKind::VarBegin);
  EXPECT_EQ(tokens[2].text, "x");
  EXPECT_EQ(tokens[2].line, 2);
  EXPECT_EQ(tokens[2].column, 6);
  EXPECT_EQ(tokens[3].text, ".");
  EXPECT_EQ(tokens[6].kind, TokenKind::End);
}

TEST(JinjaLexer, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before one goes.
  EXPECT_EQ(render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  // Not after {{ }}; `-` strips every whitespace on its side; `+` keeps them.
  EXPECT_EQ(render("{{ 1 }}\n  {{- 2 -}}  \n3"), "123");
  EXPECT_EQ(render("  {%+ if true %}a{% endif +%}\nb"), "  a\nb");
  // Comments and raw blocks; one trailing newline of the template is dropped, CRLF is LF.
  EXPECT_EQ(render("a{# c #}\nb{% raw %}{{ x }}{% endraw %}\n"), "ab{{ x }}");
  EXPECT_EQ(render("a\r\nb\r\n\r\n"), "a\nb\n");
}

TEST(JinjaParser, ErrorsNameTheLineAndColumn) {
  EXPECT_EQ(error_of("ok\n{{ x | nosuch }}"), "t:2:8: No filter named 'nosuch'.");
  EXPECT_EQ(
      error_of("{% if x %}\n\nabc"),
      "t:3:4: Unexpected end of template. Jinja was looking for the following tags: 'elif' or 'else' or 'endif'.");
  EXPECT_EQ(error_of("{{ x is bogus }}"), "t:1:9: No test named 'bogus'.");
  EXPECT_EQ(error_of("\n{% for x in y %}{% endif %}"),
            "t:2:20: Encountered unknown tag 'endif'. Jinja was looking for the following tags: 'endfor' or 'else'.");
  EXPECT_EQ(error_of("{{ (1, ] }}"), "t:1:8: unexpected ']', expected ')'");
  EXPECT_EQ(error_of("{% break %}"), "t:1:4: 'break' outside of a loop");
  // Found by fuzz/tokenizer_load: std::stoll's out_of_range escaped the parser and aborted.
  EXPECT_EQ(error_of("{{ 99999999999999999999 }}"),
            "t:1:4: integer literal 99999999999999999999 does not fit in 64 bits");
  EXPECT_EQ(render("{{ 1e999 > 1e308 }}"), "True");
}

TEST(JinjaEval, PythonSemantics) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 8 }} {{ 1 + 2.5 }} {{ 'ab' * 2 }}"),
            "3 -4 2 3.5 256 3.5 abab");
  EXPECT_EQ(render("{{ [1, 'a', none, true, {'k': 1.0}] }} {{ ('x',) }} {{ \"it's\" ~ 1 }}"),
            "[1, 'a', None, True, {'k': 1.0}] ('x',) it's1");
  EXPECT_EQ(
      render("{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 2 not in [1, 3] }} {{ 0 or 'x' }} {{ 1 and 0 }}"),
      "True True True True x 0");
  EXPECT_EQ(render("{{ 'héllo'[1:4] }} {{ 'abcdef'[::-2] }} {{ [1, 2, 3, 4][1:] }} {{ 'héllo' | length }}"),
            "éll fdb [2, 3, 4] 5");
  EXPECT_EQ(render("{{ 'a' if false }}|{{ 'a' if true else 'b' }}|{{ x is defined }}|{{ none is none }}"),
            "|a|False|True");
}

TEST(JinjaEval, UndefinedBehavesAsJinja2Default) {
  EXPECT_EQ(render("[{{ nope }}][{{ nope | length }}][{{ nope ~ 'x' }}][{% for a in nope %}a{% endfor %}]"),
            "[][0][x][]");
  EXPECT_EQ(render("{{ d.missing }}|{{ d['missing'] is undefined }}|{{ d.get('missing') }}", R"({"d": {}})"),
            "|True|None");
  EXPECT_EQ(error_of("{{ d.missing.deeper }}", R"({"d": {}})"), "t:1: 'dict object' has no attribute 'missing'");
  EXPECT_EQ(error_of("{{ nope + 1 }}"), "t:1: 'nope' is undefined");
}

TEST(JinjaEval, ScopesLoopsAndMacros) {
  // A set inside a loop iteration does not outlive it; a namespace does.
  EXPECT_EQ(render("{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}"), "1110");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "3");
  EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ loop.index }}{{ a + b }}{{ loop.previtem is defined }}"
                   "{% if loop.last %}!{% endif %}{% endfor %}"),
            "13False27True!");
  EXPECT_EQ(render("{% for i in range(10) if i is odd %}{% if i > 5 %}{% break %}{% endif %}{% if i == 3 %}"
                   "{% continue %}{% endif %}{{ i }}{% else %}none{% endfor %}"),
            "15");
  EXPECT_EQ(render("{% for i in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "t:1: maximum recursion depth exceeded in macro 'f'");
  EXPECT_EQ(
      render("{% macro m(a, b='B') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{% set c = 'C' %}{{ m(1) }}{{ m(2, b=3) }}"),
      "1BC23C");
}

TEST(JinjaEval, FiltersAndMethods) {
  EXPECT_EQ(render("{{ ' a b ' | trim }}|{{ 'x-y-z'.split('-', 1) }}|{{ '--a--'.strip('-') }}|{{ 'ab'.upper() }}"),
            "a b|['x', 'y-z']|a|AB");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 'é']} | tojson }}|{{ {'b': 1} | tojson(indent=2) }}"),
            "{\"b\": 1, \"a\": [1, \"é\"]}|{\n  \"b\": 1\n}");
  EXPECT_EQ(render("{{ [3, 1, 2] | sort | join(',') }}|{{ xs | map(attribute='n') | list }}|"
                   "{{ xs | selectattr('n', 'even') | list | length }}",
                   R"({"xs": [{"n": 1}, {"n": 2}]})"),
            "1,2,3|[1, 2]|1");
  EXPECT_EQ(render("{{ '{} and {name}'.format(1, name='x') }}|{{ 'hello world' | title }}|{{ 'a\nb' | indent(2) }}"),
            "1 and x|Hello World|a\n  b");
  EXPECT_EQ(error_of("{{ raise_exception('no ' ~ 1) }}"), "t:1: no 1");
  EXPECT_EQ(error_of("{{ [].append(1) }}"), "t:1: access to attribute 'append' of 'list' object is unsafe.");
}

}  // namespace
}  // namespace moeserve::tokenizer::jinja
