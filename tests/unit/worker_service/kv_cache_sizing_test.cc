#include "worker_service/kv_cache_sizing.h"

#include <cstdint>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// An 8B-shaped model on an 80 GiB device: 32 layers x 8 kv heads x 128 dims x K and V x 2
// bytes x 16 tokens = 2 MiB per block.
KvCacheSizingInput Llama8bOn80GiB() {
  KvCacheSizingInput in;
  in.total_device_memory = 80 * kGiB;
  in.gpu_memory_utilization = 0.9;
  in.peak_memory = 18 * kGiB;
  in.bytes_per_block = 2 * kMiB;
  in.block_size = 16;
  in.max_model_len = 8192;
  in.swap_space_gib = 4;
  return in;
}

TEST(SizeKvCache, BudgetMinusPeakOverBytesPerBlock) {
  absl::StatusOr<KvCacheSizing> s = SizeKvCache(Llama8bOn80GiB());
  ASSERT_TRUE(s.ok()) << s.status();
  // (72 GiB - 18 GiB) / 2 MiB = 54 * 512.
  EXPECT_EQ(s->num_gpu_blocks, 54u * 512u);
  EXPECT_EQ(s->num_cpu_blocks, 4u * 512u);  // 4 GiB / 2 MiB
}

TEST(SizeKvCache, FloorsPartialBlocks) {
  KvCacheSizingInput in = Llama8bOn80GiB();
  in.total_device_memory = 1000;
  in.gpu_memory_utilization = 0.5;  // budget 500 bytes
  in.peak_memory = 99;              // 401 left
  in.bytes_per_block = 100;
  in.block_size = 2;
  in.max_model_len = 7;  // 4 blocks
  in.swap_space_gib = 0;
  absl::StatusOr<KvCacheSizing> s = SizeKvCache(in);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_gpu_blocks, 4u);
  EXPECT_EQ(s->num_cpu_blocks, 0u);
}

TEST(SizeKvCache, ExactlyOneMaxModelLenSequenceFits) {
  KvCacheSizingInput in = Llama8bOn80GiB();
  in.total_device_memory = 10 * kGiB;
  in.gpu_memory_utilization = 1.0;
  in.peak_memory = 10 * kGiB - 512 * 2 * kMiB;  // 512 blocks = 8192 tokens
  absl::StatusOr<KvCacheSizing> s = SizeKvCache(in);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_gpu_blocks, 512u);
  in.max_model_len = 8193;  // one token more needs a 513th block
  EXPECT_EQ(SizeKvCache(in).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(SizeKvCache, ModelThatDoesNotFitSaysHowMuchItNeeds) {
  KvCacheSizingInput in = Llama8bOn80GiB();
  in.total_device_memory = 16 * kGiB;
  in.peak_memory = 15 * kGiB + 205 * kMiB;  // 15.20 GiB; the budget is 14.40 GiB
  const absl::Status s = SizeKvCache(in).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("the model needs 15.20 GiB"));
  EXPECT_THAT(s.message(),
              HasSubstr("the budget is 14.40 GiB (gpu_memory_utilization 0.9 of 16.00 GiB)"));
  // A peak that is exactly the budget leaves nothing for the cache: the same error.
  in.peak_memory = static_cast<uint64_t>(16 * kGiB * 0.9);
  EXPECT_THAT(SizeKvCache(in).status().message(), HasSubstr("the model does not fit"));
}

TEST(SizeKvCache, TooLongMaxModelLenSaysTheLargestThatFits) {
  KvCacheSizingInput in = Llama8bOn80GiB();
  in.total_device_memory = 20 * kGiB;
  in.gpu_memory_utilization = 1.0;
  in.peak_memory = 20 * kGiB - 100 * 2 * kMiB - 1;  // 100 blocks and a byte
  in.max_model_len = 8192;
  const absl::Status s = SizeKvCache(in).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("not even one sequence of max_model_len 8192 fits"));
  EXPECT_THAT(s.message(), HasSubstr("needs 512 blocks of 16 tokens"));
  EXPECT_THAT(s.message(), HasSubstr("max_model_len can be at most 1600 with this budget; lower "
                                     "--max-model-len or raise --gpu-memory-utilization"));
  in.max_model_len = 1600;
  absl::StatusOr<KvCacheSizing> ok = SizeKvCache(in);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->num_gpu_blocks, 100u);
}

TEST(SizeKvCache, LessThanOneBlockLeftAllowsNoSequence) {
  KvCacheSizingInput in = Llama8bOn80GiB();
  in.total_device_memory = 10 * kGiB;
  in.gpu_memory_utilization = 1.0;
  in.peak_memory = 10 * kGiB - kMiB;  // half a block left
  EXPECT_THAT(SizeKvCache(in).status().message(), HasSubstr("max_model_len can be at most 0"));
}

TEST(SizeKvCache, CapsBlockCountsAtInt32) {
  KvCacheSizingInput in = Llama8bOn80GiB();
  in.total_device_memory = uint64_t{1} << 50;
  in.gpu_memory_utilization = 1.0;
  in.peak_memory = 0;
  in.bytes_per_block = 1;
  in.swap_space_gib = 1e9;
  absl::StatusOr<KvCacheSizing> s = SizeKvCache(in);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_gpu_blocks, static_cast<uint32_t>(std::numeric_limits<int32_t>::max()));
  EXPECT_EQ(s->num_cpu_blocks, static_cast<uint32_t>(std::numeric_limits<int32_t>::max()));
}

TEST(SizeKvCache, RejectsBadInputsByName) {
  auto message = [](void (*change)(KvCacheSizingInput&)) {
    KvCacheSizingInput in = Llama8bOn80GiB();
    change(in);
    const absl::Status s = SizeKvCache(in).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  EXPECT_THAT(message([](KvCacheSizingInput& in) { in.gpu_memory_utilization = 0; }),
              HasSubstr("gpu_memory_utilization must be in (0, 1], got 0"));
  EXPECT_THAT(message([](KvCacheSizingInput& in) { in.gpu_memory_utilization = 1.5; }),
              HasSubstr("gpu_memory_utilization must be in (0, 1], got 1.5"));
  EXPECT_THAT(message([](KvCacheSizingInput& in) {
                in.gpu_memory_utilization = std::numeric_limits<double>::quiet_NaN();
              }),
              HasSubstr("gpu_memory_utilization"));
  EXPECT_THAT(message([](KvCacheSizingInput& in) { in.total_device_memory = 0; }),
              HasSubstr("total_device_memory"));
  EXPECT_THAT(message([](KvCacheSizingInput& in) { in.bytes_per_block = 0; }),
              HasSubstr("bytes_per_block"));
  EXPECT_THAT(message([](KvCacheSizingInput& in) { in.block_size = 0; }),
              HasSubstr("block_size must be >= 1, got 0"));
  EXPECT_THAT(message([](KvCacheSizingInput& in) { in.max_model_len = -1; }),
              HasSubstr("max_model_len must be >= 1, got -1"));
  EXPECT_THAT(message([](KvCacheSizingInput& in) { in.swap_space_gib = -1; }),
              HasSubstr("swap_space_gib must be finite and >= 0, got -1"));
}

TEST(BlocksInGib, FloorsAndTreatsNothingAsZero) {
  EXPECT_EQ(BlocksInGib(1.0, 3 * kMiB), 341u);  // 1024 / 3
  EXPECT_EQ(BlocksInGib(0.0, kMiB), 0u);
  EXPECT_EQ(BlocksInGib(-2.0, kMiB), 0u);
}

}  // namespace
}  // namespace llm
