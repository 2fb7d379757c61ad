// Embedding: rows copied exactly for i32 and i64 ids; bad ids and shapes are errors that
// name the argument and leave the output untouched.
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using ::testing::HasSubstr;
using testing::Indices;
using testing::Poisoned;
using testing::Random;

TEST(Embedding, CopiesTheRowOfEachToken) {
  std::mt19937 rng(1);
  constexpr int64_t kVocab = 50, kHidden = 33;
  HostTensor table = Random({kVocab, kHidden}, rng);
  const std::vector<int64_t> ids = {0, 49, 7, 7, 23, 1, 48};
  for (DType dtype : {DType::kI32, DType::kI64}) {
    HostTensor token_ids = Indices(ids, dtype);
    HostTensor out = Poisoned({7, kHidden});
    ASSERT_TRUE(Embedding({}, out.view(), token_ids.view(), table.view()).ok());
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t h = 0; h < kHidden; ++h) {
        ASSERT_EQ(out.data<float>()[t * kHidden + h], table.data<float>()[ids[t] * kHidden + h])
            << "token " << t << " dim " << h << " dtype " << DTypeName(dtype);
      }
    }
  }
}

TEST(Embedding, IdOutOfRangeIsAnErrorNamingIt) {
  std::mt19937 rng(2);
  HostTensor table = Random({50, 8}, rng);
  HostTensor out = Poisoned({3, 8});
  for (int64_t bad : {50, -1}) {
    HostTensor token_ids = Indices({1, 2, bad}, DType::kI32);
    const OpStatus s = Embedding({}, out.view(), token_ids.view(), table.view());
    EXPECT_THAT(s.message, HasSubstr("Embedding: token_ids[2] = " + std::to_string(bad) +
                                     " is outside [0, 50)"));
    for (float v : testing::ToVector(out)) EXPECT_TRUE(std::isnan(v)) << "out was written";
  }
}

TEST(Embedding, ShapeAndDTypeErrorsNameTheArgument) {
  std::mt19937 rng(3);
  HostTensor table = Random({50, 8}, rng);
  HostTensor ids = Indices({1, 2, 3}, DType::kI32);
  HostTensor out_wrong = Poisoned({3, 9});
  EXPECT_EQ(Embedding({}, out_wrong.view(), ids.view(), table.view()).message,
            "Embedding: out: expected f32 [3, 8], got f32 [3, 9] on cpu");
  HostTensor out = Poisoned({3, 8});
  HostTensor float_ids = Random({3}, rng);
  EXPECT_EQ(Embedding({}, out.view(), float_ids.view(), table.view()).message,
            "Embedding: token_ids: expected i32|i64 [?], got f32 [3] on cpu");
}

TEST(Embedding, CudaTensorsNeedTheCudaBackendAndOneDevice) {
  std::mt19937 rng(4);
  HostTensor table = Random({50, 8}, rng);
  HostTensor ids = Indices({1}, DType::kI32);
  HostTensor out = Poisoned({1, 8});
  TensorView cuda_table = table.view();
  cuda_table.device = TensorDevice::Cuda(0);
  EXPECT_EQ(Embedding({}, out.view(), ids.view(), cuda_table).message,
            "Embedding: table: on cuda:0 but out is on cpu");
#ifndef LLM_WITH_CUDA  // with the CUDA backend, tests/gpu/embedding_test covers cuda tensors
  TensorView cuda_out = out.view(), cuda_ids = ids.view();
  cuda_out.device = cuda_ids.device = TensorDevice::Cuda(0);
  EXPECT_THAT(Embedding({}, cuda_out, cuda_ids, cuda_table).message,
              HasSubstr("Embedding: no backend for tensors on cuda:0"));
#endif
}

}  // namespace
}  // namespace llm::ops
