// The grammar engine's view of a tokenizer (structured::TokenizerInfo): the bytes each id adds
// to the text, which ids end generation (the tokenizer's EOS ids) and which are control tokens.
// The scheduler builds one to check a request's constraint when it arrives; every worker builds
// the same one from the same model files to enforce it while sampling.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_GRAMMAR_VOCABULARY_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_GRAMMAR_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "structured/tokenizer_info.h"

namespace llm {

// The grammar engine's name for how the tokenizer spells its tokens' bytes.
structured::VocabEncoding VocabEncodingOf(Tokenizer::TokenSpelling spelling);

// `vocab_size`: the model's (its logits' width, at least the tokenizer's). INVALID_ARGUMENT
// naming a token whose string its spelling cannot read.
absl::StatusOr<std::shared_ptr<const structured::TokenizerInfo>> GrammarVocabulary(
    const Tokenizer& tokenizer, int32_t vocab_size);

// The same from a model directory or GGUF file (Tokenizer::FromDirectory).
absl::StatusOr<std::shared_ptr<const structured::TokenizerInfo>> LoadGrammarVocabulary(
    const std::string& model_path, int32_t vocab_size);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_GRAMMAR_VOCABULARY_H_
