// Linear (OpenBLAS) against a naive triple loop in double, with and without bias.
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::AllClose;
using testing::Poisoned;
using testing::Random;

struct Dims {
  int64_t tokens, in, out;
};

TEST(Linear, MatchesANaiveLoop) {
  std::mt19937 rng(30);
  for (const Dims& d :
       {Dims{1, 1, 1}, Dims{1, 300, 257}, Dims{7, 33, 65}, Dims{64, 256, 128}, Dims{3, 5, 0}}) {
    HostTensor x = Random({d.tokens, d.in}, rng);
    HostTensor w = Random({d.out, d.in}, rng);
    HostTensor b = Random({d.out}, rng);
    for (bool with_bias : {false, true}) {
      HostTensor out = Poisoned({d.tokens, d.out});
      ASSERT_TRUE(
          Linear({}, out.view(), x.view(), w.view(), with_bias ? b.view() : TensorView{}).ok());
      std::vector<double> want(d.tokens * d.out);
      for (int64_t t = 0; t < d.tokens; ++t) {
        for (int64_t n = 0; n < d.out; ++n) {
          double acc = with_bias ? b.data<float>()[n] : 0.0;
          for (int64_t k = 0; k < d.in; ++k) {
            acc += double(x.data<float>()[t * d.in + k]) * w.data<float>()[n * d.in + k];
          }
          want[t * d.out + n] = acc;
        }
      }
      EXPECT_TRUE(AllClose(out.data<float>(), want, 1e-5, 1e-4))
          << d.tokens << "x" << d.in << " -> " << d.out << (with_bias ? " with bias" : "");
    }
  }
}

TEST(Linear, ErrorsNameTheArgument) {
  std::mt19937 rng(31);
  HostTensor x = Random({7, 33}, rng);
  HostTensor w_bad = Random({65, 34}, rng);
  HostTensor out = Poisoned({7, 65});
  EXPECT_EQ(Linear({}, out.view(), x.view(), w_bad.view(), {}).message,
            "Linear: weight: expected f32 [?, 33], got f32 [65, 34] on cpu");
  HostTensor w = Random({65, 33}, rng);
  HostTensor b_bad = Random({64}, rng);
  EXPECT_EQ(Linear({}, out.view(), x.view(), w.view(), b_bad.view()).message,
            "Linear: bias: expected f32 [65], got f32 [64] on cpu");
  HostTensor x3 = Random({7, 33, 1}, rng);
  EXPECT_EQ(Linear({}, out.view(), x3.view(), w.view(), {}).message,
            "Linear: x: expected f32|bf16|f16 [?, ?], got f32 [7, 33, 1] on cpu");
  TensorView transposed = w.view();
  transposed.shape = {33, 65};
  transposed.strides = {1, 33};
  HostTensor x65 = Random({7, 65}, rng);
  HostTensor out33 = Poisoned({7, 33});
  EXPECT_EQ(Linear({}, out33.view(), x65.view(), transposed, {}).message,
            "Linear: weight: must be contiguous, got f32 [33, 65] on cpu with non-row-major "
            "strides");
}

}  // namespace
}  // namespace llm::ops
