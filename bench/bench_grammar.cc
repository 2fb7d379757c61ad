// bench_grammar: the grammar engine on SmolLM2's vocabulary (49,152 tokens): the time to fill
// one token bitmask at each state along a real JSON document (GrammarMatcher's precomputed
// per-position token sets), against the brute force in the same run (every id offered to
// AcceptToken and taken back: what a mask costs without the precomputation), and the time to
// compile each grammar (the front end, the automaton and the token-set precomputation). The
// ratios and the per-state worst case are printed at the end.
//
// Usage: bench_grammar [google benchmark flags]. The vocabulary is read from
// $LLM_MODELS_CACHE or ~/.cache/llm-models (tools/models/fetch_model.sh smollm2), else from
// the committed fortune-bpe tokenizer (2,048 tokens), said in the output; LLM_GRAMMAR_VOCAB=PATH
// reads another model's (e.g. Gemma 3's GGUF: 262,144 tokens, SentencePiece spelling).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "scheduler_service/tokenizer/grammar_vocabulary.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "structured/grammar_cache.h"
#include "structured/grammar_matcher.h"
#include "structured/tokenizer_info.h"

namespace llm::structured {
namespace {

constexpr char kSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                               "zip": {"type": "string", "pattern": "[0-9]{5}"}},
                "required": ["street", "city"]},
    "verified": {"type": "boolean"},
    "score": {"type": ["number", "null"]}
  },
  "required": ["name", "age", "tags", "address"]
})";

constexpr char kDocument[] =
    R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["mathematics", )"
    R"("poetry", "engines"], "address": {"street": "12 St James's Square", "city": "London", )"
    R"("zip": "12345"}, "verified": true, "score": 98.5})";

struct Setup {
  std::string vocab_label;
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const TokenizerInfo> info;
};

Setup& GetSetup() {
  static Setup* setup = [] {
    auto* s = new Setup();
    const char* cache = std::getenv("LLM_MODELS_CACHE");
    const char* home = std::getenv("HOME");
    const std::string dir = cache ? cache : std::string(home ? home : "") + "/.cache/llm-models";
    // LLM_GRAMMAR_VOCAB: another tokenizer (a model directory or GGUF), e.g. Gemma 3's 262k.
    const char* other = std::getenv("LLM_GRAMMAR_VOCAB");
    const std::string path = other != nullptr ? other : dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDirectory(path);
    s->vocab_label = path.substr(path.rfind('/') + 1);
    if (!tok.ok() && other == nullptr) {
      tok = Tokenizer::FromDirectory(std::string(LLM_TEST_MODELS_DIR) + "/fortune-bpe");
      s->vocab_label = "fortune-bpe (SmolLM2 not fetched)";
    }
    if (!tok.ok()) {
      std::fprintf(stderr, "no vocabulary: %s\n", std::string(tok.status().message()).c_str());
      std::exit(1);
    }
    s->tokenizer = std::move(tok).value();
    // As the scheduler and the workers build it.
    absl::StatusOr<std::shared_ptr<const TokenizerInfo>> info =
        GrammarVocabulary(*s->tokenizer, s->tokenizer->vocab_size());
    if (!info.ok()) {
      std::fprintf(stderr, "vocabulary: %s\n", std::string(info.status().message()).c_str());
      std::exit(1);
    }
    s->info = *std::move(info);
    return s;
  }();
  return *setup;
}

// llama.cpp's grammars/json.gbnf: a user grammar of many small rules (ws, string, number).
constexpr char kJsonGbnf[] = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

GrammarSpec Spec(const std::string& name) {
  if (name == "json_schema") return {GrammarKind::kJsonSchema, kSchema};
  if (name == "json_gbnf") return {GrammarKind::kGrammar, kJsonGbnf};
  if (name == "max_length_20")
    return {GrammarKind::kJsonSchema, R"({"type": "string", "maxLength": 20})"};
  if (name == "max_length_500") {
    return {GrammarKind::kJsonSchema, R"({"type": "string", "maxLength": 500})"};
  }
  return {GrammarKind::kJsonObject};
}

std::shared_ptr<const CompiledGrammar> Compile(const GrammarSpec& spec) {
  absl::StatusOr<Grammar> g = BuildGrammar(spec);
  if (!g.ok()) std::abort();
  return *CompiledGrammar::Compile(*g, GetSetup().info);
}

// One matcher per state along the document: after 0, 1, ..., n tokens.
std::vector<GrammarMatcher> States(const std::shared_ptr<const CompiledGrammar>& g) {
  std::vector<GrammarMatcher> states;
  GrammarMatcher m(g);
  for (TokenId id : GetSetup().tokenizer->Encode(kDocument, false)) {
    states.push_back(m);
    if (!m.AcceptToken(id)) {
      std::fprintf(stderr, "the document leaves the grammar at token %d\n", id);
      std::exit(1);
    }
  }
  states.push_back(m);
  return states;
}

void BM_Mask(benchmark::State& state, std::string name) {
  std::vector<GrammarMatcher> states = States(Compile(Spec(name)));
  std::vector<uint32_t> mask(GetSetup().info->bitmask_words());
  size_t i = 0;
  for (auto _ : state) {
    states[i++ % states.size()].FillNextTokenBitmask(mask.data());
    benchmark::DoNotOptimize(mask.data());
  }
  state.counters["states"] = static_cast<double>(states.size());
}

// The baseline: the same masks by offering every id to AcceptToken.
void BM_BruteForce(benchmark::State& state, std::string name) {
  std::vector<GrammarMatcher> states = States(Compile(Spec(name)));
  std::vector<uint32_t> mask(GetSetup().info->bitmask_words());
  const int32_t vocab = GetSetup().info->vocab_size();
  size_t i = 0;
  for (auto _ : state) {
    GrammarMatcher& m = states[i++ % states.size()];
    std::fill(mask.begin(), mask.end(), 0);
    for (int32_t id = 0; id < vocab; ++id) {
      if (!m.AcceptToken(id)) continue;
      mask[id >> 5] |= uint32_t{1} << (id & 31);
      m.Rollback(1);
    }
    benchmark::DoNotOptimize(mask.data());
  }
}

void BM_Compile(benchmark::State& state, std::string name) {
  const GrammarSpec spec = Spec(name);
  std::shared_ptr<const CompiledGrammar> g;
  for (auto _ : state) {
    g = Compile(spec);
    benchmark::DoNotOptimize(g.get());
  }
  state.counters["positions"] = g->num_precomputed_positions();
  state.counters["uncertain"] = static_cast<double>(g->num_uncertain_tokens());
}

// Keeps each run's time per iteration (microseconds) for the ratios printed at the end.
class RecordingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      us[run.benchmark_name()] =
          run.GetAdjustedRealTime() * (run.time_unit == benchmark::kMillisecond ? 1000.0 : 1.0);
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> us;
};

// The slowest state's mask, each state timed alone (the mean hides a slow state).
double WorstMaskUs(const std::string& name, size_t* worst_state) {
  std::vector<GrammarMatcher> states = States(Compile(Spec(name)));
  std::vector<uint32_t> mask(GetSetup().info->bitmask_words());
  double worst = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      states[i].FillNextTokenBitmask(mask.data());
      best = std::min(
          best,
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    if (best > worst) {
      worst = best;
      *worst_state = i;
    }
  }
  return worst;
}

}  // namespace
}  // namespace llm::structured

int main(int argc, char** argv) {
  using namespace llm::structured;
  const std::vector<std::string> names = {"json_schema", "json_object", "json_gbnf"};
  for (const std::string& name : names) {
    benchmark::RegisterBenchmark(("Mask/" + name).c_str(), BM_Mask, name)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BruteForce/" + name).c_str(), BM_BruteForce, name)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("Compile/" + name).c_str(), BM_Compile, name)
        ->Unit(benchmark::kMillisecond);
  }
  // Bounded repetitions unroll: compile cost grows with the bound up to the longest token.
  for (const std::string name : {"max_length_20", "max_length_500"}) {
    benchmark::RegisterBenchmark(("Compile/" + name).c_str(), BM_Compile, name)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf(
      "\nVocabulary: %s, %d tokens; one core. Masks at each state along a %zu-token JSON "
      "document.\n",
      GetSetup().vocab_label.c_str(), GetSetup().info->vocab_size(),
      GetSetup().tokenizer->Encode(kDocument, false).size());
  for (const std::string& name : names) {
    const double mask = reporter.us["Mask/" + name];
    const double brute = reporter.us["BruteForce/" + name];
    if (mask == 0) continue;
    size_t worst_state = 0;
    const double worst = WorstMaskUs(name, &worst_state);
    std::printf(
        "%-12s mask %8.1f us mean, %8.1f us worst (state %zu) | brute force %10.1f us: %.0fx | "
        "compile %.1f ms\n",
        name.c_str(), mask, worst, worst_state, brute, brute > 0 ? brute / mask : 0.0,
        reporter.us["Compile/" + name] / 1000.0);
  }
  std::printf("compile, string maxLength 20: %.1f ms; maxLength 500: %.1f ms\n",
              reporter.us["Compile/max_length_20"] / 1000.0,
              reporter.us["Compile/max_length_500"] / 1000.0);
  return 0;
}
