// Tensor parallelism: 2 and 4 ranks (threads of this process; collectives over Gloo's loopback
// TCP or one shared-memory segment) give the logits of one rank within 1e-5 relative, and so
// the same greedy tokens, for the tiny model of each family, including 4 ranks over 2 or 1 KV
// heads (KV heads replicated).
#include <string>
#include <thread>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "tests/testing/model_test_util.h"
#include "worker_service/model/llama.h"
#include "worker_service/parallel/gloo_communicator.h"
#include "worker_service/parallel/shm_communicator.h"

namespace llm {
namespace {

auto RandomChunks() {
  return [](std::mt19937& rng) { return std::uniform_int_distribution<int>(1, 7)(rng); };
}

class LlamaTensorParallelTest
    : public ::testing::TestWithParam<std::tuple<const char*, int, bool>> {};

TEST_P(LlamaTensorParallelTest, RanksAgreeWithOneRankAndTransformers) {
  const auto [name, world, shm] = GetParam();
  const std::string dir = std::string(LLM_TEST_DATA_DIR) + "/models/" + name;
  auto config = ModelConfig::FromModelDir(dir);
  ASSERT_TRUE(config.ok()) << config.status();

  auto single = LlamaModel::Load(dir, *config, nullptr);
  ASSERT_TRUE(single.ok()) << single.status();
  const Golden golden = LoadGolden(dir, (*single)->vocab_size());
  std::vector<float> reference;
  RunAndCompare(**single, golden, 16, RandomChunks(), &reference);

  gloo::rendezvous::HashStore store;
  std::vector<std::vector<float>> per_rank(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Communicator>> comm;
      if (shm) {
        comm = ShmCommunicator::Create(store, rank, world);
      } else {
        comm = GlooCommunicator::Create(store, rank, world);
      }
      if (!comm.ok()) {
        errors[rank] = comm.status().ToString();
        return;
      }
      auto model = LlamaModel::Load(dir, *config, comm->get());
      if (!model.ok()) {
        errors[rank] = model.status().ToString();
        return;
      }
      EXPECT_EQ((*model)->num_local_q_heads() * world, config->num_attention_heads);
      RunAndCompare(**model, golden, 16, RandomChunks(), &per_rank[rank]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_EQ(errors[rank], "") << "rank " << rank;
    ASSERT_EQ(per_rank[rank].size(), reference.size()) << "rank " << rank;
    const int vocab = config->vocab_size;
    for (size_t row = 0; row * vocab < reference.size(); ++row) {
      const float* got = per_rank[rank].data() + row * vocab;
      const float* want = reference.data() + row * vocab;
      ASSERT_LT(RowError(got, want, vocab), 1e-5) << "rank " << rank << " row " << row;
      ASSERT_EQ(std::max_element(got, got + vocab) - got,
                std::max_element(want, want + vocab) - want)
          << "greedy token differs: rank " << rank << " row " << row;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaTensorParallelTest,
                         ::testing::Combine(::testing::Values("tiny-llama", "tiny-qwen2",
                                                              "tiny-qwen3", "tiny-gemma2",
                                                              "tiny-gemma3", "tiny-phi3"),
                                            ::testing::Values(2, 4), ::testing::Bool()),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n + "_tp" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_shm" : "_gloo");
                         });

}  // namespace
}  // namespace llm
