// RotaryEmbedding on CUDA against the CPU op: full and partial rotary dims, no scaling,
// linear and llama3 scaling, positions up to 131071. Tolerance: atol 2e-6, rtol 1e-5 (both
// compute the angles and their cos / sin in double; the GPU may fuse the float rotation into
// FMAs).
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Indices;
using gpu_testing::Random;

class CudaRotaryEmbedding : public CudaTest {};

struct Shape {
  int64_t num_heads, num_kv_heads, head_size;
  int rotary_dim;  // 0 = head_size
};

TEST_F(CudaRotaryEmbedding, MatchesCpuForEveryShapeScalingAndTokenCount) {
  std::mt19937 rng(401);
  RopeConfig llama3;
  llama3.theta = 500000.0;
  llama3.scaling = {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 8192};
  RopeConfig linear;
  linear.scaling.type = RopeScaling::Type::kLinear;
  linear.scaling.factor = 4.0;
  for (const Shape shape : {Shape{32, 8, 128, 0}, Shape{8, 8, 64, 32}, Shape{4, 1, 128, 64}}) {
    for (RopeConfig config : {RopeConfig{}, linear, llama3}) {
      config.rotary_dim = shape.rotary_dim;
      for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
        const DType index_type = num_tokens % 2 == 0 ? DType::kI64 : DType::kI32;
        SCOPED_TRACE(::testing::Message()
                     << "heads " << shape.num_heads << "/" << shape.num_kv_heads << ", head "
                     << shape.head_size << ", rotary_dim " << shape.rotary_dim << ", scaling "
                     << static_cast<int>(config.scaling.type) << ", tokens " << num_tokens);
        std::vector<int64_t> pos(num_tokens);
        std::uniform_int_distribution<int64_t> pos_dist(0, 131071);
        for (int64_t& p : pos) p = pos_dist(rng);
        pos[0] = 0;
        HostTensor positions = Indices(pos, index_type);
        HostTensor q = Random({num_tokens, shape.num_heads, shape.head_size}, rng);
        HostTensor k = Random({num_tokens, shape.num_kv_heads, shape.head_size}, rng);
        DeviceTensor d_pos(positions), d_q(q), d_k(k);
        ASSERT_TRUE(RotaryEmbedding({}, positions.view(), q.view(), k.view(), config).ok());
        const OpStatus s = RotaryEmbedding({}, d_pos.view(), d_q.view(), d_k.view(), config);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(Sync(), "");
        EXPECT_TRUE(Close(d_q.Download(), q, 2e-6, 1e-5));
        EXPECT_TRUE(Close(d_k.Download(), k, 2e-6, 1e-5));
      }
    }
  }
}

}  // namespace
}  // namespace llm::ops
