// The values templates compute with, and with which a caller builds the context of a render
// (jinja.h says how they behave).
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_VALUE_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "nlohmann/json.hpp"

namespace llm::jinja {

class Value;
using ValueList = std::vector<Value>;

// An insertion-ordered dict, as Python's. Keys are strings (all of a JSON object's), or the
// other values Python can hash: ints, floats, bools, none and tuples, where 1, 1.0 and true
// are one key.
struct ValueDict {
  std::vector<std::pair<Value, Value>> items;
  bool is_namespace = false;  // made by namespace(): the one kind `set x.attr = ...` accepts

  const Value* Find(std::string_view key) const;
  const Value* Find(const char* key) const { return Find(std::string_view(key)); }
  const Value* Find(const std::string& key) const { return Find(std::string_view(key)); }
  const Value* Find(const Value& key) const;
  void Set(const char* key, Value value);
  void Set(std::string key, Value value);
  void Set(Value key, Value value);
};

struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

class Value {
 public:
  struct Undefined {
    std::string name;  // for error messages
  };
  struct None {};
  struct Callable {
    std::string name;
    Function fn;
  };
  // A named tuple's type (jinja2's groupby yields (grouper, list) as one): its name and the
  // names of its fields, which are attributes of its values.
  struct TupleType {
    std::string name;
    std::vector<std::string> fields;
  };
  using ListPtr = std::shared_ptr<ValueList>;
  using DictPtr = std::shared_ptr<ValueDict>;
  using CallablePtr = std::shared_ptr<const Callable>;

  Value() : v_(Undefined{}) {}
  static Value MakeUndefined(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value MakeNone() { return Value(None{}); }
  Value(bool b) : v_(b) {}                                                     // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}                                // NOLINT
  Value(int64_t i) : v_(i) {}                                                  // NOLINT
  Value(double d) : v_(d) {}                                                   // NOLINT
  Value(std::string s) : v_(std::move(s)) {}                                   // NOLINT
  Value(const char* s) : v_(std::string(s)) {}                                 // NOLINT
  Value(ValueList list) : v_(std::make_shared<ValueList>(std::move(list))) {}  // NOLINT
  Value(ValueDict dict) : v_(std::make_shared<ValueDict>(std::move(dict))) {}  // NOLINT
  static Value MakeCallable(std::string name, Function fn);
  // A tuple: a list (is_list() is true, so everything that reads a list reads it) that prints
  // as (..), is named "tuple" and never equals a list, as in Python.
  static Value MakeTuple(ValueList items, std::shared_ptr<const TupleType> type = nullptr);
  // JSON null -> none, objects -> dicts (key order kept), numbers -> int or float.
  static Value FromJson(const nlohmann::ordered_json& json);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<ListPtr>(v_); }
  bool is_dict() const { return std::holds_alternative<DictPtr>(v_); }
  bool is_callable() const { return std::holds_alternative<CallablePtr>(v_); }
  bool is_tuple() const { return tuple_; }
  // The field `name` of a named tuple; null for anything else.
  const Value* TupleField(std::string_view name) const;

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  double as_number() const { return is_int() ? static_cast<double>(as_int()) : as_float(); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  ValueList& list() const { return *std::get<ListPtr>(v_); }
  ValueDict& dict() const { return *std::get<DictPtr>(v_); }
  const Callable& callable() const { return *std::get<CallablePtr>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }

  // Python truthiness (undefined is false).
  bool Truthy() const;
  // Python's str(): None -> "None", True -> "True", 1.0 -> "1.0", lists and dicts as repr;
  // undefined -> "".
  std::string Str() const;
  // Python's repr() (strings quoted).
  std::string Repr() const;
  // Whether Python could make this a dict key (strings, numbers, bools, none, tuples of them).
  bool Hashable() const;
  // Equality of dict keys: Python's ==, where 1, 1.0 and true are equal.
  bool KeyEquals(const Value& other) const;
  // The type's name as Python says it ("str", "int", "list", "dict", "NoneType", ...).
  std::string TypeName() const;

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(None n) : v_(n) {}
  explicit Value(CallablePtr c) : v_(std::move(c)) {}

  std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, CallablePtr>
      v_;
  bool tuple_ = false;
  std::shared_ptr<const TupleType> tuple_type_;
};

// Arguments of a call from a template: positional, then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Thrown by a Function to fail the render with its message (caught inside Render; never
// escapes this library).
struct CallError {
  std::string message;
};

// The arguments of Python's json.dumps that transformers' tojson filter passes on.
struct JsonOptions {
  bool ensure_ascii = false;  // non-ASCII characters as \uXXXX escapes
  bool indented = false;      // one item a line, each level indented by `indent`
  std::string indent;
  std::string item_separator = ", ";  // json.dumps' defaults: "," when indented
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// Python's json.dumps(value, ...). Undefined and callables are errors (CallError).
std::string ToJson(const Value& value, const JsonOptions& options);
// json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys) with its default
// separators; indent < 0 is None (one line).
std::string ToJson(const Value& value, int indent, bool sort_keys);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_VALUE_H_
