// The `added_tokens` of a tokenizer.json (special tokens such as <|begin_of_text|> and
// tokens added by fine-tuning), matched in the text before the model runs: leftmost, and
// the longest token at a position. Tokens with normalized=false are matched in the raw
// text, the others in the normalized text; lstrip / rstrip take the whitespace beside a
// match into it; single_word matches only where no word character (alphanumeric or '_')
// touches the match. Immutable after construction; thread-safe.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_ADDED_VOCABULARY_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_ADDED_VOCABULARY_H_

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/types.h"

namespace llm {

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

class AddedVocabulary {
 public:
  // A run of text [begin, end): an added token when id is set, else text for the model.
  struct Piece {
    size_t begin;
    size_t end;
    std::optional<TokenId> id;
  };

  AddedVocabulary() = default;
  explicit AddedVocabulary(std::vector<AddedToken> tokens);

  // Splits `text` at the matches of the tokens whose `normalized` flag equals `normalized`.
  // Pieces cover `text` in order; text pieces are never empty.
  std::vector<Piece> Split(std::string_view text, bool normalized) const;

  const AddedToken* FindById(TokenId id) const;
  const AddedToken* FindByContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Matcher {
    // Token indices by the first byte of their content, longest first.
    std::array<std::vector<size_t>, 256> by_first_byte;
    std::array<bool, 256> is_first_byte{};  // by_first_byte[b] is not empty
    bool empty = true;
  };
  std::optional<size_t> LongestAt(const Matcher& m, std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<TokenId, size_t> by_id_;
  absl::flat_hash_map<std::string, size_t> by_content_;
  Matcher raw_;         // normalized == false
  Matcher normalized_;  // normalized == true
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_ADDED_VOCABULARY_H_
