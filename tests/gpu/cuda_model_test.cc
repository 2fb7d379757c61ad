// The model on cuda (emulated here: label cuda-emu; on a GPU: label gpu) against transformers'
// golden logits and against the CPU model, fed as the engine feeds it: prefill chunks mixed
// with decode tokens over scattered, NaN-poisoned KV blocks.
//
// Tolerances (RowError: max |ours - theirs| / max |theirs| over a row):
//   f32 weights, f32 cache: 1e-4, the CPU model's bound (the CUDA ops accumulate in fp32 too).
//   bf16 weights, activations and cache: 4e-2. bf16 keeps 8 bits of mantissa (relative
//   rounding 2^-9 = 2e-3 per stored value); a decoder layer rounds its activations about 10
//   times (norms, projections, attention, MLP), and the errors of the layers add up through the
//   residual stream. Observed (emulated): 1.3e-2 (tiny-llama), 2.1e-2 (tiny-qwen2).
//   f16 (11 bits): 8e-3; observed 1.6e-3. The tests print their worst rows.
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "tests/unit/worker_service/model/model_test_util.h"
#include "worker_service/model/device_context.h"

namespace llm {
namespace {

constexpr double kBf16Tolerance = 4e-2;
constexpr double kF16Tolerance = 8e-3;

class CudaModelTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string why_none;
    if (cuda::DeviceCount(&why_none) == 0) GTEST_SKIP() << "no usable CUDA device: " << why_none;
    absl::StatusOr<std::unique_ptr<DeviceContext>> ctx =
        DeviceContext::Create(TensorDevice::Cuda(0));
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    context_ = std::move(*ctx);
    dir_ = std::string(LLM_TEST_DATA_DIR) + "/models/" + GetParam();
  }
  void Load(DType dtype, std::unique_ptr<LlamaModel>* model) {
    ASSERT_NO_FATAL_FAILURE(LoadTestModel(dir_, model, {context_.get(), dtype}));
  }
  std::unique_ptr<DeviceContext> context_;
  std::string dir_;
};

auto MixedChunks() {
  return [](std::mt19937& rng) { return std::uniform_int_distribution<int>(1, 7)(rng); };
}

TEST_P(CudaModelTest, Float32MatchesTransformersAsTheCpuModelDoes) {
  std::unique_ptr<LlamaModel> model;
  ASSERT_NO_FATAL_FAILURE(Load(DType::kF32, &model));
  EXPECT_TRUE(model->device().is_cuda());
  const Golden golden = LoadGolden(dir_, model->vocab_size());
  const double one_prefill =
      RunAndCompare(*model, golden, 16, [](std::mt19937&) { return 1 << 20; });
  const double mixed = RunAndCompare(*model, golden, 16, MixedChunks());
  std::printf("f32 on cuda: worst row error %.2e (one prefill), %.2e (mixed chunks)\n", one_prefill,
              mixed);
}

TEST_P(CudaModelTest, Float32LogitsEqualTheCpuModelsClosely) {
  std::unique_ptr<LlamaModel> gpu, cpu;
  ASSERT_NO_FATAL_FAILURE(Load(DType::kF32, &gpu));
  ASSERT_NO_FATAL_FAILURE(LoadTestModel(dir_, &cpu));
  const Golden golden = LoadGolden(dir_, gpu->vocab_size());
  std::vector<float> on_gpu, on_cpu;
  RunAndCompare(*gpu, golden, 16, MixedChunks(), &on_gpu);
  RunAndCompare(*cpu, golden, 16, MixedChunks(), &on_cpu);
  ASSERT_EQ(on_gpu.size(), on_cpu.size());
  const int vocab = gpu->vocab_size();
  double worst = 0;
  for (size_t r = 0; r < on_gpu.size() / vocab; ++r) {
    worst = std::max(worst, RowError(&on_gpu[r * vocab], &on_cpu[r * vocab], vocab));
  }
  EXPECT_LT(worst, 1e-5);
  std::printf("f32 cuda vs cpu: worst row error %.2e over %zu rows\n", worst,
              on_gpu.size() / vocab);
}

TEST_P(CudaModelTest, Bfloat16MatchesTransformersWithinBf16Error) {
  std::unique_ptr<LlamaModel> model;
  ASSERT_NO_FATAL_FAILURE(Load(DType::kBF16, &model));
  EXPECT_EQ(model->dtype(), DType::kBF16);
  const Golden golden = LoadGolden(dir_, model->vocab_size());
  const double worst =
      RunAndCompare(*model, golden, 16, MixedChunks(), nullptr, kBf16Tolerance, DType::kBF16);
  std::printf("bf16 on cuda (bf16 cache): worst row error %.2e\n", worst);
}

TEST_P(CudaModelTest, Float16MatchesTransformersWithinHalfError) {
  std::unique_ptr<LlamaModel> model;
  ASSERT_NO_FATAL_FAILURE(Load(DType::kF16, &model));
  const Golden golden = LoadGolden(dir_, model->vocab_size());
  const double worst =
      RunAndCompare(*model, golden, 16, MixedChunks(), nullptr, kF16Tolerance, DType::kF16);
  std::printf("f16 on cuda (f16 cache): worst row error %.2e\n", worst);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModelTest, ::testing::Values("tiny-llama", "tiny-qwen2"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace llm
