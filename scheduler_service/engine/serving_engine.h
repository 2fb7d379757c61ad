// A running engine over a ready worker group: what the WorkerGroup's serve callback starts
// each time the group is up, the LLMService serves from, and the group drops when the group
// goes down.
//
// With recovery (llm-scheduler --recovery-timeout), one ServingEngine lives across group
// rebuilds: each new group's client replaces `executor` (EngineCore::ReplaceExecutor first).
//
// Ownership: owns the Executor (the group's ShardedWorkerClient) and the EngineCore that drives
// it; the engine is destroyed (stopped) before the executor. Shared between the service's calls
// and the group; destroyed by whoever drops the last reference.
#ifndef LLM_SCHEDULER_SERVICE_ENGINE_SERVING_ENGINE_H_
#define LLM_SCHEDULER_SERVICE_ENGINE_SERVING_ENGINE_H_

#include <atomic>
#include <memory>

#include "protocol/executor.h"
#include "scheduler_service/engine/engine_core.h"

namespace llm {

struct ServingEngine {
  std::unique_ptr<Executor> executor;
  std::unique_ptr<EngineCore> engine;  // started; null until then
  // The current group's cache (it may change when the group is rebuilt).
  std::atomic<int> num_gpu_blocks{0};
  std::atomic<int> num_cpu_blocks{0};

  ~ServingEngine() { engine.reset(); }
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_ENGINE_SERVING_ENGINE_H_
