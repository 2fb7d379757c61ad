#include "scheduler_service/tokenizer/grammar_vocabulary.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace llm {

structured::VocabEncoding VocabEncodingOf(Tokenizer::TokenSpelling spelling) {
  switch (spelling) {
    case Tokenizer::TokenSpelling::kByteLevel:
      return structured::VocabEncoding::kByteLevel;
    case Tokenizer::TokenSpelling::kSentencePiece:
      return structured::VocabEncoding::kSentencePiece;
    case Tokenizer::TokenSpelling::kRaw:
      break;
  }
  return structured::VocabEncoding::kRaw;
}

absl::StatusOr<std::shared_ptr<const structured::TokenizerInfo>> GrammarVocabulary(
    const Tokenizer& tokenizer, int32_t vocab_size) {
  using structured::VocabToken;
  const int32_t num_tokens = std::min(tokenizer.vocab_size(), vocab_size);
  std::vector<VocabToken> vocab(num_tokens);
  for (int32_t id = 0; id < num_tokens; ++id) {
    std::optional<std::string> token = tokenizer.IdToToken(id);
    if (!token.has_value()) continue;  // a hole in the ids: never allowed
    vocab[id].token = std::move(*token);
    if (tokenizer.IsSpecialToken(id)) {
      vocab[id].type = VocabToken::Type::kSpecial;
    } else if (tokenizer.IsAddedToken(id)) {
      vocab[id].type = VocabToken::Type::kAddedText;
    }
  }
  std::vector<int32_t> stops;
  for (TokenId id : tokenizer.eos_token_ids()) {
    if (id >= 0 && id < vocab_size) stops.push_back(id);
  }
  return structured::TokenizerInfo::FromVocab(vocab, VocabEncodingOf(tokenizer.token_spelling()),
                                              vocab_size, std::move(stops));
}

absl::StatusOr<std::shared_ptr<const structured::TokenizerInfo>> LoadGrammarVocabulary(
    const std::string& model_path, int32_t vocab_size) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(model_path);
  if (!tokenizer.ok()) {
    return absl::Status(
        tokenizer.status().code(),
        absl::StrCat("the tokenizer for structured outputs: ", tokenizer.status().message()));
  }
  return GrammarVocabulary(**tokenizer, vocab_size);
}

}  // namespace llm
