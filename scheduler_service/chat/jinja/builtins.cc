#include "scheduler_service/chat/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "scheduler_service/chat/jinja/arg_reader.h"
#include "scheduler_service/chat/jinja/collection_filters.h"
#include "scheduler_service/chat/jinja/methods.h"
#include "scheduler_service/chat/jinja/operators.h"
#include "scheduler_service/chat/jinja/python_string.h"
#include "scheduler_service/chat/jinja/string_format.h"
#include "scheduler_service/chat/jinja/unicode_case.h"

namespace llm::jinja {
namespace {

int64_t Length(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return static_cast<int64_t>(SplitUtf8Chars(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict().items.size());
  throw CallError{"object of type '" + v.TypeName() + "' has no len()"};
}

}  // namespace

Value ApplyFilter(const std::string& name, const Value& in, CallArgs& args, Ctx& ctx) {
  ArgReader r(args, name);
  if (name == "trim") {
    Value chars = r.Get(0, "chars");
    std::string c = chars.is_string() ? chars.as_string() : "";
    return PyStrip(in.Str(), chars.is_string() ? &c : nullptr, true, true);
  }
  if (name == "length" || name == "count") return Length(in);
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None,
    // sort_keys=False), which is json.dumps with those arguments.
    JsonOptions o;
    o.ensure_ascii = r.Get(0, "ensure_ascii").Truthy();
    const Value indent = r.Get(1, "indent");
    if (indent.is_int() || indent.is_bool()) {
      o.indented = true;
      const int64_t n = indent.is_bool() ? indent.as_bool() : indent.as_int();
      o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 64)), ' ');
    } else if (indent.is_string()) {
      o.indented = true;
      o.indent = indent.as_string();
    } else if (!indent.is_undefined() && !indent.is_none()) {
      throw CallError{"tojson(): indent must be an integer or a string, not " + indent.TypeName()};
    }
    if (o.indented) o.item_separator = ",";
    const Value separators = r.Get(2, "separators");
    if (separators.is_list()) {
      const ValueList& pair = separators.list();
      if (pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
        throw CallError{"tojson(): separators must be a pair of strings"};
      o.item_separator = pair[0].as_string();
      o.key_separator = pair[1].as_string();
    } else if (!separators.is_undefined() && !separators.is_none()) {
      throw CallError{"tojson(): separators must be a pair of strings"};
    }
    o.sort_keys = r.Get(3, "sort_keys").Truthy();
    return ToJson(in, o);
  }
  if (name == "upper") return PyUpper(in.Str());
  if (name == "lower") return PyLower(in.Str());
  if (name == "title") return JinjaTitle(in.Str());
  if (name == "capitalize") return PyCapitalize(in.Str());
  if (name == "string") return in.Str();
  if (name == "attr") {
    // jinja2's attr reads Python attributes only: a dict's entries are not among them.
    const std::string attr = r.Required(0, "name").Str();
    if (in.is_undefined()) return in;
    if (HasMethod(in, attr)) return GetAttrValue(in, attr);
    if (const Value* field = in.TupleField(attr)) return *field;
    return MissingAttribute(in, attr);
  }
  if (name == "format") {
    if (!args.positional.empty() && !args.keyword.empty())
      throw CallError{"can't handle positional and keyword arguments at the same time"};
    if (args.keyword.empty()) return PercentFormat(in.Str(), Value::MakeTuple(args.positional));
    ValueDict mapping;
    for (const auto& [k, v] : args.keyword) mapping.Set(k, v);
    return PercentFormat(in.Str(), Value(std::move(mapping)));
  }
  if (name == "center") {
    CallArgs a;
    a.positional.push_back(Value(r.Int(0, "width", 80)));
    bool found;
    return CallMethod(Value(in.Str()), "center", a, &found);
  }
  if (name == "truncate") {
    // jinja2's: strings within length + leeway stay; else cut to length - len(end) (at a word
    // boundary unless killwords) and `end` appended.
    const std::string text = in.Str();
    const std::vector<std::string_view> cs = SplitUtf8Chars(text);
    const int64_t length = r.Int(0, "length", 255);
    const bool killwords = r.Get(1, "killwords").Truthy();
    const std::string end = r.Get(2, "end", Value("...")).Str();
    const int64_t leeway = r.Int(3, "leeway", 5);
    const int64_t end_len = static_cast<int64_t>(SplitUtf8Chars(end).size());
    if (length < end_len)
      throw CallError{absl::StrCat("expected length >= ", end_len, ", got ", length)};
    if (leeway < 0) throw CallError{absl::StrCat("expected leeway >= 0, got ", leeway)};
    if (static_cast<int64_t>(cs.size()) <= length + leeway) return text;
    std::string head;
    for (int64_t i = 0; i < length - end_len; ++i) head += cs[i];
    if (!killwords) {
      const size_t space = head.rfind(' ');
      if (space != std::string::npos) head.erase(space);
    }
    return head + end;
  }
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return in;
    std::string out;
    for (char c : in.Str()) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out.push_back(c);
      }
    }
    return out;
  }
  if (name == "default" || name == "d") {
    Value dflt = r.Get(0, "default_value", Value(""));
    bool boolean = r.Get(1, "boolean").Truthy();
    if (in.is_undefined() || (boolean && !in.Truthy())) return dflt;
    return in;
  }
  if (name == "first" || name == "last") {
    std::vector<Value> items = Iterate(in);
    if (items.empty()) return Value::MakeUndefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    std::string sep = r.Get(0, "d", Value("")).Str();
    Value attr = r.Get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& v : Iterate(in)) {
      if (!first) out += sep;
      first = false;
      out += attr.is_string() ? AttrPath(v, attr.as_string()).Str() : v.Str();
    }
    return out;
  }
  if (name == "replace") {
    std::string s = in.Str();
    std::string from = r.Required(0, "old").Str();
    std::string to = r.Required(1, "new").Str();
    Value count = r.Get(2, "count");
    return PyReplace(s, from, to, count.is_int() ? count.as_int() : -1);
  }
  if (name == "list") return ValueList(Iterate(in));
  if (name == "items") {
    if (in.is_undefined()) return ValueList();
    if (!in.is_dict()) throw CallError{"items filter expects a dict, got " + in.TypeName()};
    ValueList out;
    for (const auto& [k, v] : in.dict().items) out.push_back(Value::MakeTuple(ValueList{k, v}));
    return out;
  }
  if (name == "int") {
    Value dflt = r.Get(0, "default", Value(int64_t{0}));
    if (in.is_int()) return in;
    if (in.is_bool()) return int64_t{in.as_bool()};
    // Out of int64's range (or not finite) takes the default, as jinja2's int does on errors.
    auto to_int = [&dflt](double d) -> Value {
      if (!(d > -9.2e18 && d < 9.2e18)) return dflt;
      return static_cast<int64_t>(d);
    };
    if (in.is_float()) return to_int(in.as_float());
    if (in.is_string()) {
      std::string s = PyStrip(in.as_string(), nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == '\0' && errno == 0) return static_cast<int64_t>(v);
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0') return to_int(d);
    }
    return dflt;
  }
  if (name == "float") {
    if (in.is_number()) return in.as_number();
    if (in.is_string()) {
      char* end = nullptr;
      double d = std::strtod(in.as_string().c_str(), &end);
      if (!in.as_string().empty() && *end == '\0') return d;
    }
    return r.Get(0, "default", Value(0.0));
  }
  if (name == "abs") {
    if (in.is_int()) {
      if (in.as_int() == std::numeric_limits<int64_t>::min())
        throw CallError{"integer overflow in abs (integers are 64-bit here)"};
      return in.as_int() < 0 ? -in.as_int() : in.as_int();
    }
    if (in.is_float()) return std::fabs(in.as_float());
    throw CallError{"bad operand type for abs(): '" + in.TypeName() + "'"};
  }
  if (name == "reverse") {
    if (in.is_string()) {
      std::vector<std::string_view> cs = SplitUtf8Chars(in.as_string());
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return out;
    }
    std::vector<Value> items = Iterate(in);
    std::reverse(items.begin(), items.end());
    return ValueList(std::move(items));
  }
  if (name == "indent") {
    // jinja2's indent(width=4, first=False, blank=False): a newline appended, the lines split
    // as str.splitlines does, every line after the first indented unless blank (and `blank`
    // not given), the first too when `first`.
    const Value width = r.Get(0, "width", Value(int64_t{4}));
    std::string pad;
    if (width.is_string()) {
      pad = width.as_string();
    } else if (width.is_int() || width.is_bool()) {
      const int64_t n = width.is_bool() ? width.as_bool() : width.as_int();
      pad = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 256)), ' ');
    } else {
      throw CallError{"indent(): width must be an integer or a string, not " + width.TypeName()};
    }
    const bool first = r.Get(1, "first").Truthy();
    const bool blank = r.Get(2, "blank").Truthy();
    const std::vector<std::string> lines = PySplitlines(in.Str() + "\n");
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) {
        out += "\n";
        if (blank || !lines[i].empty()) out += pad;
      }
      out += lines[i];
    }
    return first ? pad + out : out;
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    bool by_attr = name == "selectattr" || name == "rejectattr";
    bool keep_if = name == "selectattr" || name == "select";
    size_t k = 0;
    std::string attr;
    if (by_attr) {
      if (args.positional.empty()) throw CallError{name + "() missing the attribute name"};
      attr = args.positional[0].Str();
      k = 1;
    }
    std::string test;
    CallArgs test_args;
    if (k < args.positional.size()) {
      test = args.positional[k].Str();
      test_args.positional.assign(args.positional.begin() + k + 1, args.positional.end());
    }
    ValueList out;
    for (const Value& item : Iterate(in)) {
      Value subject = by_attr ? AttrPath(item, attr) : item;
      bool pass = test.empty() ? subject.Truthy() : ApplyTest(test, subject, test_args, ctx);
      if (pass == keep_if) out.push_back(item);
    }
    return out;
  }
  if (name == "map") {
    Value attr = r.Get(99, "attribute");
    ValueList out;
    if (attr.is_string()) {
      Value dflt = r.Get(99, "default");
      for (const Value& item : Iterate(in)) {
        Value v = AttrPath(item, attr.as_string());
        out.push_back(v.is_undefined() && !dflt.is_undefined() ? dflt : v);
      }
      return out;
    }
    if (args.positional.empty()) throw CallError{"map() needs a filter name or attribute="};
    std::string filter = args.positional[0].Str();
    CallArgs fargs;
    fargs.positional.assign(args.positional.begin() + 1, args.positional.end());
    fargs.keyword = args.keyword;
    for (const Value& item : Iterate(in)) {
      CallArgs a = fargs;
      out.push_back(ApplyFilter(filter, item, a, ctx));
    }
    return out;
  }
  if (name == "dictsort") {
    if (!in.is_dict()) throw CallError{"dictsort expects a dict, got " + in.TypeName()};
    // jinja2's dictsort(case_sensitive=False, by="key", reverse=False).
    const bool case_sensitive = r.Get(0, "case_sensitive").Truthy();
    const Value by = r.Get(1, "by", Value("key"));
    if (!by.is_string() || (by.as_string() != "key" && by.as_string() != "value"))
      throw CallError{"You can only sort by either \"key\" or \"value\""};
    const bool by_value = by.as_string() == "value";
    const bool reverse = r.Get(2, "reverse").Truthy();
    auto sort_key = [&](const std::pair<Value, Value>& item) {
      const Value& v = by_value ? item.second : item.first;
      return !case_sensitive && v.is_string() ? Value(PyLower(v.as_string())) : v;
    };
    std::vector<std::pair<Value, Value>> items = in.dict().items;
    std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
      return reverse ? Compare(sort_key(b), sort_key(a), "<") < 0
                     : Compare(sort_key(a), sort_key(b), "<") < 0;
    });
    ValueList out;
    for (auto& [k, v] : items) out.push_back(Value::MakeTuple(ValueList{k, v}));
    return out;
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char c : in.Str()) {
      bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (c & 0x80);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return n;
  }
  Value out;
  if (ApplyCollectionFilter(name, in, args, &out)) return out;
  throw CallError{"no filter named '" + name + "'"};
}

bool ApplyTest(const std::string& name, const Value& v, CallArgs& args, Ctx&) {
  ArgReader r(args, name);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.is_callable();
  if (name == "lower") return PyIsLower(v.Str());
  if (name == "upper") return PyIsUpper(v.Str());
  if (name == "even" || name == "odd") {
    if (!v.is_int()) throw CallError{"test '" + name + "' expects an integer, got " + v.TypeName()};
    return (PyMod(v.as_int(), 2) == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    Value n = r.Required(0, "num");
    if (!v.is_int() || !n.is_int() || n.as_int() == 0)
      throw CallError{"divisibleby expects non-zero integers"};
    return PyMod(v.as_int(), n.as_int()) == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, r.Required(0, "other"));
  if (name == "ne" || name == "!=") return !Equal(v, r.Required(0, "other"));
  if (name == "lt" || name == "lessthan" || name == "<")
    return Compare(v, r.Required(0, "other"), "<") < 0;
  if (name == "le" || name == "<=") return Compare(v, r.Required(0, "other"), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">")
    return Compare(v, r.Required(0, "other"), ">") > 0;
  if (name == "ge" || name == ">=") return Compare(v, r.Required(0, "other"), ">=") >= 0;
  if (name == "in") return Contains(r.Required(0, "seq"), v);
  if (name == "sameas") {
    Value o = r.Required(0, "other");
    if (v.is_none() || v.is_bool() || o.is_none() || o.is_bool())
      return v.TypeName() == o.TypeName() && Equal(v, o);
    return false;
  }
  throw CallError{"no test named '" + name + "'"};
}

Value Global(const std::string& name) {
  static const auto* globals = [] {
    auto* g = new absl::flat_hash_map<std::string, Value>();
    (*g)["raise_exception"] = Value::MakeCallable("raise_exception", [](CallArgs& args) -> Value {
      ArgReader r(args, "raise_exception");
      throw CallError{r.Required(0, "message").Str()};
    });
    (*g)["strftime_now"] = Value::MakeCallable("strftime_now", [](CallArgs& args) -> Value {
      ArgReader r(args, "strftime_now");
      std::string fmt = r.String(0, "format");
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
      return std::string(buf, n);
    });
    (*g)["namespace"] = Value::MakeCallable("namespace", [](CallArgs& args) -> Value {
      ValueDict d;
      d.is_namespace = true;
      for (const Value& p : args.positional) {
        if (!p.is_dict()) throw CallError{"namespace() takes dicts and keyword arguments"};
        for (const auto& [k, v] : p.dict().items) d.Set(k, v);
      }
      for (auto& [k, v] : args.keyword) d.Set(k, v);
      return Value(std::move(d));
    });
    (*g)["dict"] = Value::MakeCallable("dict", [](CallArgs& args) -> Value {
      ValueDict d;
      for (const Value& p : args.positional) {
        if (!p.is_dict()) throw CallError{"dict() takes dicts and keyword arguments"};
        for (const auto& [k, v] : p.dict().items) d.Set(k, v);
      }
      for (auto& [k, v] : args.keyword) d.Set(k, v);
      return Value(std::move(d));
    });
    (*g)["range"] = Value::MakeCallable("range", [](CallArgs& args) -> Value {
      std::vector<int64_t> a;
      for (const Value& v : args.positional) {
        if (!v.is_int()) throw CallError{"range() takes integers, got " + v.TypeName()};
        a.push_back(v.as_int());
      }
      if (a.empty() || a.size() > 3) throw CallError{"range() takes 1 to 3 integers"};
      int64_t start = a.size() == 1 ? 0 : a[0], stop = a.size() == 1 ? a[0] : a[1];
      int64_t step = a.size() == 3 ? a[2] : 1;
      if (step == 0) throw CallError{"range() arg 3 must not be zero"};
      ValueList out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        if (out.size() >= (1u << 20)) throw CallError{"range() too large"};
        out.emplace_back(i);
        if (__builtin_add_overflow(i, step, &i)) break;
      }
      return out;
    });
    return g;
  }();
  auto it = globals->find(name);
  return it == globals->end() ? Value() : it->second;
}

}  // namespace llm::jinja
