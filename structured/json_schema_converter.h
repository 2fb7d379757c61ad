// The JSON Schema front end (and the json_object mode): a schema to a Grammar of the JSON texts
// it accepts, in the manner of xgrammar's and llama.cpp's json-schema-to-grammar.
//
// Supported:
//   type: object, array, string, number, integer, boolean, null, or a list of them;
//   no type: inferred from the keywords present (properties -> object, items -> array,
//     minLength/pattern/format -> string), any JSON value when none is;
//   enum, const (any JSON values; written compactly, as nlohmann::json dumps them);
//   object: properties (generated in the schema's order; those in `required` always, the others
//     optionally), required, additionalProperties (false, true or a schema; extra keys come
//     after the listed ones). Absent additionalProperties means false when `properties` is
//     given (OpenAI's strict mode, xgrammar's default) and any object when it is not, so that
//     {"type": "object"} still means any object. A required name missing from properties is
//     generated with any value;
//   array: items (a schema or false), prefixItems (all generated, in order; then `items`, none
//     when it is absent), minItems/maxItems (without prefixItems);
//   string: minLength/maxLength (in characters; an escape is one), pattern (regex_parser.h,
//     anchored at both ends, matched against the raw text between the quotes), format date,
//     time, date-time, uuid;
//   integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, or draft 4's
//     booleans), as the exact set of integers (integer_range.h); number: minimum 0 only;
//   anyOf, oneOf (as anyOf: one alternative is generated, exclusivity is not checked), allOf
//     of one schema; $ref to "#", "#/$defs/...", "#/definitions/..." (any local JSON pointer),
//     recursion included; boolean schemas (true: any value);
//   annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
//     readOnly, writeOnly) and "x-" extensions are ignored.
// Refused with INVALID_ARGUMENT naming the keyword and where it is: other bounds on numbers,
// multipleOf, uniqueItems, contains, patternProperties, propertyNames,
// min/maxProperties, dependent*, if/then/else, not, unevaluated*, other formats, remote $refs,
// anyOf/oneOf/$ref beside other constraining keywords, the false schema, unknown keywords.
//
// Whitespace: JSON's whitespace [ \t\n\r]* between tokens (kAny, xgrammar's any_whitespace;
// not at the very start or end), or none at all (kCompact: {"a":1,"b":[2,3]}). kAny lets a model
// emit whitespace without end; kCompact is the guard where that matters.
#ifndef LLM_STRUCTURED_JSON_SCHEMA_CONVERTER_H_
#define LLM_STRUCTURED_JSON_SCHEMA_CONVERTER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "structured/grammar.h"

namespace llm::structured {

struct JsonGrammarOptions {
  enum class Whitespace { kAny, kCompact };
  Whitespace whitespace = Whitespace::kAny;
};

// `schema` is the schema's JSON text. INVALID_ARGUMENT for text that is not JSON too.
absl::StatusOr<Grammar> JsonSchemaToGrammar(std::string_view schema,
                                            const JsonGrammarOptions& options = {});

// Any JSON value whose top level is an object (OpenAI's response_format json_object).
Grammar JsonObjectGrammar(const JsonGrammarOptions& options = {});

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_JSON_SCHEMA_CONVERTER_H_
