#include "scheduler_service/chat/jinja/collection_filters.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scheduler_service/chat/jinja/arg_reader.h"
#include "scheduler_service/chat/jinja/operators.h"
#include "scheduler_service/chat/jinja/unicode_case.h"

namespace llm::jinja {
namespace {

// jinja2's make_multi_attrgetter: the key of an item is the list of its values at the
// comma-separated attributes (the item itself when there is none), strings lower-cased unless
// case_sensitive.
class KeyGetter {
 public:
  KeyGetter(const Value& attribute, bool case_sensitive, Value fallback = Value())
      : case_sensitive_(case_sensitive), fallback_(std::move(fallback)) {
    if (attribute.is_undefined() || attribute.is_none()) {
      paths_.emplace_back();
    } else if (attribute.is_int()) {
      paths_.push_back(std::to_string(attribute.as_int()));
    } else {
      const std::string s = attribute.Str();
      size_t pos = 0;
      while (true) {
        const size_t comma = s.find(',', pos);
        paths_.push_back(s.substr(pos, comma == std::string::npos ? comma : comma - pos));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    }
  }

  // The key for one attribute (the first); jinja2's single-attribute getter.
  Value One(const Value& item) const { return Get(item, paths_[0], true); }
  // The key for all attributes, as a list compared element by element.
  Value All(const Value& item) const {
    if (paths_.size() == 1) return One(item);
    ValueList out;
    for (const std::string& p : paths_) out.push_back(Get(item, p, true));
    return out;
  }
  // The value at the first attribute without case folding (groupby's grouper).
  Value Raw(const Value& item) const { return Get(item, paths_[0], false); }

 private:
  Value Get(const Value& item, const std::string& path, bool fold) const {
    Value v = path.empty() ? item : AttrPath(item, path);
    if (v.is_undefined() && !fallback_.is_undefined()) v = fallback_;
    if (fold && !case_sensitive_ && v.is_string()) return PyLower(v.as_string());
    return v;
  }

  std::vector<std::string> paths_;
  bool case_sensitive_;
  Value fallback_;
};

bool Less(const Value& a, const Value& b) { return Compare(a, b, "<") < 0; }

// Python's round(x, ndigits) for a float: correctly rounded, ties to even (as printf's
// conversion of the exact binary value rounds).
double RoundFloat(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits >= 0) {
    if (ndigits > 300) return x;
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  if (ndigits < -308) return 0.0 * x;
  const double scale = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / scale) * scale;
}

// Python's round(n, ndigits) for an integer and ndigits < 0: ties to even.
int64_t RoundInt(int64_t n, int64_t ndigits) {
  if (ndigits >= 0) return n;
  if (ndigits < -18) return 0;
  int64_t m = 1;
  for (int64_t i = 0; i < -ndigits; ++i) m *= 10;
  int64_t q = n / m, r = n % m;
  if (r < 0) {
    r += m;
    --q;
  }
  if (2 * r > m || (2 * r == m && q % 2 != 0)) ++q;
  int64_t out;
  if (__builtin_mul_overflow(q, m, &out))
    throw CallError{"integer overflow in round (integers are 64-bit here)"};
  return out;
}

}  // namespace

bool ApplyCollectionFilter(const std::string& name, const Value& in, CallArgs& args, Value* out) {
  ArgReader r(args, name);
  if (name == "sort") {
    const bool reverse = r.Get(0, "reverse").Truthy();
    const KeyGetter key(r.Get(2, "attribute"), r.Get(1, "case_sensitive").Truthy());
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& item : Iterate(in)) keyed.emplace_back(key.All(item), item);
    // Stable, and reversed by comparison, so equal items keep their order as Python's sorted.
    std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
      return reverse ? Less(b.first, a.first) : Less(a.first, b.first);
    });
    ValueList sorted;
    for (auto& kv : keyed) sorted.push_back(std::move(kv.second));
    *out = std::move(sorted);
    return true;
  }
  if (name == "unique") {
    const KeyGetter key(r.Get(1, "attribute"), r.Get(0, "case_sensitive").Truthy());
    ValueList kept;
    std::vector<Value> seen;
    for (const Value& item : Iterate(in)) {
      Value k = key.One(item);
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, k); }))
        continue;
      seen.push_back(std::move(k));
      kept.push_back(item);
    }
    *out = std::move(kept);
    return true;
  }
  if (name == "min" || name == "max") {
    const KeyGetter key(r.Get(1, "attribute"), r.Get(0, "case_sensitive").Truthy());
    std::vector<Value> items = Iterate(in);
    if (items.empty()) {
      *out = Value::MakeUndefined("No aggregated item, sequence was empty.");
      return true;
    }
    size_t best = 0;
    Value best_key = key.One(items[0]);
    for (size_t i = 1; i < items.size(); ++i) {
      Value k = key.One(items[i]);
      // The first of equal items wins, as Python's min and max.
      if (name == "min" ? Less(k, best_key) : Less(best_key, k)) {
        best = i;
        best_key = std::move(k);
      }
    }
    *out = items[best];
    return true;
  }
  if (name == "sum") {
    const Value attribute = r.Get(0, "attribute");
    Value total = r.Get(1, "start", Value(int64_t{0}));
    for (const Value& item : Iterate(in)) {
      total = Arith(
          "+", total,
          attribute.is_undefined() || attribute.is_none() ? item : AttrPath(item, attribute.Str()));
    }
    *out = total;
    return true;
  }
  if (name == "round") {
    const int64_t precision = r.Int(0, "precision", 0);
    const std::string method = r.Get(1, "method", Value("common")).Str();
    if (method != "common" && method != "ceil" && method != "floor")
      throw CallError{"method must be common, ceil or floor"};
    if (!in.is_number() && !in.is_bool())
      throw CallError{"type " + in.TypeName() + " doesn't define __round__ method"};
    if (method == "common") {
      if (in.is_float()) {
        *out = RoundFloat(in.as_float(), precision);
      } else {
        *out = RoundInt(in.is_bool() ? int64_t{in.as_bool()} : in.as_int(), precision);
      }
      return true;
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = in.is_bool() ? double{in.as_bool()} : in.as_number();
    *out = (method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale;
    return true;
  }
  if (name == "groupby") {
    const KeyGetter key(r.Required(0, "attribute"), r.Get(2, "case_sensitive").Truthy(),
                        r.Get(1, "default"));
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& item : Iterate(in)) keyed.emplace_back(key.One(item), item);
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](const auto& a, const auto& b) { return Less(a.first, b.first); });
    static const auto* type =
        new std::shared_ptr<const Value::TupleType>(std::make_shared<const Value::TupleType>(
            Value::TupleType{"_GroupTuple", {"grouper", "list"}}));
    ValueList groups;
    for (size_t i = 0; i < keyed.size();) {
      size_t j = i;
      ValueList members;
      while (j < keyed.size() && Equal(keyed[j].first, keyed[i].first))
        members.push_back(keyed[j++].second);
      // The grouper is the first member's value as written, not its folded case.
      groups.push_back(Value::MakeTuple({key.Raw(members[0]), Value(std::move(members))}, *type));
      i = j;
    }
    *out = std::move(groups);
    return true;
  }
  if (name == "batch") {
    const int64_t size = r.Int(0, "linecount", 0);
    if (size <= 0) throw CallError{"batch(): linecount must be positive"};
    const Value fill = r.Get(1, "fill_with");
    ValueList batches, cur;
    for (const Value& item : Iterate(in)) {
      if (static_cast<int64_t>(cur.size()) == size) {
        batches.push_back(std::move(cur));
        cur = ValueList();
      }
      cur.push_back(item);
    }
    if (!cur.empty()) {
      if (!fill.is_undefined() && !fill.is_none())
        while (static_cast<int64_t>(cur.size()) < size) cur.push_back(fill);
      batches.push_back(std::move(cur));
    }
    *out = std::move(batches);
    return true;
  }
  if (name == "slice") {
    const int64_t slices = r.Int(0, "slices", 0);
    if (slices <= 0 || slices > (1 << 20)) throw CallError{"slice(): slices must be positive"};
    const Value fill = r.Get(1, "fill_with");
    const std::vector<Value> seq = Iterate(in);
    const int64_t n = static_cast<int64_t>(seq.size());
    const int64_t per = n / slices, extra = n % slices;
    int64_t offset = 0;
    ValueList parts;
    for (int64_t k = 0; k < slices; ++k) {
      const int64_t start = offset + k * per;
      if (k < extra) ++offset;
      const int64_t end = offset + (k + 1) * per;
      ValueList part(seq.begin() + start, seq.begin() + end);
      if (!fill.is_undefined() && !fill.is_none() && k >= extra) part.push_back(fill);
      parts.push_back(std::move(part));
    }
    *out = std::move(parts);
    return true;
  }
  return false;
}

}  // namespace llm::jinja
