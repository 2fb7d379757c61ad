#include "structured/json_schema_converter.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "structured/integer_range.h"
#include "structured/regex_parser.h"
#include "structured/utf8_class.h"

namespace llm::structured {
namespace {

using Json = nlohmann::ordered_json;

const absl::flat_hash_set<std::string>& Annotations() {
  static const auto* set = new absl::flat_hash_set<std::string>{
      "title",    "description", "default",  "examples",  "$schema", "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
  return *set;
}

const absl::flat_hash_set<std::string>& Supported() {
  static const auto* set = new absl::flat_hash_set<std::string>{"type",
                                                                "enum",
                                                                "const",
                                                                "properties",
                                                                "required",
                                                                "additionalProperties",
                                                                "items",
                                                                "prefixItems",
                                                                "minItems",
                                                                "maxItems",
                                                                "minLength",
                                                                "maxLength",
                                                                "pattern",
                                                                "format",
                                                                "anyOf",
                                                                "oneOf",
                                                                "allOf",
                                                                "$ref",
                                                                "minimum",
                                                                "maximum",
                                                                "exclusiveMinimum",
                                                                "exclusiveMaximum"};
  return *set;
}

// The regexes of the supported string formats (RFC 3339 dates and times, RFC 4122 UUIDs).
const absl::flat_hash_map<std::string, std::string>& Formats() {
  static const auto* map = [] {
    const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
    const std::string time =
        R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
    return new absl::flat_hash_map<std::string, std::string>{
        {"date", date},
        {"time", time},
        {"date-time", date + "T" + time},
        {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
    };
  }();
  return *map;
}

class JsonSchemaConverter {
 public:
  explicit JsonSchemaConverter(const JsonGrammarOptions& options) : options_(options) {}

  absl::StatusOr<Grammar> Convert(const Json& schema) {
    root_schema_ = &schema;
    const int32_t root = grammar_.AddRule("root");
    absl::StatusOr<Expr> body = Visit(schema, "#");
    if (!body.ok()) return body.status();
    grammar_.SetBody(root, std::move(body).value());
    grammar_.set_root(root);
    return std::move(grammar_);
  }

  Grammar AnyObject() {
    const int32_t root = grammar_.AddRule("root", ObjectRule());
    grammar_.set_root(root);
    return std::move(grammar_);
  }

 private:
  static absl::Status Refuse(const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("JSON schema at ", path, ": ", what));
  }

  Expr Ws() const {
    if (options_.whitespace == JsonGrammarOptions::Whitespace::kCompact) return Expr::Empty();
    ByteSet ws;
    for (char c : {' ', '\t', '\n', '\r'}) ws.Add(static_cast<uint8_t>(c));
    return Expr::Star(Expr::Bytes(ws));
  }
  // ws "," ws
  Expr Comma() const { return Expr::Sequence({Ws(), Expr::Byte(','), Ws()}); }

  // One character of a JSON string's text: unescaped (not '"', '\\' or a control character), or
  // an escape.
  static Expr JsonChar() {
    Expr plain = Utf8Class({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, /*negated=*/true);
    ByteSet escaped;
    for (char c : std::string_view("\"\\/bfnrt")) escaped.Add(static_cast<uint8_t>(c));
    ByteSet hex;
    hex.AddRange('0', '9');
    hex.AddRange('a', 'f');
    hex.AddRange('A', 'F');
    Expr unicode = Expr::Sequence({Expr::Byte('u'), Expr::Repeat(Expr::Bytes(hex), 4, 4)});
    Expr escape = Expr::Sequence(
        {Expr::Byte('\\'), Expr::Choice({Expr::Bytes(escaped), std::move(unicode)})});
    return Expr::Choice({std::move(plain), std::move(escape)});
  }

  Expr Shared(int32_t* rule, const char* name, Expr (JsonSchemaConverter::*body)()) {
    if (*rule < 0) {
      *rule = grammar_.AddRule(name);
      grammar_.SetBody(*rule, (this->*body)());
    }
    return Expr::Rule(*rule);
  }

  Expr StringBody() {
    return Expr::Sequence({Expr::Byte('"'), Expr::Star(JsonChar()), Expr::Byte('"')});
  }
  static Expr UnsignedInteger() {
    return Expr::Choice({Expr::Byte('0'), Expr::Sequence({Expr::Bytes(ByteSet::Range('1', '9')),
                                                          Expr::Star(Digit())})});
  }
  Expr IntegerBody() {
    return Expr::Sequence({Expr::Optional(Expr::Byte('-')), UnsignedInteger()});
  }
  // integer ("." digits)? ([eE] [+-]? digits)?
  static Expr NumberOf(Expr integer) {
    ByteSet sign;
    sign.Add('+');
    sign.Add('-');
    ByteSet e;
    e.Add('e');
    e.Add('E');
    return Expr::Sequence(
        {std::move(integer), Expr::Optional(Expr::Sequence({Expr::Byte('.'), Expr::Plus(Digit())})),
         Expr::Optional(Expr::Sequence(
             {Expr::Bytes(e), Expr::Optional(Expr::Bytes(sign)), Expr::Plus(Digit())}))});
  }
  Expr NumberBody() { return NumberOf(IntegerBody()); }
  static Expr Digit() { return Expr::Bytes(ByteSet::Range('0', '9')); }

  Expr StringRule() { return Shared(&string_rule_, "string", &JsonSchemaConverter::StringBody); }
  Expr IntegerRule() {
    return Shared(&integer_rule_, "integer", &JsonSchemaConverter::IntegerBody);
  }
  Expr NumberRule() { return Shared(&number_rule_, "number", &JsonSchemaConverter::NumberBody); }

  // value ::= object | array | string | number | true | false | null, and its object and array.
  Expr ValueRule() {
    if (value_rule_ < 0) {
      value_rule_ = grammar_.AddRule("value");
      object_rule_ = grammar_.AddRule("object");
      array_rule_ = grammar_.AddRule("array");
      grammar_.SetBody(value_rule_, Expr::Choice({Expr::Rule(object_rule_), Expr::Rule(array_rule_),
                                                  StringRule(), NumberRule(), Expr::Literal("true"),
                                                  Expr::Literal("false"), Expr::Literal("null")}));
      Expr member =
          Expr::Sequence({StringRule(), Ws(), Expr::Byte(':'), Ws(), Expr::Rule(value_rule_)});
      grammar_.SetBody(object_rule_, Bracketed('{', Expr::Optional(SeparatedList(member)), '}'));
      grammar_.SetBody(array_rule_,
                       Bracketed('[', Expr::Optional(SeparatedList(Expr::Rule(value_rule_))), ']'));
    }
    return Expr::Rule(value_rule_);
  }
  Expr ObjectRule() {
    ValueRule();
    return Expr::Rule(object_rule_);
  }

  // item ("," item)*
  Expr SeparatedList(const Expr& item) const {
    return Expr::Sequence({item, Expr::Star(Expr::Sequence({Comma(), item}))});
  }
  // open ws body ws close
  Expr Bracketed(char open, Expr body, char close) const {
    return Expr::Sequence({Expr::Byte(static_cast<uint8_t>(open)), Ws(), std::move(body), Ws(),
                           Expr::Byte(static_cast<uint8_t>(close))});
  }

  absl::Status CheckKeywords(const Json& schema, const std::string& path) const {
    for (const auto& [key, value] : schema.items()) {
      if (Supported().contains(key) || Annotations().contains(key) || key.starts_with("x-"))
        continue;
      return Refuse(path, absl::StrCat("keyword '", key, "' is not supported"));
    }
    return absl::OkStatus();
  }

  // The keywords of `schema` that constrain (not annotations), other than `except`.
  static std::vector<std::string> OtherConstraints(const Json& schema, std::string_view except) {
    std::vector<std::string> out;
    for (const auto& [key, value] : schema.items()) {
      if (key != except && !Annotations().contains(key) && !key.starts_with("x-"))
        out.push_back(key);
    }
    return out;
  }

  absl::StatusOr<Expr> Visit(const Json& schema, const std::string& path) {
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return ValueRule();
      return Refuse(path, "the schema false matches nothing");
    }
    if (!schema.is_object()) return Refuse(path, "a schema must be an object or a boolean");
    if (absl::Status s = CheckKeywords(schema, path); !s.ok()) return s;
    for (const char* combinator : {"$ref", "anyOf", "oneOf", "allOf"}) {
      if (!schema.contains(combinator)) continue;
      const std::vector<std::string> others = OtherConstraints(schema, combinator);
      if (!others.empty()) {
        return Refuse(path, absl::StrCat("'", combinator, "' beside '", others[0], "'"));
      }
    }
    if (schema.contains("$ref")) return VisitRef(schema["$ref"], path);
    for (const char* key : {"anyOf", "oneOf"}) {
      if (schema.contains(key)) return VisitAnyOf(schema[key], absl::StrCat(path, "/", key));
    }
    if (schema.contains("allOf")) {
      const Json& all = schema["allOf"];
      if (!all.is_array() || all.size() != 1) {
        return Refuse(path, "allOf of more than one schema is not supported");
      }
      return Visit(all[0], path + "/allOf/0");
    }
    if (schema.contains("const")) return Expr::Literal(schema["const"].dump());
    if (schema.contains("enum")) {
      const Json& values = schema["enum"];
      if (!values.is_array() || values.empty())
        return Refuse(path, "enum must be a non-empty array");
      std::vector<Expr> choices;
      for (const Json& v : values) choices.push_back(Expr::Literal(v.dump()));
      return Expr::Choice(std::move(choices));
    }
    if (!schema.contains("type")) return VisitType(schema, InferType(schema), path);
    const Json& type = schema["type"];
    if (type.is_string()) return VisitType(schema, type.get<std::string>(), path);
    if (!type.is_array() || type.empty()) return Refuse(path, "type must be a string or a list");
    std::vector<Expr> choices;
    for (const Json& t : type) {
      if (!t.is_string()) return Refuse(path, "type must be a string or a list of strings");
      absl::StatusOr<Expr> e = VisitType(schema, t.get<std::string>(), path);
      if (!e.ok()) return e;
      choices.push_back(std::move(e).value());
    }
    return Expr::Choice(std::move(choices));
  }

  static std::string InferType(const Json& schema) {
    for (const char* k : {"properties", "required", "additionalProperties"}) {
      if (schema.contains(k)) return "object";
    }
    for (const char* k : {"items", "prefixItems", "minItems", "maxItems"}) {
      if (schema.contains(k)) return "array";
    }
    for (const char* k : {"minLength", "maxLength", "pattern", "format"}) {
      if (schema.contains(k)) return "string";
    }
    return "any";
  }

  absl::StatusOr<Expr> VisitType(const Json& schema, const std::string& type,
                                 const std::string& path) {
    if (type == "any") return ValueRule();
    if (type == "string") return VisitString(schema, path);
    if (type == "integer") return VisitInteger(schema, path);
    if (type == "number") return VisitNumber(schema, path);
    if (type == "boolean") return Expr::Choice({Expr::Literal("true"), Expr::Literal("false")});
    if (type == "null") return Expr::Literal("null");
    if (type == "object") return VisitObject(schema, path);
    if (type == "array") return VisitArray(schema, path);
    return Refuse(path, absl::StrCat("unknown type '", type, "'"));
  }

  static bool HasBounds(const Json& schema) {
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (schema.contains(k)) return true;
    }
    return false;
  }

  // minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers, or draft 4's booleans
  // beside minimum and maximum) as the integers they admit.
  absl::StatusOr<Expr> VisitInteger(const Json& schema, const std::string& path) {
    if (!HasBounds(schema)) return IntegerRule();
    std::optional<int64_t> lo, hi;
    constexpr double kLimit = 1e18;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!schema.contains(key) || schema[key].is_boolean()) continue;
      if (!schema[key].is_number()) return Refuse(path, absl::StrCat(key, " must be a number"));
      const double v = schema[key].get<double>();
      if (std::abs(v) > kLimit) return Refuse(path, absl::StrCat(key, " beyond 10^18"));
      const std::string k = key;
      const bool draft4_exclusive =
          schema.value(k == "minimum" ? "exclusiveMinimum" : "exclusiveMaximum", Json())
              .is_boolean() &&
          schema[k == "minimum" ? "exclusiveMinimum" : "exclusiveMaximum"].get<bool>();
      if (k == "minimum" || k == "exclusiveMinimum") {
        const bool exclusive = k == "exclusiveMinimum" || draft4_exclusive;
        const int64_t b = static_cast<int64_t>(exclusive ? std::floor(v) + 1 : std::ceil(v));
        lo = lo ? std::max(*lo, b) : b;
      } else {
        const bool exclusive = k == "exclusiveMaximum" || draft4_exclusive;
        const int64_t b = static_cast<int64_t>(exclusive ? std::ceil(v) - 1 : std::floor(v));
        hi = hi ? std::min(*hi, b) : b;
      }
    }
    if (lo && hi && *lo > *hi) return Refuse(path, "minimum above maximum: no integer fits");
    const std::string key =
        absl::StrCat("integer_", lo ? absl::StrCat(*lo) : "", "_", hi ? absl::StrCat(*hi) : "");
    auto [it, inserted] = length_rules_.try_emplace(key, 0);
    if (inserted) it->second = grammar_.AddRule(key, IntegerRange(lo, hi));
    return Expr::Rule(it->second);
  }

  // Numbers with bounds: only minimum 0 (the non-negative numbers) is supported.
  absl::StatusOr<Expr> VisitNumber(const Json& schema, const std::string& path) {
    if (!HasBounds(schema)) return NumberRule();
    const bool non_negative = schema.contains("minimum") && schema["minimum"].is_number() &&
                              schema["minimum"].get<double>() == 0 && !schema.contains("maximum") &&
                              !schema.contains("exclusiveMinimum") &&
                              !schema.contains("exclusiveMaximum");
    if (!non_negative) {
      return Refuse(path, "minimum/maximum on a number (supported: integers, and minimum 0)");
    }
    if (non_negative_rule_ < 0) {
      non_negative_rule_ = grammar_.AddRule("non_negative_number", NumberOf(UnsignedInteger()));
    }
    return Expr::Rule(non_negative_rule_);
  }

  absl::StatusOr<Expr> VisitAnyOf(const Json& list, const std::string& path) {
    if (!list.is_array() || list.empty()) return Refuse(path, "must be a non-empty array");
    std::vector<Expr> choices;
    for (size_t i = 0; i < list.size(); ++i) {
      absl::StatusOr<Expr> e = Visit(list[i], absl::StrCat(path, "/", i));
      if (!e.ok()) return e;
      choices.push_back(std::move(e).value());
    }
    return Expr::Choice(std::move(choices));
  }

  absl::StatusOr<Expr> VisitRef(const Json& ref, const std::string& path) {
    if (!ref.is_string()) return Refuse(path, "$ref must be a string");
    const std::string target = ref.get<std::string>();
    if (auto it = ref_rules_.find(target); it != ref_rules_.end()) return Expr::Rule(it->second);
    if (!target.starts_with("#")) return Refuse(path, absl::StrCat("remote $ref '", target, "'"));
    const Json* node = root_schema_;
    std::string_view rest = std::string_view(target).substr(1);
    while (!rest.empty()) {
      if (rest[0] != '/')
        return Refuse(path, absl::StrCat("$ref '", target, "' is not a JSON pointer"));
      rest.remove_prefix(1);
      const size_t slash = std::min(rest.find('/'), rest.size());
      std::string token(rest.substr(0, slash));
      rest.remove_prefix(slash);
      for (size_t p = 0; (p = token.find('~', p)) != std::string::npos; ++p) {
        if (p + 1 < token.size() && token[p + 1] == '1')
          token.replace(p, 2, "/");
        else if (p + 1 < token.size() && token[p + 1] == '0')
          token.replace(p, 2, "~");
      }
      if (node->is_object() && node->contains(token)) {
        node = &(*node)[token];
      } else if (node->is_array() && !token.empty() &&
                 token.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(token) < node->size()) {
        node = &(*node)[std::stoul(token)];
      } else {
        return Refuse(path, absl::StrCat("$ref '", target, "' points nowhere"));
      }
    }
    const int32_t rule = grammar_.AddRule(absl::StrCat("ref", target));
    ref_rules_[target] = rule;
    absl::StatusOr<Expr> body = Visit(*node, target);
    if (!body.ok()) return body;
    grammar_.SetBody(rule, std::move(body).value());
    return Expr::Rule(rule);
  }

  absl::StatusOr<Expr> VisitString(const Json& schema, const std::string& path) {
    const bool has_length = schema.contains("minLength") || schema.contains("maxLength");
    if (schema.contains("pattern") || schema.contains("format")) {
      if (has_length) return Refuse(path, "minLength/maxLength beside pattern or format");
      if (schema.contains("pattern") && schema.contains("format")) {
        return Refuse(path, "pattern beside format");
      }
      std::string regex;
      if (schema.contains("pattern")) {
        if (!schema["pattern"].is_string()) return Refuse(path, "pattern must be a string");
        regex = schema["pattern"].get<std::string>();
      } else {
        const std::string format =
            schema["format"].is_string() ? schema["format"].get<std::string>() : "";
        auto it = Formats().find(format);
        if (it == Formats().end())
          return Refuse(path, absl::StrCat("format '", format, "' is not supported"));
        regex = it->second;
      }
      absl::StatusOr<Expr> inner = RegexToExpr(regex);
      if (!inner.ok()) return Refuse(path, absl::StrCat("pattern: ", inner.status().message()));
      return Expr::Sequence({Expr::Byte('"'), std::move(inner).value(), Expr::Byte('"')});
    }
    if (!has_length) return StringRule();
    absl::StatusOr<int32_t> min = Count(schema, "minLength", 0, path);
    if (!min.ok()) return min.status();
    absl::StatusOr<int32_t> max = Count(schema, "maxLength", Expr::kUnbounded, path);
    if (!max.ok()) return max.status();
    if (*max != Expr::kUnbounded && *max < *min) return Refuse(path, "maxLength below minLength");
    const std::string key = absl::StrCat("string_", *min, "_", *max);
    auto [it, inserted] = length_rules_.try_emplace(key, 0);
    if (inserted) {
      it->second = grammar_.AddRule(
          key,
          Expr::Sequence({Expr::Byte('"'), Expr::Repeat(JsonChar(), *min, *max), Expr::Byte('"')}));
    }
    return Expr::Rule(it->second);
  }

  static absl::StatusOr<int32_t> Count(const Json& schema, const char* key, int32_t absent,
                                       const std::string& path) {
    if (!schema.contains(key)) return absent;
    const Json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 20)) {
      return Refuse(path, absl::StrCat(key, " must be a non-negative integer (at most 2^20)"));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }

  absl::StatusOr<Expr> VisitObject(const Json& schema, const std::string& path) {
    struct Property {
      Expr member;  // "key" ws ":" ws value
      bool required;
    };
    std::vector<Property> props;
    absl::flat_hash_set<std::string> required;
    if (schema.contains("required")) {
      if (!schema["required"].is_array()) return Refuse(path, "required must be an array");
      for (const Json& r : schema["required"]) {
        if (!r.is_string()) return Refuse(path, "required must hold strings");
        required.insert(r.get<std::string>());
      }
    }
    auto member = [&](const std::string& key, Expr value) {
      return Expr::Sequence(
          {Expr::Literal(Json(key).dump()), Ws(), Expr::Byte(':'), Ws(), std::move(value)});
    };
    absl::flat_hash_set<std::string> listed;
    if (schema.contains("properties")) {
      const Json& properties = schema["properties"];
      if (!properties.is_object()) return Refuse(path, "properties must be an object");
      for (const auto& [key, sub] : properties.items()) {
        absl::StatusOr<Expr> value = Visit(sub, absl::StrCat(path, "/properties/", key));
        if (!value.ok()) return value.status();
        props.push_back({member(key, std::move(value).value()), required.contains(key)});
        listed.insert(key);
      }
    }
    if (schema.contains("required")) {
      for (const Json& r : schema["required"]) {
        if (!listed.contains(r.get<std::string>())) {
          props.push_back({member(r.get<std::string>(), ValueRule()), true});
          listed.insert(r.get<std::string>());
        }
      }
    }
    std::optional<Expr> additional;
    const bool default_additional = !schema.contains("properties");
    const Json additional_schema = schema.value("additionalProperties", Json(default_additional));
    if (!additional_schema.is_boolean() || additional_schema.get<bool>()) {
      absl::StatusOr<Expr> value = additional_schema.is_boolean()
                                       ? absl::StatusOr<Expr>(ValueRule())
                                       : Visit(additional_schema, path + "/additionalProperties");
      if (!value.ok()) return value.status();
      additional =
          Expr::Sequence({StringRule(), Ws(), Expr::Byte(':'), Ws(), std::move(value).value()});
    }
    const int32_t rule = grammar_.AddRule(absl::StrCat("object", path));
    grammar_.SetBody(rule, Bracketed('{', Members(props, 0, true, additional), '}'));
    return Expr::Rule(rule);
  }

  // The members from props[i] on; `first`: no member was written yet (no comma before the
  // next). Optional members may each be left out, the required ones stay in order, and the
  // additional ones (if any) follow.
  template <typename Property>
  Expr Members(const std::vector<Property>& props, size_t i, bool first,
               const std::optional<Expr>& additional) const {
    if (!first) {
      std::vector<Expr> items;
      for (size_t j = i; j < props.size(); ++j) {
        Expr m = Expr::Sequence({Comma(), props[j].member});
        items.push_back(props[j].required ? std::move(m) : Expr::Optional(std::move(m)));
      }
      if (additional) items.push_back(Expr::Star(Expr::Sequence({Comma(), *additional})));
      return Expr::Sequence(std::move(items));
    }
    if (i == props.size())
      return additional ? Expr::Optional(SeparatedList(*additional)) : Expr::Empty();
    Expr with = Expr::Sequence({props[i].member, Members(props, i + 1, false, additional)});
    if (props[i].required) return with;
    return Expr::Choice({std::move(with), Members(props, i + 1, true, additional)});
  }

  absl::StatusOr<Expr> VisitArray(const Json& schema, const std::string& path) {
    std::optional<Expr> item;
    const bool has_prefix = schema.contains("prefixItems");
    if (schema.contains("items")) {
      const Json& items = schema["items"];
      if (!(items.is_boolean() && !items.get<bool>())) {
        absl::StatusOr<Expr> e = Visit(items, path + "/items");
        if (!e.ok()) return e;
        item = std::move(e).value();
      }
    } else if (!has_prefix) {
      item = ValueRule();
    }
    Expr body;
    if (has_prefix) {
      if (schema.contains("minItems") || schema.contains("maxItems")) {
        return Refuse(path, "minItems/maxItems beside prefixItems");
      }
      const Json& prefix = schema["prefixItems"];
      if (!prefix.is_array()) return Refuse(path, "prefixItems must be an array");
      std::vector<Expr> seq;
      for (size_t i = 0; i < prefix.size(); ++i) {
        absl::StatusOr<Expr> e = Visit(prefix[i], absl::StrCat(path, "/prefixItems/", i));
        if (!e.ok()) return e;
        if (i > 0) seq.push_back(Comma());
        seq.push_back(std::move(e).value());
      }
      if (item) {
        Expr rest = Expr::Star(Expr::Sequence({Comma(), *item}));
        if (prefix.empty()) rest = Expr::Optional(SeparatedList(*item));
        seq.push_back(std::move(rest));
      }
      body = Expr::Sequence(std::move(seq));
    } else {
      absl::StatusOr<int32_t> min = Count(schema, "minItems", 0, path);
      if (!min.ok()) return min.status();
      absl::StatusOr<int32_t> max = Count(schema, "maxItems", Expr::kUnbounded, path);
      if (!max.ok()) return max.status();
      if (*max != Expr::kUnbounded && *max < *min) return Refuse(path, "maxItems below minItems");
      if (!item || *max == 0) {
        if (*min > 0) return Refuse(path, "minItems above 0 with items false");
        body = Expr::Empty();
      } else {
        Expr list = Expr::Sequence(
            {*item, Expr::Repeat(Expr::Sequence({Comma(), *item}), std::max(*min - 1, 0),
                                 *max == Expr::kUnbounded ? Expr::kUnbounded : *max - 1)});
        body = *min == 0 ? Expr::Optional(std::move(list)) : std::move(list);
      }
    }
    const int32_t rule = grammar_.AddRule(absl::StrCat("array", path));
    grammar_.SetBody(rule, Bracketed('[', std::move(body), ']'));
    return Expr::Rule(rule);
  }

  JsonGrammarOptions options_;
  Grammar grammar_;
  const Json* root_schema_ = nullptr;
  absl::flat_hash_map<std::string, int32_t> ref_rules_;
  absl::flat_hash_map<std::string, int32_t> length_rules_;
  int32_t string_rule_ = -1;
  int32_t integer_rule_ = -1;
  int32_t number_rule_ = -1;
  int32_t value_rule_ = -1;
  int32_t object_rule_ = -1;
  int32_t array_rule_ = -1;
  int32_t non_negative_rule_ = -1;
};

}  // namespace

absl::StatusOr<Grammar> JsonSchemaToGrammar(std::string_view schema,
                                            const JsonGrammarOptions& options) {
  Json json = Json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("the JSON schema is not valid JSON");
  return JsonSchemaConverter(options).Convert(json);
}

Grammar JsonObjectGrammar(const JsonGrammarOptions& options) {
  return JsonSchemaConverter(options).AnyObject();
}

}  // namespace llm::structured
