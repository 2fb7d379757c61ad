// SiluAndMul on CUDA against the CPU op. Tolerance: atol 1e-6, rtol 1e-5 (expf on the GPU is
// within 2 ulp of the host's; inputs in [-4, 4]).
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Poisoned;
using gpu_testing::Random;

class CudaSiluAndMul : public CudaTest {};

TEST_F(CudaSiluAndMul, MatchesCpu) {
  std::mt19937 rng(301);
  for (const int64_t inter : {1, 3583, 14336}) {
    for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
      SCOPED_TRACE(::testing::Message() << "intermediate " << inter << ", tokens " << num_tokens);
      HostTensor x = Random({num_tokens, 2 * inter}, rng, -4.0f, 4.0f);
      HostTensor want = Poisoned({num_tokens, inter});
      ASSERT_TRUE(SiluAndMul({}, want.view(), x.view()).ok());
      DeviceTensor d_x(x), d_out(want);
      d_out.Poison();
      const OpStatus s = SiluAndMul({}, d_out.view(), d_x.view());
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(Close(d_out.Download(), want, 1e-6, 1e-5));
    }
  }
}

}  // namespace
}  // namespace llm::ops
