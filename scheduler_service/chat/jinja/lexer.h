// The lexer: template source to tokens. The text between tags comes out as kText tokens with
// jinja2's whitespace control applied (trim_blocks, lstrip_blocks, "-" and "+"), and a raw
// block's body as text; inside tags come names, literals and operators. Syntax errors throw
// JinjaError.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_LEXER_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace llm::jinja {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok kind;
  std::string text;  // text, name, string value or operator
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
  int col = 1;
};

// The tokens of `source` (its newlines already "\n"), ending with kEof.
std::vector<Token> Tokenize(std::string_view source);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_LEXER_H_
