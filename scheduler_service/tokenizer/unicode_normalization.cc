#include "scheduler_service/tokenizer/unicode_normalization.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/utf8.h"

namespace llm {
namespace {

struct CombiningClassEntry {
  uint32_t cp;
  uint8_t ccc;
};
struct DecompositionEntry {
  uint32_t cp;
  uint32_t first;
  uint32_t second;  // 0 for a singleton
};
struct CompositionEntry {
  uint32_t first;
  uint32_t second;
  uint32_t composite;
};

#include "scheduler_service/tokenizer/unicode_nfc_data.inc"

// Hangul syllables (algorithmic, Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t CombiningClass(uint32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::lower_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), cp,
                             [](const CombiningClassEntry& e, uint32_t c) { return e.cp < c; });
  return it != std::end(kCombiningClasses) && it->cp == cp ? it->ccc : 0;
}

void Decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                               [](const DecompositionEntry& e, uint32_t c) { return e.cp < c; });
    if (it != std::end(kDecompositions) && it->cp == cp) {
      Decompose(it->first, out);
      if (it->second != 0) Decompose(it->second, out);
      return;
    }
  }
  out->push_back(cp);
}

// The primary composite of (a, b), or 0.
uint32_t Compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  auto it = std::lower_bound(
      std::begin(kCompositions), std::end(kCompositions), std::make_pair(a, b),
      [](const CompositionEntry& e, auto key) { return std::make_pair(e.first, e.second) < key; });
  return it != std::end(kCompositions) && it->first == a && it->second == b ? it->composite : 0;
}

// Code points below U+0300 are their own NFC and NFD, with class 0, except the Latin-1
// letters with marks (U+00C0 and up), which NFD decomposes.
bool Unchanged(std::string_view text, bool nfd) {
  const unsigned char limit = nfd ? 0xC3 : 0xCC;  // lead bytes of U+00C0 / U+0300
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= limit) return false;
  }
  return true;
}

// Canonical decomposition, then canonical ordering of each run of non-starters.
std::vector<uint32_t> DecomposeAndOrder(std::string_view text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) Decompose(NextCodePoint(text, &pos), &cps);
  for (size_t i = 0; i < cps.size();) {
    if (CombiningClass(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && CombiningClass(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](uint32_t a, uint32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }
  return cps;
}

std::string Encode(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size() * 2);
  for (const uint32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

}  // namespace

std::string ToNfd(std::string_view text) {
  if (Unchanged(text, /*nfd=*/true)) return std::string(text);
  return Encode(DecomposeAndOrder(text));
}

std::string ToNfc(std::string_view text) {
  if (Unchanged(text, /*nfd=*/false)) return std::string(text);
  std::vector<uint32_t> cps = DecomposeAndOrder(text);
  if (cps.empty()) return "";
  // Canonical composition (UAX #15's sample algorithm): a character joins the last starter
  // unless a character between them has the same or a higher class (it is blocked).
  size_t starter = 0;
  bool have_starter = CombiningClass(cps[0]) == 0;
  int last_class = have_starter ? 0 : 256;
  size_t out = 1;
  for (size_t i = 1; i < cps.size(); ++i) {
    const uint32_t ch = cps[i];
    const int ch_class = CombiningClass(ch);
    const uint32_t composite = have_starter ? Compose(cps[starter], ch) : 0;
    if (composite != 0 && (last_class < ch_class || last_class == 0)) {
      cps[starter] = composite;
      continue;
    }
    if (ch_class == 0) {
      starter = out;
      have_starter = true;
    }
    last_class = ch_class;
    cps[out++] = ch;
  }
  cps.resize(out);
  return Encode(cps);
}

}  // namespace llm
