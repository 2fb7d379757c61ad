#include "structured/grammar_cache.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "structured/gbnf_parser.h"
#include "structured/regex_parser.h"

namespace llm::structured {

std::string GrammarSpec::CacheKey() const {
  std::string key =
      absl::StrCat(static_cast<int>(kind), ":", static_cast<int>(json_options.whitespace), ":");
  if (kind == GrammarKind::kChoice) {
    for (const std::string& c : choices) absl::StrAppend(&key, c.size(), ":", c);
  } else if (kind != GrammarKind::kJsonObject) {
    absl::StrAppend(&key, text);
  }
  return key;
}

GrammarSpec SpecOf(const StructuredOutputParams& params) {
  GrammarSpec spec;
  if (params.active()) spec.kind = params.kind;  // else the default, kJsonObject
  spec.text = params.text;
  spec.choices = params.choices;
  spec.json_options.whitespace = params.any_whitespace ? JsonGrammarOptions::Whitespace::kAny
                                                       : JsonGrammarOptions::Whitespace::kCompact;
  return spec;
}

absl::StatusOr<Grammar> ChoiceGrammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return absl::InvalidArgumentError("choice needs at least one string");
  std::vector<Expr> items;
  for (const std::string& c : choices) items.push_back(Expr::Literal(c));
  Grammar g;
  g.set_root(g.AddRule("root", Expr::Choice(std::move(items))));
  return g;
}

absl::StatusOr<Grammar> BuildGrammar(const GrammarSpec& spec) {
  switch (spec.kind) {
    case GrammarKind::kJsonSchema:
      return JsonSchemaToGrammar(spec.text, spec.json_options);
    case GrammarKind::kJsonObject:
      return JsonObjectGrammar(spec.json_options);
    case GrammarKind::kRegex:
      return ParseRegex(spec.text);
    case GrammarKind::kGrammar:
      return ParseGbnf(spec.text);
    case GrammarKind::kChoice:
      return ChoiceGrammar(spec.choices);
    case GrammarKind::kNone:
      break;
  }
  return absl::InvalidArgumentError("unknown grammar kind");
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(const GrammarSpec& spec) {
  const std::string key = spec.CacheKey();
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: it takes milliseconds, other specs need not wait.
  absl::StatusOr<Grammar> grammar = BuildGrammar(spec);
  if (!grammar.ok()) return grammar.status();
  const Vocabulary& vocabulary = tokenizer_.get();
  if (!vocabulary.ok()) return vocabulary.status();
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> compiled =
      CompiledGrammar::Compile(*grammar, *vocabulary);
  if (!compiled.ok()) return compiled.status();
  absl::MutexLock lock(&mu_);
  ++num_compiled_;
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;
  lru_.emplace_front(key, *compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return *compiled;
}

size_t GrammarCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

int64_t GrammarCache::num_compiled() const {
  absl::MutexLock lock(&mu_);
  return num_compiled_;
}

}  // namespace llm::structured
