#include "tools/local_engine.h"

#include <algorithm>
#include <utility>

namespace llm {

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    const std::string& model_dir, const LocalEngineOptions& options) {
  std::unique_ptr<LocalEngine> e(new LocalEngine());
  absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(model_dir);
  if (!config.ok()) return config.status();
  e->config_ = std::move(*config);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(model_dir);
  if (!tokenizer.ok()) return tokenizer.status();
  e->tokenizer_ = std::move(*tokenizer);
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LlamaModel::Load(model_dir, e->config_, nullptr);
  if (!model.ok()) return model.status();
  e->model_ = std::move(*model);

  const int bs = options.block_size;
  const int max_model_len = options.max_model_len > 0 ? std::min(options.max_model_len,
                                                                 e->config_.max_position_embeddings)
                                                      : e->config_.max_position_embeddings;
  const int num_blocks = options.max_seqs * (max_model_len / bs + 1);
  e->cache_ = std::make_unique<CacheEngine>(
      CacheShape{e->model_->num_layers(), e->model_->num_local_kv_heads(), e->model_->head_dim(),
                 bs},
      num_blocks, 1);
  e->runner_ = std::make_unique<ModelRunner>(e->model_.get(), e->cache_.get());
  SchedulerConfig sc;
  sc.max_model_len = max_model_len;
  sc.max_num_batched_tokens = max_model_len;
  sc.vocab_size = e->config_.vocab_size;
  if (!e->config_.eos_token_ids.empty()) sc.eos_token_id = e->config_.eos_token_ids[0];
  const BlockSpaceManagerConfig bc{.block_size = bs,
                                   .num_gpu_blocks = num_blocks,
                                   .num_cpu_blocks = 0,
                                   .watermark = 0.0,
                                   .enable_prefix_caching = false};
  e->detokenizers_ = std::make_unique<TokenizerDetokenizerFactory>(e->tokenizer_);
  e->engine_ = std::make_unique<EngineCore>(sc, bc, e->runner_.get(), e->detokenizers_.get());
  return e;
}

}  // namespace llm
