#include "structured/integer_range.h"

#include <string>
#include <utility>
#include <vector>

namespace llm::structured {
namespace {

Expr Digits(char lo, char hi) {
  return Expr::Bytes(ByteSet::Range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)));
}

// Digit strings of x's length between x and y (same length, x <= y).
Expr SameLength(const std::string& x, const std::string& y) {
  const size_t n = x.size();
  if (n == 0) return Expr::Empty();
  if (x == y) return Expr::Literal(x);
  const std::string x_rest = x.substr(1), y_rest = y.substr(1);
  if (x[0] == y[0]) return Expr::Sequence({Expr::Byte(x[0]), SameLength(x_rest, y_rest)});
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  if (x_rest == zeros && y_rest == nines) {
    return Expr::Sequence({Digits(x[0], y[0]), Expr::Repeat(Digits('0', '9'), n - 1, n - 1)});
  }
  std::vector<Expr> choices;
  choices.push_back(Expr::Sequence({Expr::Byte(x[0]), SameLength(x_rest, nines)}));
  if (x[0] + 1 <= y[0] - 1) {
    choices.push_back(
        Expr::Sequence({Digits(static_cast<char>(x[0] + 1), static_cast<char>(y[0] - 1)),
                        Expr::Repeat(Digits('0', '9'), n - 1, n - 1)}));
  }
  choices.push_back(Expr::Sequence({Expr::Byte(y[0]), SameLength(zeros, y_rest)}));
  return Expr::Choice(std::move(choices));
}

// Non-negative integers a..b (b absent: unbounded), a <= b: per length, the range of the digit
// strings of that length.
Expr NonNegative(int64_t a, std::optional<int64_t> b) {
  const std::string a_text = std::to_string(a);
  const std::string b_text = b ? std::to_string(*b) : "";
  const size_t last_len = b ? b_text.size() : a_text.size();
  std::vector<Expr> choices;
  for (size_t len = a_text.size(); len <= last_len; ++len) {
    const std::string lo = len == a_text.size() ? a_text : "1" + std::string(len - 1, '0');
    const std::string hi = b && len == last_len ? b_text : std::string(len, '9');
    choices.push_back(SameLength(lo, hi));
  }
  if (!b) {  // every longer number
    choices.push_back(Expr::Sequence(
        {Digits('1', '9'),
         Expr::Repeat(Digits('0', '9'), static_cast<int32_t>(last_len), Expr::kUnbounded)}));
  }
  return Expr::Choice(std::move(choices));
}

}  // namespace

Expr IntegerRange(std::optional<int64_t> min, std::optional<int64_t> max) {
  std::vector<Expr> choices;
  // Negative part: -max'..-min' with max' = min(max, -1).
  if (!min || *min < 0) {
    const int64_t neg_hi = max ? std::min(*max, int64_t{-1}) : -1;
    if (!min || *min <= neg_hi) {
      choices.push_back(Expr::Sequence(
          {Expr::Byte('-'),
           NonNegative(-neg_hi, min ? std::optional<int64_t>(-*min) : std::nullopt)}));
    }
  }
  // Non-negative part: max(min, 0)..max.
  const int64_t pos_lo = min ? std::max(*min, int64_t{0}) : 0;
  if (!max || *max >= pos_lo) choices.push_back(NonNegative(pos_lo, max));
  if (choices.empty()) return Expr::Bytes(ByteSet());  // empty range: matches nothing
  return Expr::Choice(std::move(choices));
}

}  // namespace llm::structured
