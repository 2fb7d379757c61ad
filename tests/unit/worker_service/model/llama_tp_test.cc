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

// A GGUF kept as its Q8_0 blocks (the cpu default): each rank holds its rows of the
// column-parallel weights and its columns (whole blocks) of o_proj and down_proj as blocks, and
// 2 ranks give one rank's logits. The activations are quantized per 32 values along the input,
// and a rank's columns start on a block boundary, so both quantize the same blocks; but the order
// of the fp32 sums differs, and where that moves a value across a rounding boundary of its 8-bit
// code the two differ by the activations' rounding (1e-2 of the logits' scale, a measured bound
// with margin), not by fp32's.
TEST(LlamaTensorParallelQuantizedTest, RanksKeepTheirBlocksAndAgreeWithOneRank) {
  const std::string path = std::string(LLM_TEST_DATA_DIR) + "/models/fortune-llama-q8_0.gguf";
  const std::string dir = std::string(LLM_TEST_DATA_DIR) + "/../../models/fortune-llama";
  auto config = ModelConfig::FromModelDir(path);
  ASSERT_TRUE(config.ok()) << config.status();
  auto single = LlamaModel::Load(path, *config, nullptr);
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_GT((*single)->quantized_weight_bytes(), 0u);
  const Golden golden = LoadGolden(dir, (*single)->vocab_size());
  std::vector<float> reference;
  RunAndCompare(**single, golden, 16, RandomChunks(), &reference, 0.05);

  constexpr int kWorld = 2;
  gloo::rendezvous::HashStore store;
  std::vector<std::vector<float>> per_rank(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<size_t> quantized_bytes(kWorld), weight_bytes(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          ShmCommunicator::Create(store, rank, kWorld);
      if (!comm.ok()) {
        errors[rank] = comm.status().ToString();
        return;
      }
      auto model = LlamaModel::Load(path, *config, comm->get());
      if (!model.ok()) {
        errors[rank] = model.status().ToString();
        return;
      }
      quantized_bytes[rank] = (*model)->quantized_weight_bytes();
      weight_bytes[rank] = (*model)->weight_bytes();
      RunAndCompare(**model, golden, 16, RandomChunks(), &per_rank[rank], 0.05);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(errors[rank], "") << "rank " << rank;
    // Every GEMM of the rank is blocks (o_proj's and down_proj's columns split on blocks): the
    // rank holds about half the blocks, and nothing else but norms.
    EXPECT_GT(quantized_bytes[rank], 0.95 * weight_bytes[rank]) << "rank " << rank;
    EXPECT_LT(quantized_bytes[rank], 0.6 * (*single)->quantized_weight_bytes()) << "rank " << rank;
    ASSERT_EQ(per_rank[rank].size(), reference.size()) << "rank " << rank;
    const int vocab = config->vocab_size;
    double worst = 0;
    for (size_t row = 0; row * vocab < reference.size(); ++row) {
      const float* got = per_rank[rank].data() + row * vocab;
      const float* want = reference.data() + row * vocab;
      worst = std::max(worst, RowError(got, want, vocab));
      EXPECT_LT(RowError(got, want, vocab), 1e-2) << "rank " << rank << " row " << row;
    }
    std::printf("rank %d: worst relative logit difference from one rank %.3g\n", rank, worst);
  }
}

// OLMoE's q/k norm spans all of a token's heads, whose sums of squares the ranks all-reduce
// (RanksAgreeWithOneRankAndTransformers runs it at 2): with more ranks than KV heads (tiny-olmoe
// has 2) the replicated heads would be counted twice, so every rank's load refuses, naming the
// sizes, before any collective.
TEST(LlamaTensorParallelOlmoeTest, IsRefusedWithMoreRanksThanKvHeads) {
  const std::string dir = std::string(LLM_TEST_DATA_DIR) + "/models/tiny-olmoe";
  auto config = ModelConfig::FromModelDir(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  constexpr int kWorld = 4;
  gloo::rendezvous::HashStore store;
  std::vector<absl::Status> loads(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          GlooCommunicator::Create(store, rank, kWorld);
      loads[rank] =
          comm.ok() ? LlamaModel::Load(dir, *config, comm->get()).status() : comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : loads) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(s.message().find("tensor-parallel size 4 exceeds num_key_value_heads (2)"),
              std::string::npos)
        << s;
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

// The mixtures of experts: every expert's intermediate size split over the ranks (their heads
// allow 2).
INSTANTIATE_TEST_SUITE_P(MoeModels, LlamaTensorParallelTest,
                         ::testing::Combine(::testing::Values("tiny-mixtral", "tiny-qwen2-moe",
                                                              "tiny-qwen3-moe", "tiny-olmoe"),
                                            ::testing::Values(2), ::testing::Bool()),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n + "_tp" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_shm" : "_gloo");
                         });

}  // namespace
}  // namespace llm
