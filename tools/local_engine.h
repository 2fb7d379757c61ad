// LocalEngine: the whole system in one process on the CPU backend, over a Hugging Face model
// directory: the model, a KV cache with room for `max_seqs` sequences of max_model_len tokens,
// the model runner as the executor, the tokenizer, and an EngineCore that detokenizes with it
// (its outputs carry text; no prefix caching, no swap space). llm-generate (`make demo`) runs on
// it, and the integration tests take their reference outputs from it.
#ifndef LLM_TOOLS_LOCAL_ENGINE_H_
#define LLM_TOOLS_LOCAL_ENGINE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "scheduler_service/engine/engine_core.h"
#include "scheduler_service/tokenizer/incremental_detokenizer.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "worker_service/cache_engine.h"
#include "worker_service/model/llama.h"
#include "worker_service/model_runner.h"

namespace llm {

struct LocalEngineOptions {
  int max_model_len = 0;  // 0: the model's max_position_embeddings; else at most that
  int max_seqs = 1;       // sequences the KV cache holds at full length at once
  int block_size = 16;
};

class LocalEngine {
 public:
  // Loads everything; the errors of the model directory's files.
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Create(const std::string& model_dir,
                                                             const LocalEngineOptions& options);
  LocalEngine(const LocalEngine&) = delete;
  LocalEngine& operator=(const LocalEngine&) = delete;

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  EngineCore& engine() { return *engine_; }

 private:
  LocalEngine() = default;

  ModelConfig config_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<CacheEngine> cache_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<TokenizerDetokenizerFactory> detokenizers_;
  std::unique_ptr<EngineCore> engine_;  // last: stopped before what it uses is destroyed
};

}  // namespace llm

#endif  // LLM_TOOLS_LOCAL_ENGINE_H_
