#include "structured/grammar.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace llm::structured {

Expr Expr::Bytes(const ByteSet& set) {
  Expr e;
  e.kind = Kind::kBytes;
  e.bytes = set;
  return e;
}

Expr Expr::Literal(std::string_view text) {
  if (text.size() == 1) return Byte(static_cast<uint8_t>(text[0]));
  std::vector<Expr> items;
  items.reserve(text.size());
  for (char c : text) items.push_back(Byte(static_cast<uint8_t>(c)));
  return Sequence(std::move(items));
}

Expr Expr::Sequence(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  if (items.empty()) return Empty();
  Expr e;
  e.kind = Kind::kSequence;
  e.items = std::move(items);
  return e;
}

Expr Expr::Choice(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.kind = Kind::kChoice;
  e.items = std::move(items);
  return e;
}

Expr Expr::Rule(int32_t rule) {
  Expr e;
  e.kind = Kind::kRule;
  e.rule = rule;
  return e;
}

Expr Expr::Repeat(Expr item, int32_t min, int32_t max) {
  Expr e;
  e.kind = Kind::kRepeat;
  e.items.push_back(std::move(item));
  e.min = min;
  e.max = max;
  return e;
}

int32_t Grammar::AddRule(std::string name) { return AddRule(std::move(name), Expr::Empty()); }

int32_t Grammar::AddRule(std::string name, Expr body) {
  rules_.push_back({std::move(name), std::move(body)});
  return static_cast<int32_t>(rules_.size()) - 1;
}

std::optional<int32_t> Grammar::FindRule(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (rules_[i].name == name) return static_cast<int32_t>(i);
  }
  return std::nullopt;
}

namespace {

std::string ByteSetToString(const ByteSet& set) {
  std::string out = "[";
  for (int b = 0; b < 256; ++b) {
    if (!set.Contains(static_cast<uint8_t>(b))) continue;
    int e = b;
    while (e + 1 < 256 && set.Contains(static_cast<uint8_t>(e + 1))) ++e;
    absl::StrAppendFormat(&out, "\\x%02x", b);
    if (e > b) absl::StrAppendFormat(&out, "-\\x%02x", e);
    b = e;
  }
  return out + "]";
}

std::string ExprToString(const Grammar& g, const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kEmpty:
      return "\"\"";
    case Expr::Kind::kBytes:
      return ByteSetToString(e.bytes);
    case Expr::Kind::kRule:
      return g.rules()[e.rule].name;
    case Expr::Kind::kSequence:
    case Expr::Kind::kChoice: {
      std::string out = "(";
      for (size_t i = 0; i < e.items.size(); ++i) {
        if (i > 0) out += e.kind == Expr::Kind::kChoice ? " | " : " ";
        out += ExprToString(g, e.items[i]);
      }
      return out + ")";
    }
    case Expr::Kind::kRepeat:
      return absl::StrCat(ExprToString(g, e.items[0]), "{", e.min, ",",
                          e.max == Expr::kUnbounded ? "" : absl::StrCat(e.max), "}");
  }
  return "";
}

}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (const Rule& r : rules_)
    absl::StrAppend(&out, r.name, " ::= ", ExprToString(*this, r.body), "\n");
  return out;
}

}  // namespace llm::structured
