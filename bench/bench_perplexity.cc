// bench_perplexity: a model's perplexity over a text file, computed as llama.cpp's
// llama-perplexity computes it, so that the two can be compared on the same GGUF file (issue 32:
// weights kept quantized against llama.cpp on its own files).
//
//   bench_perplexity --model=FILE.gguf|DIR [--text=FILE] [--ctx=512] [--quantized-weights=true]
//
// The text is tokenized (with BOS when the tokenizer adds one) and cut into chunks of --ctx
// tokens; each chunk runs as one prefill from an empty KV cache, its first token replaced by
// BOS as llama-perplexity does, and the tokens of its second half are scored: the negative
// log-likelihood of token j+1 under the logits of row j, for j from ctx/2 to ctx-2
// (--step-tokens=1 feeds the chunk one token per step instead, through the decode kernels).
// Prints the running estimate per chunk and the final PPL = exp(mean NLL) with its standard
// error (the same estimator as llama.cpp's). CPU, f32 activations; --dtype chooses the GEMM
// weights' type when they are dequantized.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/flag_parser.h"
#include "common/model_config.h"
#include "kernels/tensor.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "worker_service/model/llama.h"

namespace llm {
namespace {

struct Args {
  std::string model;
  std::string text = LLM_PERPLEXITY_TEXT;
  int ctx = 512;
  int max_chunks = 0;  // 0: all
  bool quantized_weights = true;
  int step_tokens = 0;  // 0: the whole chunk in one step
  std::string dtype = "float32";
};

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "bench_perplexity: %s\n", message.c_str());
  std::exit(1);
}

int Run(const Args& a) {
  std::ifstream in(a.text, std::ios::binary);
  if (!in) Die("cannot read --text " + a.text);
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(a.model);
  if (!config.ok()) Die(config.status().ToString());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(a.model);
  if (!tokenizer.ok()) Die(tokenizer.status().ToString());
  ModelOptions options;
  absl::StatusOr<DType> dtype = ParseModelDType(a.dtype, TensorDevice::Cpu());
  if (!dtype.ok()) Die(dtype.status().ToString());
  options.dtype = *dtype;
  options.quantized_weights = a.quantized_weights;
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LlamaModel::Load(a.model, *config, nullptr, options);
  if (!model.ok()) Die(model.status().ToString());
  LlamaModel& m = **model;

  const std::vector<int32_t> tokens = (*tokenizer)->Encode(ss.str(), /*add_special_tokens=*/true);
  const int ctx = a.ctx;
  if (ctx < 4 || ctx % 2 != 0) Die("--ctx must be even and at least 4");
  int chunks = static_cast<int>(tokens.size()) / ctx;
  if (a.max_chunks > 0) chunks = std::min(chunks, a.max_chunks);
  if (chunks == 0) Die("the text has fewer tokens than --ctx");
  const int bos = (*tokenizer)->add_bos_token() ? *(*tokenizer)->bos_token_id() : -1;
  std::printf("model %s (%s, weights %s), %zu tokens, %d chunks of %d, BOS %d\n", a.model.c_str(),
              a.dtype.c_str(),
              a.quantized_weights ? "kept quantized where the file is" : "dequantized",
              tokens.size(), chunks, ctx, bos);

  constexpr int kBlock = 16;
  const int blocks = ctx / kBlock + 1;
  std::vector<HostTensor> kv;
  std::vector<LayerKvCache> caches;
  for (int l = 0; l < m.num_layers(); ++l) {
    for (int i = 0; i < 2; ++i) {
      kv.emplace_back(DType::kF32,
                      std::vector<int64_t>{blocks, kBlock, m.num_local_kv_heads(), m.head_dim()});
    }
  }
  for (int l = 0; l < m.num_layers(); ++l)
    caches.push_back({kv[2 * l].view(), kv[2 * l + 1].view()});

  std::vector<int32_t> positions(ctx), block_table(blocks);
  std::vector<int64_t> slots(ctx);
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(block_table.begin(), block_table.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  const int first = ctx / 2;
  const int step = a.step_tokens > 0 ? a.step_tokens : ctx;
  const int vocab = m.vocab_size();
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  for (int c = 0; c < chunks; ++c) {
    std::vector<int32_t> ids(tokens.begin() + int64_t{c} * ctx,
                             tokens.begin() + int64_t{c + 1} * ctx);
    if (bos >= 0) ids[0] = bos;
    // The chunk in steps of --step-tokens tokens (all of it: one prefill; 1: decode steps,
    // which run the GEMV kernels), scoring the rows from `first` on.
    for (int done = 0; done < ctx;) {
      const int n = std::min(step, ctx - done);
      std::vector<int32_t> rows;
      for (int j = std::max(done, first); j < std::min(done + n, ctx - 1); ++j) {
        rows.push_back(j - done);
      }
      const std::vector<int32_t> seq_lens{done + n}, qsl{0, n};
      const ForwardInput input{.token_ids = std::span<const int32_t>(ids).subspan(done, n),
                               .positions = std::span<const int32_t>(positions).subspan(done, n),
                               .slot_mapping = std::span<const int64_t>(slots).subspan(done, n),
                               .block_tables = block_table,
                               .max_blocks = blocks,
                               .seq_lens = seq_lens,
                               .query_start_loc = qsl,
                               .logits_indices = rows};
      HostTensor logits;
      if (absl::Status s = m.Forward(input, caches, &logits); !s.ok()) Die(s.ToString());
      const float* l = logits.data<float>();
      for (size_t r = 0; r < rows.size(); ++r) {
        const float* row = l + r * vocab;
        double max = row[0];
        for (int v = 1; v < vocab; ++v) max = std::max<double>(max, row[v]);
        double sum = 0;
        for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
        const double lp = row[ids[done + rows[r] + 1]] - max - std::log(sum);
        nll -= lp;
        nll2 += lp * lp;
        ++count;
      }
      done += n;
    }
    std::printf("[%d] %.4f\n", c + 1, std::exp(nll / count));
    std::fflush(stdout);
  }
  const double mean = nll / count;
  const double var = nll2 / count - mean * mean;
  const double err = count > 1 ? std::sqrt(var / (count - 1)) : 0;
  std::printf("Final estimate: PPL = %.4f +/- %.5f over %lld tokens\n", std::exp(mean),
              std::exp(mean) * err, static_cast<long long>(count));
  return 0;
}

}  // namespace
}  // namespace llm

int main(int argc, char** argv) {
  llm::Args a;
  llm::FlagParser flags(
      "usage: bench_perplexity --model=FILE.gguf|DIR [--flag=value ...]: perplexity over a text, "
      "as llama-perplexity computes it");
  flags.Add("model", &a.model, "GGUF file or Hugging Face directory (required)");
  flags.Add("text", &a.text, "the text (tests/data/tokenizer/english_sample.txt)");
  flags.Add("ctx", &a.ctx, "tokens per chunk, as llama-perplexity's -c (512)");
  flags.Add("chunks", &a.max_chunks, "at most this many chunks; 0: all (0)");
  flags.Add("quantized-weights", &a.quantized_weights,
            "GGUF: keep the file's quantized blocks (true) or dequantize (false)");
  flags.Add("step-tokens", &a.step_tokens,
            "tokens per step: 0, the whole chunk as one prefill; 1, decode steps (the GEMV "
            "kernels, activations rounded to 8 bits on quantized weights) (0)");
  flags.Add("dtype", &a.dtype, "GEMM weights when dequantized: float32 or bfloat16 (float32)");
  flags.Parse(argc, argv);
  if (a.model.empty()) llm::Die("--model is required");
  return llm::Run(a);
}
