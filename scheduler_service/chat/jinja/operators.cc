#include "scheduler_service/chat/jinja/operators.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "scheduler_service/chat/jinja/methods.h"
#include "scheduler_service/chat/jinja/string_format.h"

namespace llm::jinja {
namespace {

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

[[noreturn]] void UndefinedError(const Value& v) { throw CallError{v.undefined_name()}; }

std::vector<Value> Iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.list();
  if (v.is_dict()) {
    std::vector<Value> keys;
    for (const auto& kv : v.dict().items) keys.emplace_back(kv.first);
    return keys;
  }
  if (v.is_string()) {
    std::vector<Value> chars;
    for (std::string_view c : SplitUtf8Chars(v.as_string())) chars.emplace_back(std::string(c));
    return chars;
  }
  throw CallError{"'" + v.TypeName() + "' object is not iterable"};
}

bool Equal(const Value& a, const Value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    auto num = [](const Value& v) {
      return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
    };
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return num(a) == num(b);
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_list() && b.is_list()) {
    const ValueList &x = a.list(), &y = b.list();
    if (x.size() != y.size() || a.is_tuple() != b.is_tuple()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!Equal(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    if (a.dict().items.size() != b.dict().items.size()) return false;
    for (const auto& [k, v] : a.dict().items) {
      const Value* o = b.dict().Find(k);
      if (o == nullptr || !Equal(v, *o)) return false;
    }
    return true;
  }
  return false;
}

int Compare(const Value& a, const Value& b, const char* op) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    auto num = [](const Value& v) {
      return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
    };
    double x = num(a), y = num(b);
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_list() && b.is_list()) {
    const ValueList &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equal(x[i], y[i])) continue;
      return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  throw CallError{std::string("'") + op + "' not supported between instances of '" + a.TypeName() +
                  "' and '" + b.TypeName() + "'"};
}

bool Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      throw CallError{"'in <string>' requires string as left operand, not " + item.TypeName()};
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.list())
      if (Equal(v, item)) return true;
    return false;
  }
  if (container.is_dict()) return container.dict().Find(item) != nullptr;
  if (container.is_undefined()) return false;
  throw CallError{"argument of type '" + container.TypeName() + "' is not iterable"};
}

int64_t PyMod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value Arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) UndefinedError(a);
  if (b.is_undefined()) UndefinedError(b);
  auto type_error = [&]() -> CallError {
    return CallError{"unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" +
                     b.TypeName() + "'"};
  };
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  auto as_int = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
  auto as_num = [](const Value& v) {
    return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) return a.as_string() + b.as_string();
    if (a.is_list() && b.is_list()) {
      if (a.is_tuple() != b.is_tuple())
        throw CallError{std::string("can only concatenate ") + (a.is_tuple() ? "tuple" : "list") +
                        " (not \"" + b.TypeName() + "\") to " + (a.is_tuple() ? "tuple" : "list")};
      ValueList out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return a.is_tuple() ? Value::MakeTuple(std::move(out)) : Value(std::move(out));
    }
    if (a.is_string() || b.is_string()) {
      if (a.is_string())
        throw CallError{"can only concatenate str (not \"" + b.TypeName() + "\") to str"};
      throw type_error();
    }
  }
  if (op == "%" && a.is_string()) return PercentFormat(a.as_string(), b);
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_list()   ? &a
                       : b.is_string() || b.is_list() ? &b
                                                      : nullptr;
    const Value* n = seq == &a ? &b : &a;
    if (seq != nullptr && (n->is_int() || n->is_bool())) {
      int64_t times = std::max<int64_t>(0, as_int(*n));
      const int64_t unit = std::max<int64_t>(
          1, static_cast<int64_t>(seq->is_string() ? seq->as_string().size() : seq->list().size()));
      if (times > (int64_t{1} << 26) / unit) throw CallError{"repetition too large"};
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < times; ++i) out += seq->as_string();
        return out;
      }
      ValueList out;
      for (int64_t i = 0; i < times; ++i)
        out.insert(out.end(), seq->list().begin(), seq->list().end());
      return out;
    }
  }
  if (!numeric(a) || !numeric(b)) throw type_error();
  bool ints = !a.is_float() && !b.is_float();
  if (op == "/") {
    if (as_num(b) == 0) throw CallError{"division by zero"};
    return as_num(a) / as_num(b);
  }
  if (ints) {
    int64_t x = as_int(a), y = as_int(b);
    // Python's integers do not overflow; these are 64-bit, and say so rather than wrap.
    const CallError overflow{"integer overflow in '" + op + "' (integers are 64-bit here)"};
    int64_t r = 0;
    if (op == "+") {
      if (__builtin_add_overflow(x, y, &r)) throw overflow;
      return r;
    }
    if (op == "-") {
      if (__builtin_sub_overflow(x, y, &r)) throw overflow;
      return r;
    }
    if (op == "*") {
      if (__builtin_mul_overflow(x, y, &r)) throw overflow;
      return r;
    }
    if (op == "//" || op == "%") {
      if (y == 0) throw CallError{"integer division or modulo by zero"};
      if (x == std::numeric_limits<int64_t>::min() && y == -1) throw overflow;
      return op == "//" ? FloorDiv(x, y) : PyMod(x, y);
    }
    if (op == "**") {
      if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
      if (x == 0) return int64_t{y == 0 ? 1 : 0};
      if (x == 1) return int64_t{1};
      if (x == -1) return int64_t{y % 2 == 0 ? 1 : -1};
      r = 1;  // |x| >= 2: overflows within 64 factors
      for (int64_t i = 0; i < y; ++i) {
        if (__builtin_mul_overflow(r, x, &r)) throw overflow;
      }
      return r;
    }
  }
  double x = as_num(a), y = as_num(b);
  if (op == "+") return x + y;
  if (op == "-") return x - y;
  if (op == "*") return x * y;
  if (op == "//" || op == "%") {
    if (y == 0) throw CallError{"float division or modulo by zero"};
    double q = std::floor(x / y);
    return op == "//" ? q : x - q * y;
  }
  if (op == "**") return std::pow(x, y);
  throw type_error();
}

std::vector<int64_t> SliceIndices(int64_t n, const Value& start, const Value& stop,
                                  const Value& step) {
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int()) throw CallError{std::string("slice ") + what + " must be an integer or none"};
    return v.as_int();
  };
  int64_t st = opt(step, "step").value_or(1);
  if (st == 0) throw CallError{"slice step cannot be zero"};
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t b = clamp(opt(start, "start"), st > 0 ? 0 : n - 1);
  int64_t e = clamp(opt(stop, "stop"), st > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e;) {
    out.push_back(i);
    if (__builtin_add_overflow(i, st, &i)) break;
  }
  return out;
}

std::string ObjectTypeRepr(const Value& obj) {
  return obj.is_none() ? "None" : obj.TypeName() + " object";
}

Value MissingAttribute(const Value& obj, const std::string& name) {
  return Value::MakeUndefined("'" + ObjectTypeRepr(obj) + "' has no attribute '" + name + "'");
}

Value GetAttrValue(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) UndefinedError(obj);
  if (HasMethod(obj, name)) {
    return Value::MakeCallable(name, [obj, name](CallArgs& args) {
      bool found = false;
      return CallMethod(obj, name, args, &found);
    });
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().Find(name)) return *v;
  } else if (const Value* v = obj.TupleField(name)) {
    return *v;
  }
  return MissingAttribute(obj, name);
}

// jinja2's attribute lookup for filters: "a.b" walks dicts; integers index lists.
Value AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool numeric =
        !part.empty() && part.size() < 19 && std::all_of(part.begin(), part.end(), ::isdigit);
    if (cur.is_undefined()) return cur;
    cur = numeric && cur.is_list()
              ? GetItemValue(cur, Value(static_cast<int64_t>(std::stoll(part))))
              : GetItemValue(cur, Value(part));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

Value GetItemValue(const Value& obj, const Value& key) {
  if (obj.is_undefined()) UndefinedError(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().Find(key)) return *v;
    if (key.is_string()) return GetAttrValue(obj, key.as_string());
    return Value::MakeUndefined("'dict object' has no element " + key.Repr());
  }
  if (obj.is_list() || obj.is_string()) {
    if (!key.is_int()) {
      if (key.is_string()) return GetAttrValue(obj, key.as_string());
      throw CallError{obj.TypeName() + " indices must be integers, not " + key.TypeName()};
    }
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list().size());
      int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
      if (i < 0 || i >= n)
        return Value::MakeUndefined(absl::StrCat("'list object' has no element ", key.as_int()));
      return obj.list()[i];
    }
    std::vector<std::string_view> cs = SplitUtf8Chars(obj.as_string());
    int64_t n = static_cast<int64_t>(cs.size());
    int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
    if (i < 0 || i >= n)
      return Value::MakeUndefined(absl::StrCat("'str object' has no element ", key.as_int()));
    return std::string(cs[i]);
  }
  return Value::MakeUndefined("'" + obj.TypeName() + " object' has no element " + key.Repr());
}

}  // namespace llm::jinja
