#include "scheduler_service/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "common/utf8.h"
#include "scheduler_service/tokenizer/string_view_compat.h"

namespace llm {
namespace {

// Word characters for single_word: ASCII alphanumerics, '_' and any non-ASCII letter or
// digit (approximated as every non-ASCII character that is not whitespace).
bool IsWordChar(uint32_t cp) {
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) || cp == '_';
  return !IsUnicodeWhitespace(cp);
}

// The code point that ends just before `pos`.
uint32_t CodePointBefore(std::string_view s, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return NextCodePoint(s, &start);
}

}  // namespace

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    by_id_[t.id] = i;
    by_content_[t.content] = i;
    if (t.content.empty()) continue;
    Matcher& m = t.normalized ? normalized_ : raw_;
    m.by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(i);
    m.is_first_byte[static_cast<unsigned char>(t.content[0])] = true;
    m.empty = false;
  }
  for (Matcher* m : {&raw_, &normalized_}) {
    for (auto& list : m->by_first_byte) {
      std::stable_sort(list.begin(), list.end(), [this](size_t a, size_t b) {
        return tokens_[a].content.size() > tokens_[b].content.size();
      });
    }
  }
}

std::optional<size_t> AddedVocabulary::LongestAt(const Matcher& m, std::string_view text,
                                                 size_t pos) const {
  for (const size_t i : m.by_first_byte[static_cast<unsigned char>(text[pos])]) {
    if (text.substr(pos).starts_with(tokens_[i].content)) return i;
  }
  return std::nullopt;
}

std::vector<AddedVocabulary::Piece> AddedVocabulary::Split(std::string_view text,
                                                           bool normalized) const {
  std::vector<Piece> pieces;
  const Matcher& m = normalized ? normalized_ : raw_;
  size_t done = 0;  // text before this is in pieces
  size_t pos = 0;
  while (!m.empty && pos < text.size()) {
    if (!m.is_first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const std::optional<size_t> hit = LongestAt(m, text, pos);
    if (!hit.has_value()) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[*hit];
    size_t start = pos;
    size_t stop = pos + t.content.size();
    if (t.single_word) {
      const bool word_before = start > 0 && IsWordChar(CodePointBefore(text, start));
      size_t after = stop;
      const bool word_after = stop < text.size() && IsWordChar(NextCodePoint(text, &after));
      if (word_before || word_after) {
        pos = stop;
        continue;
      }
    }
    if (t.lstrip) {
      while (start > done && IsUnicodeWhitespace(CodePointBefore(text, start))) {
        size_t p = start - 1;
        while (p > done && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        start = p;
      }
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!IsUnicodeWhitespace(NextCodePoint(text, &next))) break;
        stop = next;
      }
    }
    if (done < start) pieces.push_back({done, start, std::nullopt});
    pieces.push_back({start, stop, t.id});
    done = stop;
    pos = stop;
  }
  if (done < text.size()) pieces.push_back({done, text.size(), std::nullopt});
  return pieces;
}

const AddedToken* AddedVocabulary::FindById(TokenId id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::FindByContent(std::string_view content) const {
  auto it = by_content_.find(ToAbsl(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace llm
