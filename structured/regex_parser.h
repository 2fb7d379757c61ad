// The regex front end: a regular expression to a Grammar (or an Expr, for JSON Schema's
// `pattern`). The whole text must match: anchors ^ and $ at the ends are implied and accepted.
//
// Supported: literals (UTF-8), `.` (any character but \n), classes [a-z] [^...] with escapes
// and \d \w \s \D \W \S inside, escapes \d \w \s (ASCII: [0-9], [A-Za-z0-9_], [ \t\n\r\f\v])
// and their negations, \n \r \t \f \v \0 \xHH \uHHHH and escaped punctuation, groups ( ) (?: )
// (?P<name> ) (?<name> ), alternation |, quantifiers * + ? {m} {m,} {m,n}, lazy ones (*? ...:
// the same language). Characters are Unicode codepoints matched as UTF-8.
//
// Refused with INVALID_ARGUMENT naming the construct: lookaround, backreferences, word
// boundaries \b \B, \A \Z, anchors inside the pattern, inline flags (?i), possessive
// quantifiers, Unicode properties \p{...}, POSIX classes [[:alpha:]].
#ifndef LLM_STRUCTURED_REGEX_PARSER_H_
#define LLM_STRUCTURED_REGEX_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "structured/grammar.h"

namespace llm::structured {

absl::StatusOr<Expr> RegexToExpr(std::string_view pattern);
absl::StatusOr<Grammar> ParseRegex(std::string_view pattern);

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_REGEX_PARSER_H_
