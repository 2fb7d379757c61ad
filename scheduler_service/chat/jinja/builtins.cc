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
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "scheduler_service/chat/jinja/operators.h"
#include "scheduler_service/chat/jinja/python_string.h"
#include "scheduler_service/tokenizer/utf8.h"

namespace llm::jinja {
namespace {

// Arguments by position or name, as a Python function with parameters `names` takes them.
class ArgReader {
 public:
  ArgReader(CallArgs& args, std::string fn) : args_(args), fn_(std::move(fn)) {}
  // The argument at `index` or named `name`; `fallback` when absent.
  Value Get(size_t index, const std::string& name, Value fallback = Value()) {
    for (auto& [k, v] : args_.keyword)
      if (k == name) return v;
    if (index < args_.positional.size()) return args_.positional[index];
    return fallback;
  }
  Value Required(size_t index, const std::string& name) {
    Value v = Get(index, name);
    if (v.is_undefined() && index >= args_.positional.size())
      throw CallError{fn_ + "() missing required argument '" + name + "'"};
    return v;
  }
  std::string String(size_t index, const std::string& name) {
    Value v = Required(index, name);
    if (!v.is_string())
      throw CallError{fn_ + "(): argument '" + name + "' must be a string, got " + v.TypeName()};
    return v.as_string();
  }

 private:
  CallArgs& args_;
  std::string fn_;
};

int64_t Length(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return static_cast<int64_t>(SplitUtf8Chars(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict().items.size());
  throw CallError{"object of type '" + v.TypeName() + "' has no len()"};
}

// jinja2's attribute lookup for filters: "a.b" walks dicts; integers index lists.
Value AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (cur.is_undefined()) return cur;
    cur = numeric && cur.is_list()
              ? GetItemValue(cur, Value(static_cast<int64_t>(std::stoll(part))))
              : GetItemValue(cur, Value(part));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

// jinja2's `title` filter: words begin after runs of [-\s({\[<].
std::string JinjaTitle(const std::string& s) {
  std::string out;
  bool at_start = true;
  for (char c : s) {
    bool sep = c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
               c == '\v' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out.push_back(c);
      at_start = true;
    } else if (at_start) {
      out += AsciiUpper(std::string(1, c));
      at_start = false;
    } else {
      out += AsciiLower(std::string(1, c));
    }
  }
  return out;
}

Value SplitString(const std::string& s, const Value& sep_v, int64_t maxsplit) {
  ValueList out;
  if (sep_v.is_undefined() || sep_v.is_none()) {
    // Runs of whitespace; no empty strings.
    std::vector<std::string_view> cs = SplitUtf8Chars(s);
    size_t i = 0;
    int64_t splits = 0;
    while (i < cs.size()) {
      while (i < cs.size() && IsPySpace(Utf8CharCodePoint(cs[i]))) ++i;
      if (i >= cs.size()) break;
      std::string word;
      if (maxsplit >= 0 && splits >= maxsplit) {
        for (; i < cs.size(); ++i) word += cs[i];
        word = PyStrip(word, nullptr, false, true);
        out.emplace_back(word);
        break;
      }
      while (i < cs.size() && !IsPySpace(Utf8CharCodePoint(cs[i]))) word += cs[i++];
      out.emplace_back(word);
      ++splits;
    }
    return out;
  }
  if (!sep_v.is_string()) throw CallError{"split(): separator must be a string"};
  const std::string& sep = sep_v.as_string();
  if (sep.empty()) throw CallError{"empty separator"};
  size_t pos = 0;
  int64_t splits = 0;
  while (maxsplit < 0 || splits < maxsplit) {
    size_t hit = s.find(sep, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
    ++splits;
  }
  out.emplace_back(s.substr(pos));
  return out;
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
    Value indent = r.Get(0, "indent");
    int ind = -1;
    if (indent.is_int()) ind = static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64));
    return ToJson(in, ind, r.Get(3, "sort_keys").Truthy());
  }
  if (name == "upper") return AsciiUpper(in.Str());
  if (name == "lower") return AsciiLower(in.Str());
  if (name == "title") return JinjaTitle(in.Str());
  if (name == "capitalize") return PyCapitalize(in.Str());
  if (name == "string") return in.Str();
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
    for (const auto& [k, v] : in.dict().items)
      out.push_back(Value::MakeTuple(ValueList{Value(k), v}));
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
  if (name == "unique") {
    ValueList out;
    for (const Value& v : Iterate(in)) {
      bool seen = false;
      for (const Value& o : out) seen |= Equal(o, v);
      if (!seen) out.push_back(v);
    }
    return out;
  }
  if (name == "indent") {
    int64_t width = r.Get(0, "width", Value(int64_t{4})).is_int()
                        ? r.Get(0, "width", Value(int64_t{4})).as_int()
                        : 4;
    bool first = r.Get(1, "first").Truthy();
    bool blank = r.Get(2, "blank").Truthy();
    std::string pad(static_cast<size_t>(std::clamp<int64_t>(width, 0, 256)), ' ');
    std::string s = in.Str();
    std::string out;
    size_t pos = 0;
    bool line0 = true;
    while (pos <= s.size()) {
      size_t nl = s.find('\n', pos);
      std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if ((!line0 || first) && (blank || !line.empty())) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += "\n";
      pos = nl + 1;
      line0 = false;
    }
    return out;
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
    std::vector<std::pair<std::string, Value>> items = in.dict().items;
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      return AsciiLower(a.first) < AsciiLower(b.first);
    });
    ValueList out;
    for (auto& [k, v] : items) out.push_back(Value::MakeTuple(ValueList{Value(k), v}));
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
  if (name == "lower") return v.is_string() && AsciiLower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && AsciiUpper(v.as_string()) == v.as_string();
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

bool HasMethod(const Value& obj, const std::string& name) {
  static const auto* str_methods = new absl::flat_hash_set<std::string>{
      "strip", "lstrip", "rstrip",  "startswith", "endswith", "split",   "rsplit",
      "upper", "lower",  "title",   "capitalize", "replace",  "find",    "count",
      "index", "join",   "isdigit", "isspace",    "isalpha",  "isalnum", "splitlines"};
  static const auto* dict_methods =
      new absl::flat_hash_set<std::string>{"items", "keys", "values", "get"};
  static const auto* list_methods = new absl::flat_hash_set<std::string>{"index", "count"};
  if (obj.is_string()) return str_methods->contains(name);
  if (obj.is_dict()) return !obj.dict().is_namespace && dict_methods->contains(name);
  if (obj.is_list()) return list_methods->contains(name);
  return false;
}

Value CallMethod(const Value& obj, const std::string& name, CallArgs& args, bool* found) {
  *found = HasMethod(obj, name);
  if (!*found) return Value();
  ArgReader r(args, name);
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      Value chars = r.Get(0, "chars");
      std::string c = chars.is_string() ? chars.as_string() : "";
      return PyStrip(s, chars.is_string() ? &c : nullptr, name != "rstrip", name != "lstrip");
    }
    if (name == "startswith" || name == "endswith") {
      Value arg = r.Required(0, "prefix");
      std::vector<Value> options = arg.is_list() ? arg.list() : std::vector<Value>{arg};
      for (const Value& o : options) {
        if (!o.is_string())
          throw CallError{name + "() argument must be str or a tuple of str, not " + o.TypeName()};
        const std::string& p = o.as_string();
        if (p.size() <= s.size() &&
            (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                  : s.compare(s.size() - p.size(), p.size(), p) == 0))
          return true;
      }
      return false;
    }
    if (name == "split" || name == "rsplit") {
      Value maxsplit = r.Get(1, "maxsplit");
      int64_t m = maxsplit.is_int() ? maxsplit.as_int() : -1;
      if (name == "rsplit" && m >= 0) {
        // Split from the right: reverse the pieces of a full split and rejoin the head.
        Value all = SplitString(s, r.Get(0, "sep"), -1);
        ValueList& parts = all.list();
        if (static_cast<int64_t>(parts.size()) <= m + 1) return all;
        Value sep = r.Get(0, "sep");
        std::string joiner = sep.is_string() ? sep.as_string() : " ";
        std::string head;
        size_t n_head = parts.size() - static_cast<size_t>(m);
        for (size_t i = 0; i < n_head; ++i) head += (i ? joiner : "") + parts[i].as_string();
        ValueList out{Value(head)};
        for (size_t i = n_head; i < parts.size(); ++i) out.push_back(parts[i]);
        return out;
      }
      return SplitString(s, r.Get(0, "sep"), m);
    }
    if (name == "upper") return AsciiUpper(s);
    if (name == "lower") return AsciiLower(s);
    if (name == "title") return PyTitle(s);
    if (name == "capitalize") return PyCapitalize(s);
    if (name == "replace") {
      Value count = r.Get(2, "count");
      return PyReplace(s, r.String(0, "old"), r.String(1, "new"),
                       count.is_int() ? count.as_int() : -1);
    }
    if (name == "find" || name == "count" || name == "index") {
      std::string sub = r.String(0, "sub");
      if (name == "count") {
        if (sub.empty()) return static_cast<int64_t>(SplitUtf8Chars(s).size() + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return n;
      }
      size_t p = s.find(sub);
      if (p == std::string::npos) {
        if (name == "index") throw CallError{"substring not found"};
        return int64_t{-1};
      }
      return static_cast<int64_t>(SplitUtf8Chars(s.substr(0, p)).size());
    }
    if (name == "join") {
      std::string out;
      bool first = true;
      for (const Value& v : Iterate(r.Required(0, "iterable"))) {
        if (!v.is_string())
          throw CallError{"sequence item: expected str instance, " + v.TypeName() + " found"};
        if (!first) out += s;
        first = false;
        out += v.as_string();
      }
      return out;
    }
    if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
      if (s.empty()) return false;
      for (char c : s) {
        unsigned char u = static_cast<unsigned char>(c);
        bool ok = name == "isdigit"   ? std::isdigit(u)
                  : name == "isspace" ? std::isspace(u)
                  : name == "isalpha" ? std::isalpha(u)
                                      : std::isalnum(u);
        if (!ok) return false;
      }
      return true;
    }
    if (name == "splitlines") {
      ValueList out;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t nl = s.find('\n', pos);
        std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        out.emplace_back(line);
        if (nl == std::string::npos) break;
        pos = nl + 1;
      }
      return out;
    }
  } else if (obj.is_dict()) {
    const ValueDict& d = obj.dict();
    if (name == "items") {
      ValueList out;
      for (const auto& [k, v] : d.items) out.push_back(Value::MakeTuple(ValueList{Value(k), v}));
      return out;
    }
    if (name == "keys") {
      ValueList out;
      for (const auto& kv : d.items) out.emplace_back(kv.first);
      return out;
    }
    if (name == "values") {
      ValueList out;
      for (const auto& kv : d.items) out.push_back(kv.second);
      return out;
    }
    if (name == "get") {
      Value key = r.Required(0, "key");
      if (key.is_string())
        if (const Value* v = d.Find(key.as_string())) return *v;
      return r.Get(1, "default", Value::MakeNone());
    }
  } else if (obj.is_list()) {
    if (name == "index" || name == "count") {
      Value x = r.Required(0, "value");
      int64_t n = 0;
      for (size_t i = 0; i < obj.list().size(); ++i) {
        if (Equal(obj.list()[i], x)) {
          if (name == "index") return static_cast<int64_t>(i);
          ++n;
        }
      }
      if (name == "index") throw CallError{x.Repr() + " is not in list"};
      return n;
    }
  }
  *found = false;
  return Value();
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
