// The real scheduler (EngineCore) drives the real model through the ModelRunner, in one
// process. Greedy output equals transformers' greedy tokens (golden fixtures) for every
// configuration a user can pick: a large pool, a pool so small that requests are preempted
// by recompute or by swap, chunked prefill with a small threshold, prefix caching with
// repeated prompts, and n > 1 with sampling. Afterwards every block is free.
//
// Built twice: for the CPU model (model_runner_test), and with LLM_TEST_ON_CUDA for the model,
// KV cache and sampler on cuda:0 (tests/gpu: emulated as emu.cuda_emu_model_runner_test, and
// on a real device): the same expectations, every configuration, on the GPU worker's path.
#include "worker_service/model_runner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/philox.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/engine/engine_core.h"
#include "scheduler_service/tokenizer/grammar_vocabulary.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "tests/testing/model_test_util.h"
#include "tests/testing/test_data.h"
#include "tests/unit/worker_service/step_test_util.h"
#ifdef LLM_TEST_ON_CUDA
#include "kernels/cuda/device.h"
#include "worker_service/device_sampler.h"
#include "worker_service/model/device_context.h"
#endif

namespace llm {
namespace {

struct Config {
  std::string name;
  int num_gpu_blocks = 256;
  int num_cpu_blocks = 0;
  int block_size = 16;
  PreemptionMode mode = PreemptionMode::kRecompute;
  bool chunked = false;
  int threshold = 0;
  bool prefix_caching = false;
  int max_num_batched_tokens = 512;
  int max_num_seqs = 256;
  TokenId eos_token_id = -1;  // the scheduler ends sequences at it (>= 0)
  bool async_scheduling = false;
};

// The step's logits check: inf, -inf or NaN anywhere (in the first, a middle or the last
// chunk of the scan, or in its tail) is found at its index; finite extremes are not.
TEST(FirstNonFinite, FindsTheFirstInfOrNanWherever) {
  std::vector<float> v(3 * 4096 + 77);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 13) - 6.0f;
  v[5] = std::numeric_limits<float>::max();
  v[6] = -std::numeric_limits<float>::max();
  v[7] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(FirstNonFinite(v), -1);
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{9000}, v.size() - 1}) {
    for (float bad :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<float> w = v;
      w[at] = bad;
      if (at + 3 < w.size()) w[at + 3] = bad;  // a later one is not the first
      EXPECT_EQ(FirstNonFinite(w), static_cast<int64_t>(at)) << at << " " << bad;
    }
  }
  EXPECT_EQ(FirstNonFinite({}), -1);
}

class ModelRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Load("tiny-llama", DType::kF32)); }

  // Loads tests/data/models/<name>: on cpu, or (LLM_TEST_ON_CUDA) on cuda:0 in `dtype`.
  void Load(const std::string& name, DType dtype) {
    dir_ = ::llm::testing::TestDataDir() + "/models/" + name;
    ModelOptions options;
#ifdef LLM_TEST_ON_CUDA
    std::string why_none;
    if (cuda::DeviceCount(&why_none) == 0) GTEST_SKIP() << "no usable CUDA device: " << why_none;
    if (context_ == nullptr) {
      absl::StatusOr<std::unique_ptr<DeviceContext>> ctx =
          DeviceContext::Create(TensorDevice::Cuda(0));
      ASSERT_TRUE(ctx.ok()) << ctx.status();
      context_ = std::move(*ctx);
    }
    options = {context_.get(), dtype};
#endif
    kv_dtype_ = dtype;
    ASSERT_NO_FATAL_FAILURE(LoadTestModel(dir_, &model_, options));
    golden_ = LoadGolden(dir_, model_->vocab_size());
    absl::StatusOr<std::shared_ptr<const structured::TokenizerInfo>> vocabulary =
        LoadGrammarVocabulary(dir_, model_->vocab_size());
    ASSERT_TRUE(vocabulary.ok()) << vocabulary.status();
    grammars_ = std::make_shared<structured::GrammarCache>(*vocabulary);
#ifdef LLM_TEST_ON_CUDA
    DeviceSampler::Options so;
    so.max_rows = kSamplerRows;
    so.vocab_size = model_->vocab_size();
    absl::StatusOr<std::unique_ptr<DeviceSampler>> sampler = DeviceSampler::Create(so);
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    sampler_ = std::move(*sampler);
#endif
  }

  // A KV cache on the model's device.
  std::unique_ptr<CacheEngine> MakeCache(int block_size, int num_gpu_blocks, int num_cpu_blocks) {
    absl::StatusOr<std::unique_ptr<CacheEngine>> cache =
        CacheEngine::Create({model_->num_layers(), model_->num_local_kv_heads(), model_->head_dim(),
                             block_size, kv_dtype_},
                            num_gpu_blocks, std::max(1, num_cpu_blocks), model_->context());
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? std::move(*cache) : nullptr;
  }
  std::unique_ptr<ModelRunner> MakeRunner(CacheEngine* cache) {
    return std::make_unique<ModelRunner>(model_.get(), cache, sampler(), grammars_);
  }

  // Runs `requests` (id -> prompt, params) to completion; returns id -> tokens per sequence.
  // With `new_workers_after` >= 0, the engine moves to new workers (a runner over a cache of
  // its own that knows nothing of the requests) after that many steps, as after a worker
  // failure: the requests resume there, their output so far sent as the sequences' tokens.
  std::map<std::string, std::vector<std::vector<TokenId>>> Run(
      const Config& c, const std::vector<std::pair<std::string, EngineRequest>>& requests,
      SchedulerStats* stats = nullptr, int new_workers_after = -1) {
    std::unique_ptr<CacheEngine> cache =
        MakeCache(c.block_size, c.num_gpu_blocks, c.num_cpu_blocks);
    std::unique_ptr<ModelRunner> runner_owner = MakeRunner(cache.get());
    std::unique_ptr<CacheEngine> new_cache;
    std::unique_ptr<ModelRunner> new_runner;
    SchedulerConfig sc;
    sc.max_num_batched_tokens = c.max_num_batched_tokens;
    sc.max_num_seqs = c.max_num_seqs;
    sc.max_model_len = 512;
    sc.enable_chunked_prefill = c.chunked;
    sc.long_prefill_token_threshold = c.threshold;
    sc.preemption_mode = c.mode;
    sc.eos_token_id = c.eos_token_id;
    BlockSpaceManagerConfig bc{.block_size = c.block_size,
                               .num_gpu_blocks = c.num_gpu_blocks,
                               .num_cpu_blocks = c.num_cpu_blocks,
                               .watermark = 0.0,
                               .enable_prefix_caching = c.prefix_caching};
    EngineCore engine(sc, bc, runner_owner.get());
    engine.set_async_scheduling(c.async_scheduling);
    std::map<std::string, std::vector<std::vector<TokenId>>> out;
    for (const auto& [id, req] : requests) {
      const absl::Status s = engine.AddRequest(req, [&out, id = id](const StreamUpdate& u) {
        ASSERT_TRUE(u.status.ok()) << u.status;
        for (const SequenceOutput& seq : u.outputs->Seqs(*u.output)) {
          auto& tokens = out[id];
          if (static_cast<int>(tokens.size()) <= seq.index) tokens.resize(seq.index + 1);
          const auto t = u.outputs->NewTokenIds(seq);
          tokens[seq.index].insert(tokens[seq.index].end(), t.begin(), t.end());
        }
      });
      EXPECT_TRUE(s.ok()) << s;
    }
    ModelRunner* runner = runner_owner.get();
    if (new_workers_after >= 0) {
      for (int i = 0; i < new_workers_after; ++i) {
        const absl::StatusOr<bool> busy = engine.Step();
        EXPECT_TRUE(busy.ok() && *busy) << busy.status();
      }
      new_cache = MakeCache(c.block_size, c.num_gpu_blocks, c.num_cpu_blocks);
      new_runner = MakeRunner(new_cache.get());
      runner = new_runner.get();
      engine.ReplaceExecutor(runner, bc);
    }
    const absl::Status s = engine.RunUntilIdle();
    EXPECT_TRUE(s.ok()) << s;
    if (stats != nullptr) *stats = engine.scheduler().stats();
    const BlockSpaceManagerStats blocks = engine.scheduler().block_manager().stats();
    EXPECT_EQ(blocks.num_free_gpu_blocks, c.num_gpu_blocks) << c.name;
    EXPECT_EQ(blocks.num_free_cpu_blocks, c.num_cpu_blocks) << c.name;
    EXPECT_EQ(runner->num_requests(), 0) << c.name << ": the workers forgot nothing";
#ifdef LLM_TEST_ON_CUDA
    // The finished requests' penalty slots are free again (the old workers' go with them).
    if (new_workers_after < 0) EXPECT_EQ(sampler_->free_penalty_slots(), kSamplerRows) << c.name;
#endif
    return out;
  }

  // The golden prompts, greedy, as many new tokens as transformers produced.
  std::vector<std::pair<std::string, EngineRequest>> GoldenRequests(int copies = 1) {
    std::vector<std::pair<std::string, EngineRequest>> reqs;
    for (int c = 0; c < copies; ++c) {
      for (size_t p = 0; p < golden_.ids.size(); ++p) {
        EngineRequest r;
        r.request_id = "p" + std::to_string(p) + "-" + std::to_string(c);
        r.prompt_token_ids.assign(golden_.ids[p].begin(),
                                  golden_.ids[p].begin() + golden_.prompt_lens[p]);
        r.sampling_params.temperature = 0;
        r.sampling_params.ignore_eos = true;
        r.sampling_params.max_tokens =
            static_cast<int>(golden_.ids[p].size()) - golden_.prompt_lens[p];
        reqs.push_back({r.request_id, r});
      }
    }
    return reqs;
  }

  void ExpectGolden(const std::map<std::string, std::vector<std::vector<TokenId>>>& out,
                    const std::string& config, const std::vector<int>& prompts = {0, 1, 2, 3}) {
    for (const auto& [id, seqs] : out) {
      if (id[0] != 'p') continue;  // not a golden prompt
      const int p = id[1] - '0';
      if (std::find(prompts.begin(), prompts.end(), p) == prompts.end()) continue;
      const std::vector<TokenId> want(golden_.ids[p].begin() + golden_.prompt_lens[p],
                                      golden_.ids[p].end());
      ASSERT_EQ(seqs.size(), 1u);
      EXPECT_EQ(seqs[0], want) << config << ": request " << id;
    }
  }

#ifdef LLM_TEST_ON_CUDA
  static constexpr int kSamplerRows = 256;
  std::unique_ptr<DeviceContext> context_;
  std::unique_ptr<DeviceSampler> sampler_;
  DeviceSampler* sampler() { return sampler_.get(); }
#else
  DeviceSampler* sampler() { return nullptr; }  // the CPU model samples on the host
#endif
  std::string dir_;
  std::shared_ptr<structured::GrammarCache> grammars_;
  DType kv_dtype_ = DType::kF32;
  std::unique_ptr<LlamaModel> model_;
  Golden golden_;
};

TEST_F(ModelRunnerTest, GreedyOutputIsTransformersInEveryConfiguration) {
  const std::vector<Config> configs = {
      {.name = "large pool"},
      {.name = "block size 1", .num_gpu_blocks = 1024, .block_size = 1},
      // Blocks of 4: the prompts (6, 26, 42, 33 tokens) + 6 new take 3 + 8 + 12 + 10 blocks
      // at most; with 20, admitted requests outgrow the pool and are preempted.
      {.name = "recompute", .num_gpu_blocks = 20, .block_size = 4},
      {.name = "swap",
       .num_gpu_blocks = 20,
       .num_cpu_blocks = 64,
       .block_size = 4,
       .mode = PreemptionMode::kSwap},
      {.name = "chunked prefill", .chunked = true, .threshold = 5, .max_num_batched_tokens = 16},
      {.name = "chunked + swap",
       .num_gpu_blocks = 20,
       .num_cpu_blocks = 64,
       .block_size = 4,
       .mode = PreemptionMode::kSwap,
       .chunked = true,
       .threshold = 7,
       .max_num_batched_tokens = 24},
  };
  for (const Config& c : configs) {
    SchedulerStats stats;
    const auto out = Run(c, GoldenRequests(), &stats);
    ASSERT_EQ(out.size(), 4u) << c.name;
    ExpectGolden(out, c.name);
    if (c.num_gpu_blocks == 20) EXPECT_GT(stats.num_preemptions, 0) << c.name;
  }
}

// The mixtures of experts through the engine (on cpu, and with LLM_TEST_ON_CUDA on cuda in f32):
// greedy output is transformers' with preemption (recompute and swap), chunked prefill and
// prefix caching, each step's tokens routed together whatever the batch holds.
TEST_F(ModelRunnerTest, MixturesOfExpertsAreTransformersGreedyThroughPreemptionChunksAndCaching) {
  const std::vector<Config> configs = {
      {.name = "recompute", .num_gpu_blocks = 20, .block_size = 4},
      {.name = "swap",
       .num_gpu_blocks = 20,
       .num_cpu_blocks = 64,
       .block_size = 4,
       .mode = PreemptionMode::kSwap},
      {.name = "chunked prefill", .chunked = true, .threshold = 5, .max_num_batched_tokens = 16},
      {.name = "prefix caching", .block_size = 4, .prefix_caching = true, .max_num_seqs = 4},
  };
  for (const char* name : {"tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe"}) {
    ASSERT_NO_FATAL_FAILURE(Load(name, DType::kF32));
    for (const Config& c : configs) {
      SchedulerStats stats;
      const auto out = Run(c, GoldenRequests(c.prefix_caching ? 2 : 1), &stats);
      ASSERT_EQ(out.size(), c.prefix_caching ? 8u : 4u) << name << " " << c.name;
      ExpectGolden(out, std::string(name) + " " + c.name);
      if (c.num_gpu_blocks == 20) EXPECT_GT(stats.num_preemptions, 0) << name << " " << c.name;
      if (c.prefix_caching) EXPECT_GT(stats.prefix_cache_hit_rate, 0.0) << name;
    }
  }
}

TEST_F(ModelRunnerTest, PrefixCachingServesRepeatsWithTheSameOutput) {
  // Two rounds; 4 sequences at a time, so the second round is admitted after the first has
  // computed (and cached) its prompts.
  Config c{.name = "prefix caching", .block_size = 4, .prefix_caching = true, .max_num_seqs = 4};
  SchedulerStats stats;
  auto reqs = GoldenRequests(2);
  const auto out = Run(c, reqs, &stats);
  ASSERT_EQ(out.size(), 8u);
  ExpectGolden(out, c.name);
  EXPECT_GT(stats.prefix_cache_hit_rate, 0.0);
}

TEST_F(ModelRunnerTest, SampledSequencesAreReproducibleAcrossConfigurations) {
  // n = 3 with a seed: the same three sequences with a large pool and with preemption by
  // swap and chunking (sequence j always draws from its own seeded stream).
  EngineRequest r;
  r.request_id = "n3";
  r.prompt_token_ids.assign(golden_.ids[2].begin(),
                            golden_.ids[2].begin() + golden_.prompt_lens[2]);
  r.sampling_params.n = 3;
  r.sampling_params.temperature = 0.9;
  r.sampling_params.top_k = 20;
  r.sampling_params.seed = 5;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.max_tokens = 12;
  std::vector<std::pair<std::string, EngineRequest>> reqs = {{"n3", r}};
  auto more = GoldenRequests();
  reqs.insert(reqs.end(), more.begin(), more.end());
  const auto big = Run({.name = "large"}, reqs);
  const auto small = Run({.name = "small swap",
                          .num_gpu_blocks = 14,
                          .num_cpu_blocks = 64,
                          .block_size = 8,
                          .mode = PreemptionMode::kSwap,
                          .chunked = true,
                          .threshold = 5,
                          .max_num_batched_tokens = 16},
                         reqs);
  ASSERT_EQ(big.at("n3").size(), 3u);
  EXPECT_EQ(big.at("n3"), small.at("n3"));
  EXPECT_NE(big.at("n3")[0], big.at("n3")[1]);  // the sequences differ from one another
  for (const auto& seq : big.at("n3")) EXPECT_EQ(seq.size(), 12u);
}

// Penalties on every request below: each sequence's output counts and, for the repetition
// penalty, its prompt's tokens move its logits; and logit biases, the request's own, so that
// forked, preempted and resumed sequences are checked to keep them.
SamplingParams PenalizedSampling(uint64_t seed, int n, int max_tokens) {
  SamplingParams p;
  p.n = n;
  p.temperature = 0.9;
  p.top_k = 20;
  p.seed = seed;
  p.repetition_penalty = 1.3;
  p.frequency_penalty = 0.4;
  p.presence_penalty = 0.3;
  p.logit_bias = {{3, 2.5f}, {5, -100.0f}, {11, 1.0f}};
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  return p;
}

// Sequence j of a request with n > 1 forks at the first sample: it draws from the stream keyed
// by (seed, j), from counter 0, with its own output counts and the request's prompt. So it
// samples what a request with n = 1 and seed philox::SequenceKey(seed, j) samples.
TEST_F(ModelRunnerTest, ForkedSequencesSampleAsRequestsSeededWithTheirOwnKey) {
  const std::vector<TokenId> prompt(golden_.ids[1].begin(),
                                    golden_.ids[1].begin() + golden_.prompt_lens[1]);
  std::vector<std::pair<std::string, EngineRequest>> reqs;
  EngineRequest forked;
  forked.request_id = "n3";
  forked.prompt_token_ids = prompt;
  forked.sampling_params = PenalizedSampling(5, 3, 10);
  reqs.push_back({"n3", forked});
  for (int j = 0; j < 3; ++j) {
    EngineRequest single;
    single.request_id = "seq" + std::to_string(j);
    single.prompt_token_ids = prompt;
    single.sampling_params = PenalizedSampling(philox::SequenceKey(5, j), 1, 10);
    reqs.push_back({single.request_id, single});
  }
  for (const Config& c :
       {Config{.name = "large", .block_size = 8}, Config{.name = "swap",
                                                  .num_gpu_blocks = 24,
                                                  .num_cpu_blocks = 64,
                                                  .block_size = 4,
                                                  .mode = PreemptionMode::kSwap}}) {
    const auto out = Run(c, reqs);
    ASSERT_EQ(out.at("n3").size(), 3u) << c.name;
    for (int j = 0; j < 3; ++j) {
      const std::vector<TokenId>& alone = out.at("seq" + std::to_string(j)).at(0);
      EXPECT_EQ(alone.size(), 10u) << c.name;
      EXPECT_EQ(out.at("n3")[j], alone) << c.name << ": sequence " << j;
    }
    EXPECT_NE(out.at("n3")[0], out.at("n3")[1]) << c.name;
    for (const auto& [id, seqs] : out) {
      for (const auto& seq : seqs) {
        EXPECT_EQ(std::count(seq.begin(), seq.end(), 5), 0) << c.name << " " << id;  // -100
      }
    }
  }
}

// Workers that take over a request get its output as the sequences' tokens: they go on from the
// same Philox counter and the same penalty counts as the workers that ran it so far, so the
// streams are those of a run that never moved.
TEST_F(ModelRunnerTest, RequestsResumedOnNewWorkersSampleAsIfTheyNeverLeft) {
  std::vector<std::pair<std::string, EngineRequest>> reqs;
  for (int p = 0; p < 3; ++p) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(p);
    r.prompt_token_ids.assign(golden_.ids[p].begin(),
                              golden_.ids[p].begin() + golden_.prompt_lens[p]);
    r.sampling_params = PenalizedSampling(11 + p, p == 2 ? 2 : 1, 14);
    reqs.push_back({r.request_id, r});
  }
  const Config c{.name = "large", .block_size = 8};
  const auto undisturbed = Run(c, reqs);
  for (const int after : {2, 6}) {
    const auto moved = Run(c, reqs, nullptr, /*new_workers_after=*/after);
    EXPECT_EQ(moved, undisturbed) << "moved after " << after << " steps";
  }
#ifdef LLM_TEST_ON_CUDA
  // The workers left behind gave their penalty slots back when they went.
  EXPECT_EQ(sampler_->free_penalty_slots(), kSamplerRows);
#endif
  EXPECT_EQ(undisturbed.at("r2").size(), 2u);
  for (const auto& [id, seqs] : undisturbed) {
    for (const auto& seq : seqs) {
      EXPECT_EQ(seq.size(), 14u) << id;
      EXPECT_EQ(std::count(seq.begin(), seq.end(), 5), 0) << id;  // logit_bias -100
    }
  }
}

// Structured outputs on the real model (its byte-level BPE vocabulary): a regex under greedy
// decoding, a JSON schema with n = 3 sampled and a choice, beside unconstrained greedy requests.
// Every constrained sequence ends at EOS with a whole sentence of its language, and each is the
// same whether the pool is large, small enough to preempt by swap or by recompute (with chunked
// prefill), the steps are planned ahead (asynchronous scheduling), or the requests move to new
// workers mid-way (their matchers replay the output); the unconstrained ones stay transformers'.
TEST_F(ModelRunnerTest, StructuredOutputsHoldAcrossPreemptionForksAndNewWorkers) {
  const std::string kRegex = "(red|green|blue)( (red|green|blue)){1,3}\\.";
  const std::vector<std::string> kChoices = {"alpha", "beta gamma", "delta"};
  auto request = [&](const std::string& id, int prompt, StructuredOutputParams so) {
    EngineRequest r;
    r.request_id = id;
    r.prompt_token_ids.assign(golden_.ids[prompt].begin(),
                              golden_.ids[prompt].begin() + golden_.prompt_lens[prompt]);
    r.sampling_params.max_tokens = 48;
    r.sampling_params.structured = std::move(so);
    return r;
  };
  using Kind = StructuredOutputParams::Kind;
  EngineRequest re = request("re", 0, {.kind = Kind::kRegex, .text = kRegex});
  re.sampling_params.temperature = 0;
  EngineRequest json =
      request("json", 1,
              {.kind = Kind::kJsonSchema,
               .text = R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                   "maximum": 999}, "b": {"enum": ["x", "yy"]}}, "required": ["a", "b"]})"});
  json.sampling_params.n = 3;
  json.sampling_params.temperature = 1.0;
  json.sampling_params.seed = 5;
  EngineRequest choice = request("choice", 2, {.kind = Kind::kChoice, .choices = kChoices});
  choice.sampling_params.temperature = 0.8;
  choice.sampling_params.seed = 9;
  std::vector<std::pair<std::string, EngineRequest>> reqs = {
      {"re", re}, {"json", json}, {"choice", choice}};
  auto golden = GoldenRequests();
  reqs.insert(reqs.end(), golden.begin(), golden.end());

  const TokenId eos = 1;  // <|end_of_text|>
  const auto large = Run({.name = "large", .eos_token_id = eos}, reqs);
  ExpectGolden(large, "large");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDirectory(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto text = [&](const std::vector<TokenId>& seq) {
    EXPECT_FALSE(seq.empty());
    EXPECT_EQ(seq.back(), eos) << "ended by EOS, complete";
    return (*tok)->Decode(std::span<const TokenId>(seq.data(), seq.size() - 1));
  };
  EXPECT_TRUE(std::regex_match(text(large.at("re")[0]), std::regex(kRegex)))
      << text(large.at("re")[0]);
  ASSERT_EQ(large.at("json").size(), 3u);
  for (const auto& seq : large.at("json")) {
    const nlohmann::json j = nlohmann::json::parse(text(seq));
    ASSERT_TRUE(j.is_object() && j.size() == 2 && j["a"].is_number_integer()) << j;
    EXPECT_TRUE(j["a"] >= 0 && j["a"] <= 999) << j;
    EXPECT_TRUE(j["b"] == "x" || j["b"] == "yy") << j;
  }
  EXPECT_NE(large.at("json")[0], large.at("json")[1]);
  const std::string c = text(large.at("choice")[0]);
  EXPECT_NE(std::find(kChoices.begin(), kChoices.end(), c), kChoices.end()) << c;

  const Config small{.name = "small swap",
                     .num_gpu_blocks = 14,
                     .num_cpu_blocks = 64,
                     .block_size = 8,
                     .mode = PreemptionMode::kSwap,
                     .chunked = true,
                     .threshold = 5,
                     .max_num_batched_tokens = 16,
                     .eos_token_id = eos};
  SchedulerStats stats;
  EXPECT_EQ(Run(small, reqs, &stats), large);
  EXPECT_GT(stats.num_preemptions, 0);
  Config recompute = small;
  recompute.name = "small recompute";
  recompute.mode = PreemptionMode::kRecompute;
  EXPECT_EQ(Run(recompute, reqs, &stats), large);
  EXPECT_GT(stats.num_preemptions, 0);
  EXPECT_EQ(Run({.name = "async", .eos_token_id = eos, .async_scheduling = true}, reqs), large);
  EXPECT_EQ(Run({.name = "moved", .eos_token_id = eos}, reqs, nullptr, /*new_workers_after=*/4),
            large);
}

TEST_F(ModelRunnerTest, ForkedSequencesWithTopK1AreAllTransformersGreedy) {
  // n = 3 with top_k = 1 is greedy three times: the children forked after the prefill share
  // its blocks, and copy-on-write must give each its own copy of the partial last block.
  std::vector<std::pair<std::string, EngineRequest>> reqs;
  for (size_t p = 0; p < golden_.ids.size(); ++p) {
    EngineRequest r;
    r.request_id = "p" + std::to_string(p);
    r.prompt_token_ids.assign(golden_.ids[p].begin(),
                              golden_.ids[p].begin() + golden_.prompt_lens[p]);
    r.sampling_params.n = 3;
    r.sampling_params.top_k = 1;
    r.sampling_params.seed = 1;
    r.sampling_params.ignore_eos = true;
    r.sampling_params.max_tokens = static_cast<int>(golden_.ids[p].size()) - golden_.prompt_lens[p];
    reqs.push_back({r.request_id, r});
  }
  for (const Config& c :
       {Config{.name = "large", .block_size = 8}, Config{.name = "swap",
                                                  .num_gpu_blocks = 40,
                                                  .num_cpu_blocks = 128,
                                                  .block_size = 4,
                                                  .mode = PreemptionMode::kSwap}}) {
    SchedulerStats stats;
    const auto out = Run(c, reqs, &stats);
    ASSERT_EQ(out.size(), 4u) << c.name;
    for (const auto& [id, seqs] : out) {
      const int p = id[1] - '0';
      const std::vector<TokenId> want(golden_.ids[p].begin() + golden_.prompt_lens[p],
                                      golden_.ids[p].end());
      ASSERT_EQ(seqs.size(), 3u);
      for (const auto& seq : seqs) EXPECT_EQ(seq, want) << c.name << ": request " << id;
    }
  }
}

TEST_F(ModelRunnerTest, MalformedStepsAreRejectedWithoutChangingState) {
  std::unique_ptr<CacheEngine> cache = MakeCache(16, 8, 1);
  std::unique_ptr<ModelRunner> runner_owner = MakeRunner(cache.get());
  ModelRunner& runner = *runner_owner;
  SamplingParams params;
  const std::vector<TokenId> prompt{5, 6, 7};
  SchedulerOutput step = OnePrefillStep("r", prompt, params, {9});  // outside the 8-block cache
  ModelOutput out;
  absl::Status s = runner.Execute(step, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block id 9"), std::string::npos) << s;
  EXPECT_EQ(runner.num_requests(), 0);

  step.block_ids = {2};
  step.new_requests[0].num_scheduled_tokens = 20;  // more than one block of 16 holds
  s = runner.Execute(step, &out);
  EXPECT_NE(s.message().find("computing up to token 20"), std::string::npos) << s;

  step.new_requests[0].num_scheduled_tokens = 3;
  step.new_requests[0].num_samples = 2;  // one sequence, n = 1
  s = runner.Execute(step, &out);
  EXPECT_NE(s.message().find("2 samples for 1 sequences"), std::string::npos) << s;
  EXPECT_EQ(runner.num_requests(), 0);

  step.new_requests[0].num_samples = 1;
  ASSERT_TRUE(runner.Execute(step, &out).ok());
  ASSERT_EQ(out.sampled_token_ids.size(), 1u);
  s = runner.Execute(step, &out);  // the same request again as new
  EXPECT_NE(s.message().find("already known"), std::string::npos) << s;
  SchedulerOutput unknown;
  unknown.cached_requests.push_back({.slot = 7, .request_id = "ghost"});
  s = runner.Execute(unknown, &out);
  EXPECT_NE(s.message().find("unknown to this worker"), std::string::npos) << s;
}

// A block pair out of range is refused before anything changes: the finished slots listed
// with it are still there, and nothing was swapped.
TEST_F(ModelRunnerTest, ABadBlockPairRejectsTheStepBeforeFinishedSlotsGo) {
  std::unique_ptr<CacheEngine> cache = MakeCache(16, 8, 1);
  std::unique_ptr<ModelRunner> runner_owner = MakeRunner(cache.get());
  ModelRunner& runner = *runner_owner;
  SamplingParams params;
  const std::vector<TokenId> prompt{5, 6, 7};
  SchedulerOutput step = OnePrefillStep("r", prompt, params, {2});
  ModelOutput out;
  ASSERT_TRUE(runner.Execute(step, &out).ok());
  ASSERT_EQ(runner.num_requests(), 1);

  for (const char* list : {"swap-in", "copy"}) {
    SchedulerOutput bad;
    bad.step_id = 2;
    bad.finished_slots = {0};
    bad.blocks_to_swap_out = {{.src = 3, .dst = 0}};  // valid on its own
    if (std::string(list) == "swap-in") {
      bad.blocks_to_swap_in = {{.src = 5, .dst = 3}};  // the host has 1 block
    } else {
      bad.blocks_to_copy = {{.src = 0, .dst = 8}};  // the device has 8
    }
    const absl::Status s = runner.Execute(bad, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(list), std::string::npos) << s;
    EXPECT_EQ(runner.num_requests(), 1) << list;
  }
}

TEST_F(ModelRunnerTest, LogprobsReachTheStreamsOfTheRequestsThatAskForThem) {
  std::unique_ptr<CacheEngine> cache = MakeCache(16, 64, 1);
  std::unique_ptr<ModelRunner> runner_owner = MakeRunner(cache.get());
  ModelRunner& runner = *runner_owner;
  SchedulerConfig sc;
  sc.max_model_len = 512;
  sc.max_num_batched_tokens = 512;
  EngineCore engine(sc, {.block_size = 16, .num_gpu_blocks = 64, .num_cpu_blocks = 0}, &runner);
  struct Seen {
    std::vector<TokenId> tokens;
    std::vector<SampleLogprobs> logprobs;
  };
  std::map<std::string, Seen> seen;
  for (const char* id : {"with", "without"}) {
    EngineRequest r;
    r.request_id = id;
    r.prompt_token_ids.assign(golden_.ids[0].begin(),
                              golden_.ids[0].begin() + golden_.prompt_lens[0]);
    r.sampling_params.temperature = 0;
    r.sampling_params.ignore_eos = true;
    r.sampling_params.max_tokens = 5;
    if (std::string(id) == "with") r.sampling_params.logprobs = 3;
    ASSERT_TRUE(engine
                    .AddRequest(r,
                                [&seen, id = std::string(id)](const StreamUpdate& u) {
                                  ASSERT_TRUE(u.status.ok()) << u.status;
                                  for (const SequenceOutput& s : u.outputs->Seqs(*u.output)) {
                                    for (uint32_t k = 0; k < s.new_token_ids.size; ++k) {
                                      const uint32_t at = s.new_token_ids.begin + k;
                                      seen[id].tokens.push_back(u.outputs->token_ids[at]);
                                      if (!u.outputs->logprobs.empty()) {
                                        seen[id].logprobs.push_back(u.outputs->logprobs[at]);
                                      }
                                    }
                                  }
                                })
                    .ok());
  }
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  const Seen& with = seen["with"];
  ASSERT_EQ(with.tokens.size(), 5u);
  ASSERT_EQ(with.logprobs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const SampleLogprobs& lp = with.logprobs[i];
    ASSERT_EQ(lp.top.size(), 3u);
    // Greedy: the sampled token is the most likely one, and the top list is in order.
    EXPECT_EQ(lp.top[0].first, with.tokens[i]);
    EXPECT_FLOAT_EQ(lp.logprob, lp.top[0].second);
    EXPECT_LE(lp.top[0].second, 0.0f);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[1].second, lp.top[2].second);
  }
  // The other request of the same steps got placeholders, not someone else's numbers.
  for (const SampleLogprobs& lp : seen["without"].logprobs) EXPECT_TRUE(lp.top.empty());
  EXPECT_EQ(seen["without"].tokens, with.tokens);
}

#ifdef LLM_TEST_ON_CUDA
// Decode steps from CUDA graphs (captured per padded batch size, replayed over static inputs)
// give the tokens of eager steps, greedy and seeded, with preemption by swap in the mix.
TEST_F(ModelRunnerTest, CudaGraphsGiveTheSameTokensAsEagerSteps) {
  ASSERT_EQ(model_->Reserve(512, 256, 512), absl::OkStatus());
  auto reqs = GoldenRequests();
  EngineRequest sampled;
  sampled.request_id = "n3";
  sampled.prompt_token_ids.assign(golden_.ids[2].begin(),
                                  golden_.ids[2].begin() + golden_.prompt_lens[2]);
  sampled.sampling_params.n = 3;
  sampled.sampling_params.temperature = 0.9;
  sampled.sampling_params.seed = 5;
  sampled.sampling_params.ignore_eos = true;
  sampled.sampling_params.max_tokens = 12;
  reqs.push_back({"n3", sampled});
  for (const Config& c : {Config{.name = "large pool"}, Config{.name = "swap",
                                                        .num_gpu_blocks = 24,
                                                        .num_cpu_blocks = 64,
                                                        .block_size = 4,
                                                        .mode = PreemptionMode::kSwap}}) {
    model_->EnableCudaGraphs(0);
    const auto eager = Run(c, reqs);
    model_->EnableCudaGraphs(256);
    const int64_t replays = model_->graph_replays();
    const auto graphed = Run(c, reqs);
    EXPECT_GT(model_->graph_replays(), replays) << c.name;
    EXPECT_GT(model_->num_graphs(), 0) << c.name;
    EXPECT_EQ(graphed, eager) << c.name;
    ExpectGolden(graphed, c.name, {0, 1, 2, 3});
  }
  model_->EnableCudaGraphs(0);
}

// bf16 on cuda: greedy tokens equal transformers' (fp32) where they must: for the prompts whose
// smallest top-2 margin along the golden path exceeds twice the bf16 model's logit error bound
// (4e-2 of the row's largest |logit|: cuda_model_test.cc's tolerance, observed 2.1e-2 for
// tiny-qwen2), a bf16 rounding cannot flip the argmax. The margins are asserted, so the test
// cannot pass by choosing no prompt.
TEST_F(ModelRunnerTest, Bf16GreedyIsTransformersWhereTheTop2MarginExceedsTheBf16Error) {
  ASSERT_NO_FATAL_FAILURE(Load("tiny-qwen2", DType::kBF16));
  const int vocab = model_->vocab_size();
  std::vector<int> safe;
  for (size_t p = 0; p < golden_.ids.size(); ++p) {
    double margin = 1e9, largest = 0;
    for (size_t r = golden_.prompt_lens[p] - 1; r + 1 < golden_.ids[p].size(); ++r) {
      std::vector<float> row(golden_.logits[p].begin() + r * vocab,
                             golden_.logits[p].begin() + (r + 1) * vocab);
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
      margin = std::min<double>(margin, row[0] - row[1]);
      for (float v : row) largest = std::max<double>(largest, std::fabs(v));
    }
    if (margin > 2 * 4e-2 * largest) safe.push_back(static_cast<int>(p));
  }
  ASSERT_FALSE(safe.empty()) << "no golden prompt has a top-2 margin above the bf16 error";
  for (const Config& c : {Config{.name = "bf16 large pool"}, Config{.name = "bf16 swap",
                                                             .num_gpu_blocks = 20,
                                                             .num_cpu_blocks = 64,
                                                             .block_size = 4,
                                                             .mode = PreemptionMode::kSwap,
                                                             .chunked = true,
                                                             .threshold = 5,
                                                             .max_num_batched_tokens = 16}}) {
    const auto out = Run(c, GoldenRequests());
    ASSERT_EQ(out.size(), 4u) << c.name;
    ExpectGolden(out, c.name, safe);
  }
  std::printf("bf16 greedy checked on %zu of %zu prompts\n", safe.size(), golden_.ids.size());
}
#endif

}  // namespace
}  // namespace llm
