// bench_tokenizer: MB/s of Tokenizer::Encode and Decode on about 1 MB of English text (the
// GPL-3 text, repeated), for the Llama 3 style (byte-level BPE with the Llama 3 split
// regex), Llama 2 style (byte fallback, no pre-tokenizer) and Qwen2 style (NFC, Qwen2 split
// regex) fixture tokenizers, and of the
// incremental detokenizer fed one token at a time. Baselines in the same process: the
// normalizer and pre-tokenizer alone (the split regex and byte-level mapping: the part of
// encode that is not BPE) and encode with the word cache disabled; the ratios are printed
// at the end.
//
// Usage: bench_tokenizer [google benchmark flags]. LLM_TOKENIZER_DIR=<model dir> also runs
// the benchmarks for that directory's tokenizer.json (label "custom").
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "scheduler_service/tokenizer/incremental_detokenizer.h"
#include "scheduler_service/tokenizer/normalizer.h"
#include "scheduler_service/tokenizer/pre_tokenizer.h"
#include "scheduler_service/tokenizer/tokenizer.h"

namespace llm {
namespace {

constexpr size_t kTextBytes = 1 << 20;

const std::string& EnglishText() {
  static const std::string* text = [] {
    std::ifstream in(std::string(LLM_TOKENIZER_DATA_DIR) + "/english_sample.txt");
    std::ostringstream ss;
    ss << in.rdbuf();
    const std::string sample = ss.str();
    if (sample.empty()) {
      std::fprintf(stderr, "cannot read english_sample.txt under %s\n", LLM_TOKENIZER_DATA_DIR);
      std::exit(1);
    }
    auto* t = new std::string();
    while (t->size() < kTextBytes) *t += sample;
    return t;
  }();
  return *text;
}

std::shared_ptr<Tokenizer> Load(const std::string& dir) {
  auto tok = Tokenizer::FromDirectory(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tok.status().message()).c_str());
    std::exit(1);
  }
  return std::shared_ptr<Tokenizer>(std::move(tok).value());
}

void BM_Encode(benchmark::State& state, std::shared_ptr<Tokenizer> tok, bool cache) {
  const std::string& text = EnglishText();
  tok->set_cache_capacity(cache ? BpeModel::kDefaultCacheCapacity : 0);
  size_t num_tokens = 0;
  for (auto _ : state) {
    auto ids = tok->Encode(text, false);
    num_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  tok->set_cache_capacity(BpeModel::kDefaultCacheCapacity);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(num_tokens);
}

// The baseline: the tokenizer.json's normalizer and pre-tokenizer alone, streamed as in
// Encode, without added-token matching or the model.
void BM_PreTokenize(benchmark::State& state, std::string dir) {
  std::ifstream in(dir + "/tokenizer.json");
  const nlohmann::json spec = nlohmann::json::parse(in);
  auto normalizer = ParseNormalizer(spec.value("normalizer", nlohmann::json()));
  auto pre_tokenizer = ParsePreTokenizer(spec.value("pre_tokenizer", nlohmann::json()));
  if (!normalizer.ok() || !pre_tokenizer.ok()) {
    state.SkipWithError("cannot parse the normalizer or pre-tokenizer");
    return;
  }
  const std::string& text = EnglishText();
  size_t num_words = 0;
  for (auto _ : state) {
    std::string copy = text;
    if (*normalizer != nullptr) (*normalizer)->Normalize(&copy);
    num_words = 1;
    if (*pre_tokenizer != nullptr) {
      num_words = 0;
      (*pre_tokenizer)->PreTokenize({std::move(copy), true}, [&num_words](PreToken word) {
        benchmark::DoNotOptimize(word.text.data());
        ++num_words;
      });
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["words"] = static_cast<double>(num_words);
}

void BM_Decode(benchmark::State& state, std::shared_ptr<Tokenizer> tok) {
  const std::vector<TokenId> ids = tok->Encode(EnglishText(), false);
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = tok->Decode(ids, true);
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

// One token per Append, as the engine feeds it; on a 64 KB slice.
void BM_DetokenizeIncremental(benchmark::State& state, std::shared_ptr<Tokenizer> tok) {
  const std::vector<TokenId> ids = tok->Encode(EnglishText().substr(0, 1 << 16), false);
  TokenizerDetokenizerFactory factory(tok);
  DetokenizeOptions options;
  options.stop = {"never appears in the text"};
  size_t bytes = 0;
  for (auto _ : state) {
    auto detok = factory.Create({}, options);
    for (const TokenId id : ids) benchmark::DoNotOptimize(detok->Append({&id, 1}));
    detok->Flush();
    bytes = detok->output_text().size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

// Keeps each run's bytes/s for the ratios printed at the end.
class RecordingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      auto it = run.counters.find("bytes_per_second");
      if (it != run.counters.end()) mb_per_s[run.benchmark_name()] = it->second.value / 1e6;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> mb_per_s;
};

void Register(const std::string& label, const std::string& dir) {
  std::shared_ptr<Tokenizer> tok = Load(dir);
  benchmark::RegisterBenchmark(("Encode/" + label).c_str(), BM_Encode, tok, true)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("EncodeNoCache/" + label).c_str(), BM_Encode, tok, false)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("PreTokenizeOnly/" + label).c_str(), BM_PreTokenize, dir)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("Decode/" + label).c_str(), BM_Decode, tok)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("DetokenizeIncremental/" + label).c_str(), BM_DetokenizeIncremental,
                               tok)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  std::vector<std::string> labels = {"llama3_style", "llama2_style", "qwen2_style"};
  for (const std::string& label : labels) {
    llm::Register(label, std::string(LLM_TOKENIZER_DATA_DIR) + "/" + label);
  }
  if (const char* dir = std::getenv("LLM_TOKENIZER_DIR")) {
    llm::Register("custom", dir);
    labels.push_back("custom");
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  llm::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf("\nText: %zu bytes of English (tests/data/tokenizer/english_sample.txt), one core.\n",
              llm::EnglishText().size());
  for (const std::string& label : labels) {
    auto get = [&](const std::string& name) {
      auto it = reporter.mb_per_s.find(name + "/" + label);
      return it == reporter.mb_per_s.end() ? 0.0 : it->second;
    };
    const double encode = get("Encode"), no_cache = get("EncodeNoCache");
    const double pre = get("PreTokenizeOnly"), decode = get("Decode");
    if (encode == 0) continue;
    std::printf(
        "%-13s encode %7.2f MB/s (%s the 5 MB/s target) | decode %7.2f MB/s | "
        "incremental detokenize %6.2f MB/s\n"
        "%-13s encode is %.2fx as fast as encode without the word cache; pre-tokenizing alone "
        "runs at %.2f MB/s, %.0f%% of encode's time\n",
        label.c_str(), encode, encode >= 5.0 ? "meets" : "MISSES", decode,
        get("DetokenizeIncremental"), "", no_cache > 0 ? encode / no_cache : 0.0, pre,
        pre > 0 ? 100.0 * encode / pre : 0.0);
  }
  return 0;
}
