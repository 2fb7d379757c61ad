// The grammar IR every front end produces: a context-free grammar over bytes.
//
// A Grammar is a list of named rules; each rule's body is an Expr tree of byte sets, sequences,
// choices, repetitions and references to rules. Characters are bytes: a Unicode character class
// is written as the choice of its UTF-8 byte sequences (utf8_class.h), so the automaton and the
// matcher never decode UTF-8. Recursion goes through rule references only; whatever a rule's body
// holds inline (groups, repetitions, classes) becomes one automaton per rule, which is what lets
// the compiled grammar decide most tokens once per position (compiled_grammar.h). Front ends
// therefore inline what they can and make rules only for recursion and for pieces they share.
//
// Plain value types; not thread-safe to mutate, safe to read from several threads.
#ifndef LLM_STRUCTURED_GRAMMAR_H_
#define LLM_STRUCTURED_GRAMMAR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "structured/byte_set.h"

namespace llm::structured {

struct Expr {
  enum class Kind {
    kEmpty,     // matches the empty string
    kBytes,     // one byte of `bytes`
    kSequence,  // items in order
    kChoice,    // one of items
    kRule,      // the rule `rule`
    kRepeat,    // items[0], between min and max times (max kUnbounded: no limit)
  };
  static constexpr int32_t kUnbounded = -1;

  Kind kind = Kind::kEmpty;
  ByteSet bytes;
  std::vector<Expr> items;
  int32_t rule = -1;
  int32_t min = 0;
  int32_t max = 0;

  static Expr Empty() { return Expr(); }
  static Expr Bytes(const ByteSet& set);
  static Expr Byte(uint8_t b) { return Bytes(ByteSet::Of(b)); }
  // The bytes of `text`, in order.
  static Expr Literal(std::string_view text);
  static Expr Sequence(std::vector<Expr> items);
  static Expr Choice(std::vector<Expr> items);
  static Expr Rule(int32_t rule);
  static Expr Repeat(Expr item, int32_t min, int32_t max);
  static Expr Optional(Expr item) { return Repeat(std::move(item), 0, 1); }
  static Expr Star(Expr item) { return Repeat(std::move(item), 0, kUnbounded); }
  static Expr Plus(Expr item) { return Repeat(std::move(item), 1, kUnbounded); }
};

class Grammar {
 public:
  struct Rule {
    std::string name;
    Expr body;
  };

  // Adds a rule with an empty body (set it with SetBody; declaring first allows recursion).
  // Returns its id. Names are for messages and ToString; they need not be unique.
  int32_t AddRule(std::string name);
  int32_t AddRule(std::string name, Expr body);
  void SetBody(int32_t rule, Expr body) { rules_[rule].body = std::move(body); }
  std::optional<int32_t> FindRule(std::string_view name) const;

  void set_root(int32_t rule) { root_ = rule; }
  int32_t root() const { return root_; }
  const std::vector<Rule>& rules() const { return rules_; }

  // GBNF-like text of the grammar, for messages and tests ("root ::= [\x7b] ...").
  std::string ToString() const;

 private:
  std::vector<Rule> rules_;
  int32_t root_ = 0;
};

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_GRAMMAR_H_
