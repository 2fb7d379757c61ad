#include "scheduler_service/chat/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/utf8.h"
#include "scheduler_service/chat/jinja/python_string.h"

namespace llm::jinja {
namespace {

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default: {
        char b[16];
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          *out += b;
        } else if (ensure_ascii && c >= 0x80) {
          // One UTF-8 character as its code point, beyond the BMP as a surrogate pair.
          size_t len = 1;
          while (i + len < s.size() && (static_cast<unsigned char>(s[i + len]) & 0xc0) == 0x80)
            ++len;
          uint32_t cp = Utf8CharCodePoint(std::string_view(s).substr(i, len));
          i += len - 1;
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                          0xdc00 + (cp & 0x3ff));
          } else {
            std::snprintf(b, sizeof(b), "\\u%04x", cp);
          }
          *out += b;
        } else {
          out->push_back(static_cast<char>(c));
        }
      }
    }
  }
  out->push_back('"');
}

// json.dumps turns a key that is not a string into one: 1 -> "1", true -> "true".
std::string JsonKey(const Value& k) {
  if (k.is_string()) return k.as_string();
  if (k.is_bool()) return k.as_bool() ? "true" : "false";
  if (k.is_none()) return "null";
  if (k.is_int()) return std::to_string(k.as_int());
  if (k.is_float()) {
    const double d = k.as_float();
    return std::isnan(d)   ? "NaN"
           : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                           : PyFloatRepr(d);
  }
  throw CallError{"keys must be str, int, float, bool or None, not " + k.TypeName()};
}

void ToJsonImpl(const Value& v, const JsonOptions& o, int level, std::string* out) {
  auto newline = [&](int lvl) {
    out->push_back('\n');
    for (int i = 0; i < lvl; ++i) *out += o.indent;
  };
  if (v.is_none()) {
    *out += "null";
  } else if (v.is_bool()) {
    *out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    *out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    double d = v.as_float();
    *out += std::isnan(d)   ? "NaN"
            : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                            : PyFloatRepr(d);
  } else if (v.is_string()) {
    JsonString(v.as_string(), o.ensure_ascii, out);
  } else if (v.is_list()) {
    const ValueList& list = v.list();
    if (list.empty()) {
      *out += "[]";
      return;
    }
    out->push_back('[');
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) *out += o.item_separator;
      if (o.indented) newline(level + 1);
      ToJsonImpl(list[i], o, level + 1, out);
    }
    if (o.indented) newline(level);
    out->push_back(']');
  } else if (v.is_dict()) {
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& kv : v.dict().items) items.push_back(&kv);
    if (items.empty()) {
      *out += "{}";
      return;
    }
    if (o.sort_keys) {
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) {
        const Value &x = a->first, &y = b->first;
        if (x.is_string() && y.is_string()) return x.as_string() < y.as_string();
        if ((x.is_number() || x.is_bool()) && (y.is_number() || y.is_bool())) {
          auto num = [](const Value& v) {
            return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
          };
          return num(x) < num(y);
        }
        throw CallError{"'<' not supported between instances of '" + y.TypeName() + "' and '" +
                        x.TypeName() + "'"};
      });
    }
    out->push_back('{');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) *out += o.item_separator;
      if (o.indented) newline(level + 1);
      JsonString(JsonKey(items[i]->first), o.ensure_ascii, out);
      *out += o.key_separator;
      ToJsonImpl(items[i]->second, o, level + 1, out);
    }
    if (o.indented) newline(level);
    out->push_back('}');
  } else if (v.is_undefined()) {
    throw CallError{"Object of type Undefined is not JSON serializable"};
  } else {
    throw CallError{"Object of type function is not JSON serializable"};
  }
}

}  // namespace

const Value* ValueDict::Find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

const Value* ValueDict::Find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (k.KeyEquals(key)) return &v;
  return nullptr;
}

void ValueDict::Set(const char* key, Value value) { Set(Value(key), std::move(value)); }

void ValueDict::Set(std::string key, Value value) { Set(Value(std::move(key)), std::move(value)); }

void ValueDict::Set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (k.KeyEquals(key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

bool Value::Hashable() const {
  if (is_list()) {
    if (!is_tuple()) return false;
    for (const Value& v : list())
      if (!v.Hashable()) return false;
    return true;
  }
  return is_string() || is_number() || is_bool() || is_none();
}

bool Value::KeyEquals(const Value& other) const {
  if (is_string() || other.is_string())
    return is_string() && other.is_string() && as_string() == other.as_string();
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (numeric(*this) && numeric(other)) {
    if (is_int() && other.is_int()) return as_int() == other.as_int();
    auto num = [](const Value& v) {
      return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
    };
    return num(*this) == num(other);
  }
  if (is_none() || other.is_none()) return is_none() && other.is_none();
  if (is_list() && other.is_list()) {
    if (list().size() != other.list().size()) return false;
    for (size_t i = 0; i < list().size(); ++i)
      if (!list()[i].KeyEquals(other.list()[i])) return false;
    return true;
  }
  return false;
}

Value Value::MakeCallable(std::string name, Function fn) {
  return Value(std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)}));
}

Value Value::MakeTuple(ValueList items, std::shared_ptr<const TupleType> type) {
  Value v(std::move(items));
  v.tuple_ = true;
  v.tuple_type_ = std::move(type);
  return v;
}

const Value* Value::TupleField(std::string_view name) const {
  if (!tuple_type_) return nullptr;
  const std::vector<std::string>& fields = tuple_type_->fields;
  for (size_t i = 0; i < fields.size() && i < list().size(); ++i)
    if (fields[i] == name) return &list()[i];
  return nullptr;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return MakeNone();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList list;
      for (const auto& item : json) list.push_back(FromJson(item));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict dict;
      for (const auto& [k, v] : json.items()) dict.items.emplace_back(Value(k), FromJson(v));
      return Value(std::move(dict));
    }
    default:
      return MakeNone();
  }
}

bool Value::Truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_float() != 0;
  if (is_string()) return !as_string().empty();
  if (is_list()) return !list().empty();
  if (is_dict()) return !dict().items.empty();
  return true;
}

std::string Value::Str() const {
  if (is_undefined()) return "";
  if (is_string()) return as_string();
  return Repr();
}

std::string Value::Repr() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return PyFloatRepr(as_float());
  if (is_string()) return PyStrRepr(as_string());
  if (is_list()) {
    // A named tuple prints as a tuple, as jinja2's _GroupTuple does.
    std::string out = tuple_ ? "(" : "[";
    for (size_t i = 0; i < list().size(); ++i) {
      if (i > 0) out += ", ";
      out += list()[i].Repr();
    }
    if (tuple_ && list().size() == 1) out += ",";
    return out + (tuple_ ? ")" : "]");
  }
  if (is_dict()) {
    if (dict().is_namespace) return "<Namespace>";
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : dict().items) {
      if (!first) out += ", ";
      first = false;
      out += k.Repr() + ": " + v.Repr();
    }
    return out + "}";
  }
  return "<function " + callable().name + ">";
}

std::string Value::TypeName() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return tuple_type_ ? tuple_type_->name : tuple_ ? "tuple" : "list";
  if (is_dict()) return dict().is_namespace ? "Namespace" : "dict";
  return "function";
}

std::string ToJson(const Value& value, const JsonOptions& options) {
  std::string out;
  ToJsonImpl(value, options, 0, &out);
  return out;
}

std::string ToJson(const Value& value, int indent, bool sort_keys) {
  JsonOptions options;
  options.sort_keys = sort_keys;
  if (indent >= 0) {
    options.indented = true;
    options.indent = std::string(indent, ' ');
    options.item_separator = ",";
  }
  return ToJson(value, options);
}

}  // namespace llm::jinja
