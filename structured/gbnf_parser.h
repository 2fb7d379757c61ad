// The GBNF front end: llama.cpp's grammar format to a Grammar.
//
//   root   ::= object                 # a rule; `root` is where a match starts
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= [a-z]+ ":" ws ( "x" | "y" ){1,3} [^"\\\x00-\x1f]* .
//
// Supported: rules `name ::= ...` (names of letters, digits, '-' and '_', defined in any order);
// string literals with escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH; character classes
// [a-z0-9_] and negated [^...] over Unicode codepoints (matched as UTF-8); `.` (any character);
// groups; alternatives `|`; repetition * + ? {m} {m,} {m,n} {,n}; `#` comments. A rule ends at
// the end of its line unless inside a group or continued by a line starting with `|`.
//
// Refused with INVALID_ARGUMENT naming the construct and line: token references (<[id]>,
// <token>), undefined or twice-defined rules, a missing root rule, and what GrammarAutomaton
// refuses (left recursion) when compiled.
#ifndef LLM_STRUCTURED_GBNF_PARSER_H_
#define LLM_STRUCTURED_GBNF_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "structured/grammar.h"

namespace llm::structured {

absl::StatusOr<Grammar> ParseGbnf(std::string_view text);

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_GBNF_PARSER_H_
