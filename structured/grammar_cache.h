// What a request constrains its output with (GrammarSpec), the front end that turns it into a
// Grammar (BuildGrammar), and GrammarCache: one CompiledGrammar per distinct spec, shared by
// every sequence that uses it.
#ifndef LLM_STRUCTURED_GRAMMAR_CACHE_H_
#define LLM_STRUCTURED_GRAMMAR_CACHE_H_

#include <cstdint>
#include <future>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/sampling_params.h"
#include "structured/compiled_grammar.h"
#include "structured/grammar.h"
#include "structured/json_schema_converter.h"
#include "structured/tokenizer_info.h"

namespace llm::structured {

// The structured-output kinds of vLLM's guided decoding / OpenAI's response_format are the
// request's own (StructuredOutputParams::Kind, whose comments say what `text` and `choices` hold
// for each), so that a request's constraint needs no mapping. kNone builds no grammar.
using GrammarKind = StructuredOutputParams::Kind;

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;
  JsonGrammarOptions json_options;

  // A string that differs for specs that build different grammars.
  std::string CacheKey() const;
};

// The spec of a request's constraint (common/sampling_params.h); `params` must be active().
GrammarSpec SpecOf(const StructuredOutputParams& params);

// The Grammar of `spec` from its front end. INVALID_ARGUMENT naming what the front end refuses.
absl::StatusOr<Grammar> BuildGrammar(const GrammarSpec& spec);

// One of `choices`, byte for byte. INVALID_ARGUMENT when there are none.
absl::StatusOr<Grammar> ChoiceGrammar(const std::vector<std::string>& choices);

// Thread-safe. Keeps the `capacity` most recently used grammars (matchers keep theirs alive
// through their shared_ptr after eviction). A spec that fails is not cached: its error is
// returned again each time. Two threads asking for the same new spec may both compile it; the
// first result stored is the one kept.
class GrammarCache {
 public:
  using Vocabulary = absl::StatusOr<std::shared_ptr<const TokenizerInfo>>;

  GrammarCache(std::shared_ptr<const TokenizerInfo> tokenizer, size_t capacity = 256)
      : capacity_(capacity) {
    std::promise<Vocabulary> ready;
    ready.set_value(std::move(tokenizer));
    tokenizer_ = ready.get_future().share();
  }
  // A vocabulary still being read (a worker reads it beside its other start-up work): the
  // first Get waits for it, and every Get fails with its error if reading it failed.
  explicit GrammarCache(std::shared_future<Vocabulary> tokenizer, size_t capacity = 256)
      : tokenizer_(std::move(tokenizer)), capacity_(capacity) {}
  GrammarCache(const GrammarCache&) = delete;
  GrammarCache& operator=(const GrammarCache&) = delete;

  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(const GrammarSpec& spec);

  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t num_compiled() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledGrammar>>;

  std::shared_future<Vocabulary> tokenizer_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t num_compiled_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_GRAMMAR_CACHE_H_
