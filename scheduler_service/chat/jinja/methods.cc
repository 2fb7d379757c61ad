#include "scheduler_service/chat/jinja/methods.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/utf8.h"
#include "scheduler_service/chat/jinja/arg_reader.h"
#include "scheduler_service/chat/jinja/operators.h"
#include "scheduler_service/chat/jinja/python_string.h"
#include "scheduler_service/chat/jinja/string_format.h"
#include "scheduler_service/chat/jinja/unicode_case.h"

namespace llm::jinja {
namespace {

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

bool HasMethod(const Value& obj, const std::string& name) {
  static const auto* str_methods = new absl::flat_hash_set<std::string>{
      "strip",     "lstrip",    "rstrip",     "startswith", "endswith",     "split",
      "rsplit",    "upper",     "lower",      "title",      "capitalize",   "replace",
      "find",      "rfind",     "count",      "index",      "rindex",       "join",
      "isdigit",   "isspace",   "isalpha",    "isalnum",    "isupper",      "islower",
      "isnumeric", "isdecimal", "splitlines", "format",     "center",       "ljust",
      "rjust",     "zfill",     "partition",  "rpartition", "removeprefix", "removesuffix",
      "casefold",  "swapcase"};
  static const auto* dict_methods =
      new absl::flat_hash_set<std::string>{"items", "keys", "values", "get", "copy"};
  static const auto* list_methods = new absl::flat_hash_set<std::string>{"index", "count", "copy"};
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
        if (!sep.is_string()) {
          // By whitespace: m words from the right; the rest, less its trailing whitespace,
          // is the head.
          std::vector<std::string_view> cs = SplitUtf8Chars(s);
          size_t end = cs.size();
          ValueList tail;
          auto space = [&](size_t i) { return IsPySpace(Utf8CharCodePoint(cs[i])); };
          for (int64_t k = 0; k < m; ++k) {
            while (end > 0 && space(end - 1)) --end;
            if (end == 0) break;
            size_t begin = end;
            while (begin > 0 && !space(begin - 1)) --begin;
            std::string word;
            for (size_t i = begin; i < end; ++i) word += cs[i];
            tail.insert(tail.begin(), Value(word));
            end = begin;
          }
          while (end > 0 && space(end - 1)) --end;
          ValueList out;
          if (end > 0) {
            std::string head;
            for (size_t i = 0; i < end; ++i) head += cs[i];
            out.push_back(Value(head));
          }
          out.insert(out.end(), tail.begin(), tail.end());
          return out;
        }
        std::string joiner = sep.as_string();
        std::string head;
        size_t n_head = parts.size() - static_cast<size_t>(m);
        for (size_t i = 0; i < n_head; ++i) head += (i ? joiner : "") + parts[i].as_string();
        ValueList out{Value(head)};
        for (size_t i = n_head; i < parts.size(); ++i) out.push_back(parts[i]);
        return out;
      }
      return SplitString(s, r.Get(0, "sep"), m);
    }
    if (name == "upper") return PyUpper(s);
    if (name == "lower") return PyLower(s);
    if (name == "title") return PyTitle(s);
    if (name == "capitalize") return PyCapitalize(s);
    if (name == "replace") {
      Value count = r.Get(2, "count");
      return PyReplace(s, r.String(0, "old"), r.String(1, "new"),
                       count.is_int() ? count.as_int() : -1);
    }
    if (name == "rfind" || name == "rindex") {
      std::string sub = r.String(0, "sub");
      size_t p = s.rfind(sub);
      if (p == std::string::npos) {
        if (name == "rindex") throw CallError{"substring not found"};
        return int64_t{-1};
      }
      return static_cast<int64_t>(SplitUtf8Chars(s.substr(0, p)).size());
    }
    if (name == "format") return StrFormat(s, args);
    if (name == "center" || name == "ljust" || name == "rjust") {
      const int64_t width = r.Int(0, "width", 0);
      const std::string fill = r.Get(1, "fillchar", Value(" ")).Str();
      if (SplitUtf8Chars(fill).size() != 1)
        throw CallError{"The fill character must be exactly one character long"};
      const int64_t len = static_cast<int64_t>(SplitUtf8Chars(s).size());
      if (width <= len) return s;
      if (width > (int64_t{1} << 24)) throw CallError{name + "(): width too large"};
      const int64_t pad = width - len;
      // Python's center: the odd one of the padding goes left when the width is odd.
      const int64_t left = name == "ljust"   ? 0
                           : name == "rjust" ? pad
                                             : pad / 2 + (pad & width & 1);
      std::string out;
      for (int64_t i = 0; i < left; ++i) out += fill;
      out += s;
      for (int64_t i = 0; i < pad - left; ++i) out += fill;
      return out;
    }
    if (name == "zfill") {
      const int64_t width = r.Int(0, "width", 0);
      const int64_t len = static_cast<int64_t>(SplitUtf8Chars(s).size());
      if (width <= len) return s;
      if (width > (int64_t{1} << 24)) throw CallError{"zfill(): width too large"};
      const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
      return s.substr(0, sign) + std::string(width - len, '0') + s.substr(sign);
    }
    if (name == "partition" || name == "rpartition") {
      std::string sep = r.String(0, "sep");
      if (sep.empty()) throw CallError{"empty separator"};
      size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
      if (p == std::string::npos) {
        return name == "partition" ? Value::MakeTuple({Value(s), Value(""), Value("")})
                                   : Value::MakeTuple({Value(""), Value(""), Value(s)});
      }
      return Value::MakeTuple({Value(s.substr(0, p)), Value(sep), Value(s.substr(p + sep.size()))});
    }
    if (name == "removeprefix") {
      std::string p = r.String(0, "prefix");
      return s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s;
    }
    if (name == "removesuffix") {
      std::string p = r.String(0, "suffix");
      return !p.empty() && p.size() <= s.size() && s.compare(s.size() - p.size(), p.size(), p) == 0
                 ? s.substr(0, s.size() - p.size())
                 : s;
    }
    if (name == "casefold") return PyLower(s);
    if (name == "swapcase") return PySwapcase(s);
    if (name == "isupper") return PyIsUpper(s);
    if (name == "islower") return PyIsLower(s);
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
    if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" ||
        name == "isnumeric" || name == "isdecimal") {
      if (s.empty()) return false;
      for (char c : s) {
        unsigned char u = static_cast<unsigned char>(c);
        bool ok = name == "isdigit" || name == "isnumeric" || name == "isdecimal" ? std::isdigit(u)
                  : name == "isspace"                                             ? std::isspace(u)
                  : name == "isalpha"                                             ? std::isalpha(u)
                                                                                  : std::isalnum(u);
        if (!ok) return false;
      }
      return true;
    }
    if (name == "splitlines") {
      ValueList out;
      for (std::string& line : PySplitlines(s)) out.emplace_back(std::move(line));
      return out;
    }
  } else if (obj.is_dict()) {
    const ValueDict& d = obj.dict();
    if (name == "items") {
      ValueList out;
      for (const auto& [k, v] : d.items) out.push_back(Value::MakeTuple(ValueList{k, v}));
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
    if (name == "copy") {
      ValueDict copy = d;
      return Value(std::move(copy));
    }
    if (name == "get") {
      Value key = r.Required(0, "key");
      if (const Value* v = d.Find(key)) return *v;
      return r.Get(1, "default", Value::MakeNone());
    }
  } else if (obj.is_list()) {
    if (name == "copy") return ValueList(obj.list());
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

}  // namespace llm::jinja
