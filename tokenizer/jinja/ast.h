// The chat-template AST: what the parser builds once per template and the interpreter walks
// for every rendering.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace moeserve::tokenizer::jinja {

enum class ExprKind {
  Literal,    // value
  Name,       // name
  List,       // items
  Tuple,      // items
  DictLit,    // items: key, value, key, value...
  Attr,       // items[0].name
  Item,       // items[0][items[1]]
  Slice,      // items[0][items[1]:items[2]:items[3]] (null children where absent)
  Call,       // items[0](items[1:]...), keyword names in `keywords` for the last ones
  Filter,     // items[0] | name(items[1:]...)
  Test,       // items[0] is [not] name(items[1:]...)
  Neg,        // -items[0]
  Pos,        // +items[0]
  Not,        // not items[0]
  Binary,     // items[0] name items[1]: + - * / // % ** ~ and or
  Compare,    // items[0] ops[0] items[1] ops[1] items[2]...: == != < <= > >= in notin
  Condition,  // items[0] if items[1] else items[2] (items[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Value value;
  std::vector<std::unique_ptr<Expr>> items;
  std::vector<std::string> keywords;  // Call / Filter / Test: names of the trailing keyword arguments
  std::vector<std::string> ops;       // Compare
  bool negated = false;               // Test: `is not`
};
using ExprPtr = std::unique_ptr<Expr>;

enum class StmtKind { Text, Print, If, For, Set, SetBlock, Macro, Break, Continue, FilterBlock, Body };

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                // Text
  std::vector<std::string> names;  // For / Set targets; Macro: name then parameters
  std::string attribute;           // Set: `ns.attribute = ...`
  std::vector<ExprPtr> exprs;      // Print: value; If: conditions; For: iterable, filter; Set: value;
                                   // Macro: parameter defaults (null where none); FilterBlock: the filter
                                   // applied to a placeholder
  std::vector<Body> bodies;        // If: one per condition, then else; For: body, else; others: body
  bool recursive = false;
};

}  // namespace moeserve::tokenizer::jinja
