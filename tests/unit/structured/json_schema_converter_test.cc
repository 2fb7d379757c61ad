// JsonSchemaToGrammar and JsonObjectGrammar: documents each schema accepts and rejects, what it
// refuses (by keyword), and random walks over real vocabularies whose finished texts must parse
// as JSON and validate against the schema (a small validator below, independent of the grammar).
#include "structured/json_schema_converter.h"

#include <ostream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "structured/grammar_cache.h"
#include "tests/unit/structured/test_util.h"

namespace llm::structured {
namespace {

using Json = nlohmann::json;
using testing::CompileForBytes;
using testing::Matches;

struct Case {
  const char* name;
  std::string schema;
  std::vector<std::string> accepted;
  std::vector<std::string> rejected;
};

// Named in messages by its text (gtest would print the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  return {
      {"string",
       R"({"type": "string"})",
       {R"("")", R"("a b")", R"("\"\\\/\b\f\n\r\t\u00e9")", "\"caf\xC3\xA9\""},
       {"a", R"("a)", R"("\x")", "\"\x01\"", R"("\u00g0")", " \"a\"", "\"\xC3\""}},
      {"integer", R"({"type": "integer"})", {"0", "-7", "123"}, {"01", "1.5", "-", "+1", "1e3"}},
      {"number",
       R"({"type": "number"})",
       {"0", "-0.5", "1e10", "2.5E-3", "10"},
       {".5", "1.", "01", "1e", "NaN"}},
      {"boolean_null",
       R"({"type": ["boolean", "null"]})",
       {"true", "false", "null"},
       {"0", "True"}},
      {"enum",
       R"({"enum": ["red", 3, null, {"a": [1]}]})",
       {R"("red")", "3", "null", R"({"a":[1]})"},
       {R"("blue")", "red", R"({"a": [1]})"}},
      {"const", R"({"const": "x"})", {R"("x")"}, {R"("y")"}},
      {"object_required_optional",
       R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
           "c": {"type": "boolean"}}, "required": ["b"]})",
       {R"({"b": "x"})", R"({"a": 1, "b": "x"})", R"({"b":"x","c":true})",
        R"({ "a" : 1 , "b" : "" , "c" : false })", "{\n  \"a\": 1,\n  \"b\": \"\"\n}"},
       {R"({})", R"({"a": 1})", R"({"b": "x", "a": 1})", R"({"b": "x", "d": 1})", R"({"b": "x",})",
        R"({"b": 1})"}},
      {"object_all_optional",
       R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})",
       {"{}", R"({"a": 1})", R"({"b": 2})", R"({"a": 1, "b": 2})"},
       {R"({"b": 2, "a": 1})", R"({,"b": 2})", R"({"a": 1,})"}},
      {"additional_properties",
       R"({"type": "object", "properties": {"a": {"type": "integer"}},
           "additionalProperties": {"type": "string"}})",
       {"{}", R"({"a": 1})", R"({"a": 1, "x": "y", "z": ""})", R"({"x": "y"})"},
       {R"({"x": 1})", R"({"x": "y", "a": 1})"}},
      {"any_object",
       R"({"type": "object"})",
       {"{}", R"({"k": [1, {"n": null}], "s": "t"})"},
       {"[]", R"({"k"})", R"({1: 2})"}},
      {"array",
       R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
       {"[1]", "[1, 2, 3]", "[ 1 ,2 ]"},
       {"[]", "[1, 2, 3, 4]", R"(["a"])", "[1,]"}},
      {"prefix_items",
       R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]})",
       {R"(["a", 1])"},
       {R"(["a"])", R"(["a", 1, 2])", R"([1, "a"])"}},
      {"string_length",
       R"({"type": "string", "minLength": 2, "maxLength": 3})",
       {R"("ab")", R"("abc")", R"("a\n")", "\"\xC3\xA9\xC3\xA9\""},
       {R"("a")", R"("abcd")", "\"\xC3\xA9\""}},
      {"pattern",
       R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})",
       {R"("AB-123")"},
       {R"("ab-123")", R"("AB-12")", R"(AB-123)"}},
      {"format_date_time",
       R"({"type": "string", "format": "date-time"})",
       {R"("2024-02-29T13:45:00Z")", R"("2024-02-29T13:45:00.123+01:00")"},
       {R"("2024-13-01T00:00:00Z")", R"("2024-02-29 13:45:00Z")"}},
      {"any_of",
       R"({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "null"}}]})",
       {"1", "[]", "[null, null]"},
       {"[1]", R"("1")"}},
      {"ref_defs",
       R"({"type": "object", "properties": {"p": {"$ref": "#/$defs/point"},
           "q": {"$ref": "#/definitions/point"}}, "required": ["p"],
           "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}},
                               "required": ["x"]}},
           "definitions": {"point": {"type": "array", "items": {"type": "number"}}}})",
       {R"({"p": {"x": 1}})", R"({"p": {"x": 1}, "q": [1, 2]})"},
       {R"({"p": [1]})", R"({"p": {"x": 1}, "q": {"x": 1}})"}},
      {"recursive_ref",
       R"({"type": "object", "properties": {"v": {"type": "integer"},
           "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v"]})",
       {R"({"v": 1})", R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]})"},
       {R"({"v": 1, "kids": [{}]})", R"({"kids": []})"}},
      {"integer_bounds",
       R"({"type": "integer", "minimum": -3, "maximum": 120})",
       {"-3", "0", "7", "99", "120"},
       {"-4", "121", "1000", "-0", "07"}},
      {"integer_exclusive",
       R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10.5})",
       {"1", "10"},
       {"0", "11", "-1"}},
      {"integer_draft4_exclusive",
       R"({"type": "integer", "minimum": 5, "exclusiveMinimum": true, "maximum": 7})",
       {"6", "7"},
       {"5", "8"}},
      {"number_non_negative",
       R"({"type": "number", "minimum": 0})",
       {"0", "0.5", "12e3"},
       {"-1", "-0.5", "-0"}},
      {"true_schema", "true", {"1", R"("s")", "[]", "{}", "null"}, {"", "nul"}},
  };
}

class JsonSchemaCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(JsonSchemaCaseTest, AcceptsAndRejects) {
  const Case& c = GetParam();
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(c.schema);
  ASSERT_TRUE(g.ok()) << g.status();
  auto compiled = CompileForBytes(*g);
  ASSERT_NE(compiled, nullptr) << g->ToString();
  for (const std::string& s : c.accepted) EXPECT_TRUE(Matches(compiled, s)) << s;
  for (const std::string& s : c.rejected) EXPECT_FALSE(Matches(compiled, s)) << s;
}

INSTANTIATE_TEST_SUITE_P(Schemas, JsonSchemaCaseTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(JsonSchemaConverterTest, CompactWhitespaceAllowsNone) {
  JsonGrammarOptions compact;
  compact.whitespace = JsonGrammarOptions::Whitespace::kCompact;
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(
      R"({"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]})", compact);
  ASSERT_TRUE(g.ok());
  auto c = CompileForBytes(*g);
  EXPECT_TRUE(Matches(c, R"({"a":[1,{"b":2}]})"));
  EXPECT_FALSE(Matches(c, R"({"a": []})"));
  EXPECT_FALSE(Matches(c, R"({"a":[1, 2]})"));
}

TEST(JsonSchemaConverterTest, JsonObjectIsAnyObject) {
  auto c = CompileForBytes(JsonObjectGrammar());
  EXPECT_TRUE(Matches(c, "{}"));
  EXPECT_TRUE(Matches(c, R"({"a": {"b": [1, -2.5e-3, "x", true, false, null, [], {}]}})"));
  EXPECT_FALSE(Matches(c, "[]"));
  EXPECT_FALSE(Matches(c, "\"s\""));
  EXPECT_FALSE(Matches(c, " {}"));
  EXPECT_FALSE(Matches(c, R"({"a": 1,})"));
  EXPECT_FALSE(Matches(c, R"({'a': 1})"));
}

TEST(JsonSchemaConverterTest, RefusesNamingTheKeyword) {
  for (const auto& [schema, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type": "integer", "multipleOf": 2})", "keyword 'multipleOf'"},
           {R"({"type": "number", "maximum": 1.5})", "minimum/maximum on a number"},
           {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no integer fits"},
           {R"({"type": "array", "uniqueItems": true})", "keyword 'uniqueItems'"},
           {R"({"type": "object", "patternProperties": {}})", "keyword 'patternProperties'"},
           {R"({"if": {}, "then": {}})", "keyword 'if'"},
           {R"({"not": {}})", "keyword 'not'"},
           {R"({"type": "string", "format": "email"})", "format 'email'"},
           {R"({"allOf": [{"type": "string"}, {"minLength": 1}]})", "allOf of more than one"},
           {R"({"anyOf": [{"type": "string"}], "type": "string"})", "'anyOf' beside 'type'"},
           {R"({"$ref": "http://example.com/s.json"})", "remote $ref"},
           {R"({"$ref": "#/$defs/missing"})", "points nowhere"},
           {R"({"type": "tuple"})", "unknown type 'tuple'"},
           {R"x({"type": "string", "pattern": "a(?=b)"})x", "lookaround"},
           {R"({"type": "object", "properties": {"a": false}})", "/properties/a"},
           {R"({"type": )", "not valid JSON"},
       }) {
    absl::StatusOr<Grammar> g = JsonSchemaToGrammar(schema);
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(g.status().message()), ::testing::HasSubstr(message)) << schema;
  }
}

// --- Random walks, validated independently of the grammar. ---

// Whether `v` satisfies `schema`, for the keywords the walks' schemas use.
bool Validate(const Json& v, const Json& schema, const Json& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    if (ref == "#") return Validate(v, root, root);
    return Validate(v, root.at(Json::json_pointer(ref.substr(1))), root);
  }
  if (schema.contains("anyOf")) {
    for (const Json& s : schema["anyOf"]) {
      if (Validate(v, s, root)) return true;
    }
    return false;
  }
  if (schema.contains("const")) return v == schema["const"];
  if (schema.contains("enum")) {
    for (const Json& e : schema["enum"]) {
      if (v == e) return true;
    }
    return false;
  }
  if (schema.contains("type")) {
    std::vector<std::string> types;
    if (schema["type"].is_string()) {
      types.push_back(schema["type"]);
    } else {
      for (const Json& t : schema["type"]) types.push_back(t);
    }
    bool ok = false;
    for (const std::string& t : types) {
      ok = ok || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
           (t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
           (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) ||
           (t == "null" && v.is_null());
    }
    if (!ok) return false;
  }
  if (v.is_object()) {
    const Json props = schema.value("properties", Json::object());
    for (const Json& r : schema.value("required", Json::array())) {
      if (!v.contains(r.get<std::string>())) return false;
    }
    for (const auto& [k, sub] : v.items()) {
      if (props.contains(k)) {
        if (!Validate(sub, props[k], root)) return false;
      } else if (!Validate(
                     sub,
                     schema.value("additionalProperties", Json(!schema.contains("properties"))),
                     root)) {
        return false;
      }
    }
  }
  if (v.is_array()) {
    if (v.size() < schema.value("minItems", size_t{0})) return false;
    if (v.size() > schema.value("maxItems", size_t{1} << 30)) return false;
    for (const Json& item : v) {
      if (schema.contains("items") && !Validate(item, schema["items"], root)) return false;
    }
  }
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    size_t chars = 0;
    for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
    if (chars < schema.value("minLength", size_t{0})) return false;
    if (chars > schema.value("maxLength", size_t{1} << 30)) return false;
    if (schema.contains("pattern") &&
        !std::regex_match(s, std::regex(schema["pattern"].get<std::string>()))) {
      return false;
    }
  }
  return true;
}

constexpr const char* kWalkSchemas[] = {
    R"({"type": "object", "properties": {
         "name": {"type": "string", "maxLength": 8},
         "age": {"type": "integer", "minimum": 0, "maximum": 150},
         "color": {"enum": ["red", "green", 7, null]},
         "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3},
                  "minItems": 1, "maxItems": 3},
         "pos": {"$ref": "#/$defs/point"},
         "score": {"type": ["number", "null"]}},
       "required": ["name", "pos"],
       "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"},
                 "y": {"type": "number"}}, "required": ["x"]}}})",
    R"({"type": "object", "properties": {"v": {"type": "integer"},
         "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}, "required": ["v"]})",
    R"({"anyOf": [{"type": "boolean"}, {"const": "fixed"},
                  {"type": "array", "items": {"type": "string", "pattern": "[a-c]{2}[0-9]"}}]})",
    R"({"type": "object"})",
};

// Samples allowed tokens until a stop token; leans towards tokens that close something, so that
// most walks finish. Returns false when the walk did not finish within `max_steps`.
bool RandomWalk(GrammarMatcher* m, std::mt19937* rng, int max_steps, bool check_brute_force,
                std::string* text) {
  const TokenizerInfo& tok = m->grammar().tokenizer();
  for (int step = 0; step < max_steps; ++step) {
    const std::vector<uint32_t> mask = testing::FastMask(m);
    if (check_brute_force) {
      EXPECT_EQ(mask, testing::BruteForceMask(m)) << "at '" << *text << "'";
    }
    const std::vector<int32_t> allowed = testing::AllowedIds(mask);
    EXPECT_FALSE(allowed.empty()) << "dead end at '" << *text << "'";
    if (allowed.empty()) return false;
    std::vector<int32_t> stops, closers;
    for (int32_t id : allowed) {
      if (tok.is_stop(id)) {
        stops.push_back(id);
      } else if (tok.token_bytes(id).find_first_of("\"]}") != std::string_view::npos) {
        closers.push_back(id);
      }
    }
    std::uniform_real_distribution<double> coin(0, 1);
    const std::vector<int32_t>& pool = !stops.empty()                         ? stops
                                       : !closers.empty() && coin(*rng) < 0.4 ? closers
                                                                              : allowed;
    const int32_t id = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(*rng)];
    EXPECT_TRUE(m->AcceptToken(id));
    if (m->IsTerminated()) return true;
    *text += tok.token_bytes(id);
  }
  return false;
}

class JsonWalkTest : public ::testing::TestWithParam<const char*> {};

TEST_P(JsonWalkTest, FinishedWalksAreValidJsonOfTheSchema) {
  const bool smollm2 = std::string(GetParam()) == "smollm2";
  const std::string path = smollm2 ? testing::SmolLM2Path() : testing::FortuneBpePath();
  absl::StatusOr<testing::Vocab> vocab = testing::LoadVocab(path, VocabEncoding::kByteLevel);
  if (!vocab.ok()) GTEST_SKIP() << "no vocabulary at " << path;
  GrammarCache cache(vocab->info);
  std::mt19937 rng(11);
  for (const char* schema_text : kWalkSchemas) {
    SCOPED_TRACE(schema_text);
    const Json schema = Json::parse(schema_text);
    auto g = cache.Get({GrammarKind::kJsonSchema, schema_text});
    ASSERT_TRUE(g.ok()) << g.status();
    const int walks = smollm2 ? 6 : 20;
    int finished = 0;
    for (int w = 0; w < walks; ++w) {
      GrammarMatcher m(*g);
      std::string text;
      if (!RandomWalk(&m, &rng, 400, /*check_brute_force=*/!smollm2, &text)) continue;
      ++finished;
      const Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      // nlohmann::json refuses numbers past a double's range (1e19911), which JSON allows.
      const bool huge_number = std::regex_search(text, std::regex("[eE][-+]?[0-9]{3,}"));
      ASSERT_TRUE(!doc.is_discarded() || huge_number) << "not JSON: " << text;
      if (!doc.is_discarded()) EXPECT_TRUE(Validate(doc, schema, schema)) << text;
      GrammarMatcher replay(*g);  // the grammar itself takes the text back byte by byte
      EXPECT_TRUE(replay.AcceptString(text) && replay.CanTerminate()) << text;
    }
    EXPECT_GE(finished, walks / 2) << "too few walks finished to test anything";
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, JsonWalkTest, ::testing::Values("fortune", "smollm2"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace llm::structured
