// Test helpers for the model: transformers' golden fixtures, a poisoned paged KV cache, a
// driver that feeds the golden sequences through the model in chunks, and one sequence fed in
// chunks (ChunkedSequence).
#ifndef LLM_TESTS_TESTING_MODEL_TEST_UTIL_H_
#define LLM_TESTS_TESTING_MODEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model/llama.h"

namespace llm {

struct Golden {
  std::vector<std::vector<int32_t>> ids;   // per prompt: prompt + greedy tokens
  std::vector<std::vector<float>> logits;  // per prompt: [ids.size(), vocab]
  std::vector<int> prompt_lens;
};

inline Golden LoadGolden(const std::string& dir, int vocab) {
  Golden g;
  auto file = SafetensorsFile::Open(dir + "/golden.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return g;
  for (absl::string_view len : absl::StrSplit((*file)->metadata().at("prompt_lens"), ',')) {
    int n = 0;
    EXPECT_TRUE(absl::SimpleAtoi(len, &n));
    g.prompt_lens.push_back(n);
  }
  for (size_t p = 0; p < g.prompt_lens.size(); ++p) {
    const StTensorInfo* ids = (*file)->Find("p" + std::to_string(p) + ".ids");
    const StTensorInfo* logits = (*file)->Find("p" + std::to_string(p) + ".logits");
    EXPECT_TRUE(ids != nullptr && logits != nullptr);
    std::vector<int32_t> v(ids->numel());
    std::memcpy(v.data(), (*file)->Bytes(*ids).data(), ids->nbytes);
    std::vector<float> l(logits->numel());
    EXPECT_TRUE(ReadAsF32(**file, *logits, l).ok());
    EXPECT_EQ(logits->shape[1], vocab);
    g.ids.push_back(std::move(v));
    g.logits.push_back(std::move(l));
  }
  return g;
}

// A KV cache for all layers, poisoned: host tensors for a cpu model, a CacheEngine (kv_dtype)
// on the model's device otherwise.
struct Cache {
  Cache(const LlamaModel& m, int num_blocks, int block_size, DType kv_dtype = DType::kF32)
      : block_size(block_size) {
    if (m.device().is_cuda()) {
      absl::StatusOr<std::unique_ptr<CacheEngine>> created = CacheEngine::Create(
          {m.num_layers(), m.num_local_kv_heads(), m.head_dim(), block_size, kv_dtype}, num_blocks,
          1, m.context());
      EXPECT_TRUE(created.ok()) << created.status();
      if (created.ok()) {
        engine = std::move(*created);
        layers.assign(engine->device_caches().begin(), engine->device_caches().end());
      }
    }
    for (int l = 0; l < m.num_layers() && engine == nullptr; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        HostTensor t(kv_dtype, {num_blocks, block_size, m.num_local_kv_heads(), m.head_dim()});
        // Poison: all-ones bytes are NaN in f32 and bf16.
        std::memset(t.data<char>(), 0xFF, t.numel() * DTypeSize(kv_dtype));
        tensors.push_back(std::move(t));
      }
      layers.push_back({tensors[2 * l].view(), tensors[2 * l + 1].view()});
    }
    // Blocks handed out in a random order, so that no sequence is contiguous.
    free.resize(num_blocks);
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), std::mt19937(7));
  }
  int block_size;
  std::unique_ptr<CacheEngine> engine;
  std::vector<HostTensor> tensors;
  std::vector<LayerKvCache> layers;
  std::vector<int32_t> free;
};

struct Seq {
  const std::vector<int32_t>* ids;
  int done = 0;  // tokens computed so far
  std::vector<int32_t> blocks;
};

// Relative error of one row: max |a - b| / max |b|.
inline double RowError(const float* a, const float* b, int n) {
  double diff = 0, scale = 0;
  for (int i = 0; i < n; ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

// Feeds every golden sequence through the model in steps: each step takes a chunk of
// chunk(rng) tokens from every unfinished sequence (so prefill chunks and single decode
// tokens mix), and checks every row's logits against transformers'. Returns the worst error.
// When `all_logits` is given, every row's logits are appended to it in step order, and when
// `row_errors` is, every row's RowError.
// `tolerance` bounds each row's RowError; kv_dtype is the cache's (device models).
template <typename ChunkFn>
double RunAndCompare(LlamaModel& model, const Golden& g, int block_size, ChunkFn chunk,
                     std::vector<float>* all_logits = nullptr, double tolerance = 1e-4,
                     DType kv_dtype = DType::kF32, std::vector<double>* row_errors = nullptr) {
  const int vocab = model.vocab_size();
  Cache cache(model, 256, block_size, kv_dtype);
  std::vector<Seq> seqs;
  for (const auto& ids : g.ids) seqs.push_back({&ids});
  std::mt19937 rng(42);
  double worst = 0;
  for (int step = 0; step < 1000; ++step) {
    std::vector<int32_t> tokens, positions, seq_lens, qsl{0}, rows;
    std::vector<int64_t> slots;
    std::vector<std::pair<int, int>> origin;  // (sequence, position) of each row
    std::vector<int> active;
    for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
      Seq& q = seqs[s];
      const int total = static_cast<int>(q.ids->size());
      if (q.done == total) continue;
      const int n = std::min(total - q.done, chunk(rng));
      while (static_cast<int>(q.blocks.size()) * block_size < q.done + n) {
        q.blocks.push_back(cache.free.back());
        cache.free.pop_back();
      }
      for (int i = q.done; i < q.done + n; ++i) {
        rows.push_back(static_cast<int32_t>(tokens.size()));
        origin.push_back({s, i});
        tokens.push_back((*q.ids)[i]);
        positions.push_back(i);
        slots.push_back(static_cast<int64_t>(q.blocks[i / block_size]) * block_size +
                        i % block_size);
      }
      q.done += n;
      seq_lens.push_back(q.done);
      qsl.push_back(static_cast<int32_t>(tokens.size()));
      active.push_back(s);
    }
    if (active.empty()) break;
    int max_blocks = 0;
    for (int s : active) max_blocks = std::max<int>(max_blocks, seqs[s].blocks.size());
    std::vector<int32_t> tables(active.size() * max_blocks, 0);
    for (size_t a = 0; a < active.size(); ++a) {
      std::copy(seqs[active[a]].blocks.begin(), seqs[active[a]].blocks.end(),
                tables.begin() + a * max_blocks);
    }
    ForwardInput in{tokens, positions, slots, tables, max_blocks, seq_lens, qsl, rows};
    HostTensor logits;
    const absl::Status st = model.Forward(in, cache.layers, &logits);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return 1e9;
    if (all_logits != nullptr) {
      all_logits->insert(all_logits->end(), logits.data<float>(),
                         logits.data<float>() + logits.numel());
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto [s, pos] = origin[r];
      const double err = RowError(logits.data<float>() + r * vocab,
                                  g.logits[s].data() + static_cast<size_t>(pos) * vocab, vocab);
      worst = std::max(worst, err);
      if (row_errors != nullptr) row_errors->push_back(err);
      EXPECT_LT(err, tolerance) << "prompt " << s << " position " << pos;
    }
  }
  return worst;
}

// One sequence fed through a model in chunks of up to `chunk` tokens over a NaN-poisoned paged
// Cache of its own, whose blocks it takes in the cache's shuffled order. Feed(ids) runs `ids`
// after the tokens fed before and returns the logits ([rows][vocab]) of its tokens at positions
// from `first_logits_position` on (by default only the last token's); empty after a failed
// Forward, which fails the test.
class ChunkedSequence {
 public:
  ChunkedSequence(LlamaModel& model, int max_tokens, int block_size = 16, int chunk = 200)
      : model_(model),
        block_size_(block_size),
        chunk_(chunk),
        cache_(model, (max_tokens + block_size - 1) / block_size, block_size),
        blocks_(cache_.free.rbegin(), cache_.free.rend()) {}

  std::vector<float> Feed(const std::vector<int32_t>& ids, int first_logits_position = -1) {
    const int end = done_ + static_cast<int>(ids.size());
    const int first = first_logits_position < 0 ? end - 1 : first_logits_position;
    std::vector<float> out;
    for (size_t at = 0; at < ids.size();) {
      const int n = static_cast<int>(std::min<size_t>(chunk_, ids.size() - at));
      std::vector<int32_t> tokens(ids.begin() + at, ids.begin() + at + n), positions, rows;
      std::vector<int64_t> slots;
      for (int i = done_; i < done_ + n; ++i) {
        positions.push_back(i);
        slots.push_back(static_cast<int64_t>(blocks_[i / block_size_]) * block_size_ +
                        i % block_size_);
        if (i >= first) rows.push_back(i - done_);
      }
      const int max_blocks = (done_ + n + block_size_ - 1) / block_size_;
      std::vector<int32_t> table(blocks_.begin(), blocks_.begin() + max_blocks);
      std::vector<int32_t> seq_lens{done_ + n}, qsl{0, n};
      ForwardInput in{tokens, positions, slots, table, max_blocks, seq_lens, qsl, rows};
      HostTensor logits;
      const absl::Status s = model_.Forward(in, cache_.layers, &logits);
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) return {};
      out.insert(out.end(), logits.data<float>(),
                 logits.data<float>() + rows.size() * model_.vocab_size());
      done_ += n;
      at += n;
    }
    return out;
  }

 private:
  LlamaModel& model_;
  const int block_size_, chunk_;
  Cache cache_;
  std::vector<int32_t> blocks_;
  int done_ = 0;  // tokens fed so far
};

// Loads the model in `dir` at one rank into *model; fails the test (fatally) on an error.
inline void LoadTestModel(const std::string& dir, std::unique_ptr<LlamaModel>* model,
                          const ModelOptions& options = {}) {
  absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<LlamaModel>> loaded =
      LlamaModel::Load(dir, *config, nullptr, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  *model = std::move(*loaded);
}

}  // namespace llm

#endif  // LLM_TESTS_TESTING_MODEL_TEST_UTIL_H_
