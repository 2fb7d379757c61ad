#include "structured/utf8_class.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "common/utf8.h"

namespace llm::structured {
namespace {

// The ranges sorted, merged and with the surrogates cut out; negated: their complement.
std::vector<CodepointRange> Normalize(std::vector<CodepointRange> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodepointRange& a, const CodepointRange& b) { return a.lo < b.lo; });
  std::vector<CodepointRange> merged;
  for (CodepointRange r : ranges) {
    if (r.lo > r.hi || r.lo > kMaxCodepoint) continue;
    r.hi = std::min(r.hi, kMaxCodepoint);
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (negated) {
    std::vector<CodepointRange> complement;
    uint32_t next = 0;
    for (const CodepointRange& r : merged) {
      if (r.lo > next) complement.push_back({next, r.lo - 1});
      next = r.hi + 1;
    }
    if (next <= kMaxCodepoint) complement.push_back({next, kMaxCodepoint});
    merged = std::move(complement);
  }
  std::vector<CodepointRange> out;
  for (const CodepointRange& r : merged) {
    if (r.hi < 0xD800 || r.lo > 0xDFFF) {
      out.push_back(r);
      continue;
    }
    if (r.lo < 0xD800) out.push_back({r.lo, 0xD7FF});
    if (r.hi > 0xDFFF) out.push_back({0xE000, r.hi});
  }
  return out;
}

// Appends to `out` the byte-range sequences of [lo, hi], whose codepoints all have `len` bytes:
// the range is split until each byte position of the split ranges spans a full range, as the
// UTF-8 range compilers of regex engines do.
void SplitSameLength(uint32_t lo, uint32_t hi, int len,
                     std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitSameLength(lo, lo | m, len, out);
        SplitSameLength((lo | m) + 1, hi, len, out);
        return;
      }
      if ((hi & m) != m) {
        SplitSameLength(lo, (hi & ~m) - 1, len, out);
        SplitSameLength(hi & ~m, hi, len, out);
        return;
      }
    }
  }
  std::string a, b;
  AppendUtf8(lo, &a);
  AppendUtf8(hi, &b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < len; ++i) {
    seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  }
  out->push_back(std::move(seq));
}

}  // namespace

Expr Utf8Class(std::vector<CodepointRange> ranges, bool negated) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
  for (const CodepointRange& r : Normalize(std::move(ranges), negated)) {
    uint32_t lo = r.lo;
    while (lo <= r.hi) {
      const int len = Utf8EncodedLength(lo);
      const uint32_t hi = std::min(r.hi, kLengthEnds[len - 1]);
      SplitSameLength(lo, hi, len, &seqs);
      lo = hi + 1;
    }
  }
  ByteSet ascii;
  std::vector<Expr> choices;
  for (const auto& seq : seqs) {
    if (seq.size() == 1) {
      ascii.AddRange(seq[0].first, seq[0].second);
      continue;
    }
    std::vector<Expr> items;
    for (const auto& [lo, hi] : seq) items.push_back(Expr::Bytes(ByteSet::Range(lo, hi)));
    choices.push_back(Expr::Sequence(std::move(items)));
  }
  if (!ascii.Empty()) choices.insert(choices.begin(), Expr::Bytes(ascii));
  if (choices.empty()) return Expr::Bytes(ByteSet());  // matches nothing
  return Expr::Choice(std::move(choices));
}

int32_t ReadHexDigits(std::string_view text, size_t* pos, int digits) {
  int32_t v = 0;
  for (int i = 0; i < digits; ++i) {
    if (*pos >= text.size() || !std::isxdigit(static_cast<unsigned char>(text[*pos]))) return -1;
    const char d = static_cast<char>(std::tolower(static_cast<unsigned char>(text[(*pos)++])));
    v = v * 16 + (d <= '9' ? d - '0' : d - 'a' + 10);
  }
  return v;
}

}  // namespace llm::structured
