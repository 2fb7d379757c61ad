// The JSON integers between two bounds as a grammar over their decimal text: what JSON Schema's
// minimum / maximum of an integer compile to. Digit strings of each length are split the way a
// range is written as a regex (1[5-9]|[2-8][0-9]|9[0-3] for 15..93), so the grammar admits
// exactly the integers in the range, written as JSON writes them (no leading zeros, no "-0").
#ifndef LLM_STRUCTURED_INTEGER_RANGE_H_
#define LLM_STRUCTURED_INTEGER_RANGE_H_

#include <cstdint>
#include <optional>

#include "structured/grammar.h"

namespace llm::structured {

// The integers n with min <= n <= max; an absent bound is unbounded. Requires min <= max when
// both are set, and bounds within +-10^18.
Expr IntegerRange(std::optional<int64_t> min, std::optional<int64_t> max);

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_INTEGER_RANGE_H_
