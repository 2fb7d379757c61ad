// The parser: tokens to the syntax tree of ast.h, by recursive descent with a function per
// statement and per level of operator precedence. Syntax errors throw JinjaError.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_PARSER_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_PARSER_H_

#include <vector>

#include "scheduler_service/chat/jinja/ast.h"
#include "scheduler_service/chat/jinja/lexer.h"

namespace llm::jinja {

// The statements of the template whose tokens (Tokenize's) are `tokens`.
Body ParseTokens(std::vector<Token> tokens);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_PARSER_H_
