// Mixture-of-experts routing and combination on CUDA (kernels/ops.h: MoeRoute, MoeCombine)
// against the CPU model's host routing (worker_service/model/moe_routing.cc) and the CPU ops.
// MoeRoute: the expert choices, the sort and the offsets exactly; the weights within 1e-6
// relative (the same float operations; expf on a GPU is within 2 ulp of the host's, identical
// under the emulation). Ties are exercised by logits drawn from a few integers (exactly equal
// probabilities: the lower expert wins on both sides). MoeCombine: atol 1e-6, rtol 1e-5 in f32
// (fp32 sums in the same order; FMA contraction may differ), plus the one output rounding for
// bf16 / f16; and bit-identical from run to run (no atomics).
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "worker_service/model/moe_routing.h"

namespace llm::ops {
namespace {

using gpu_testing::BitEqual;
using gpu_testing::Close;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Poisoned;
using gpu_testing::Random;

class CudaMoe : public CudaTest {};

struct RouteCase {
  int64_t tokens;
  int experts;
  int k;
  bool normalize;
  bool ties;  // logits from {0, 1, 2}: many exactly equal probabilities
};

TEST_F(CudaMoe, RouteEqualsTheHostRoutingOnRandomLogitsWithTies) {
  std::mt19937 rng(71);
  const std::vector<RouteCase> cases = {
      {1, 8, 2, true, false},    {37, 8, 2, true, false},     {37, 6, 2, false, false},
      {300, 64, 8, true, false}, {129, 128, 8, false, false}, {5, 4, 4, true, false},
      {64, 8, 1, false, false},  {50, 8, 2, true, true},      {50, 6, 3, false, true},
      {200, 16, 4, true, true},
  };
  for (const RouteCase& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "tokens " << c.tokens << ", experts " << c.experts << ", k " << c.k
                 << (c.normalize ? ", normalized" : "") << (c.ties ? ", ties" : ""));
    const int64_t t = c.tokens, e = c.experts, k = c.k, pairs = t * k;
    HostTensor logits = Random({t, e}, rng, -4.0f, 4.0f);
    if (c.ties) {
      std::uniform_int_distribution<int> level(0, 2);
      for (int64_t i = 0; i < t * e; ++i) logits.data<float>()[i] = static_cast<float>(level(rng));
    }
    MoeRouting host;
    host.Route(std::span<const float>(logits.data<float>(), static_cast<size_t>(t * e)), t,
               static_cast<int>(e), static_cast<int>(k), c.normalize);
    // The CPU op is the same routing as the model's host routing.
    HostTensor offsets(DType::kI32, {e + 1}), sorted(DType::kI32, {pairs}),
        experts(DType::kI32, {t, k}), weights(DType::kF32, {t, k}), positions(DType::kI32, {t, k});
    ASSERT_TRUE(MoeRoute({}, offsets.view(), sorted.view(), experts.view(), weights.view(),
                         positions.view(), logits.view(), static_cast<int>(k), c.normalize)
                    .ok());
    DeviceTensor d_logits(logits), d_offsets(offsets), d_sorted(sorted), d_experts(experts),
        d_weights(weights), d_positions(positions);
    for (DeviceTensor* d : {&d_offsets, &d_sorted, &d_experts, &d_weights, &d_positions}) {
      d->Poison();
    }
    const OpStatus s =
        MoeRoute({}, d_offsets.view(), d_sorted.view(), d_experts.view(), d_weights.view(),
                 d_positions.view(), d_logits.view(), static_cast<int>(k), c.normalize);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    const HostTensor g_offsets = d_offsets.Download(), g_sorted = d_sorted.Download();
    const HostTensor g_experts = d_experts.Download(), g_weights = d_weights.Download();
    const HostTensor g_positions = d_positions.Download();
    EXPECT_TRUE(BitEqual(g_offsets, offsets));
    EXPECT_TRUE(BitEqual(g_sorted, sorted));
    EXPECT_TRUE(BitEqual(g_experts, experts));
    EXPECT_TRUE(BitEqual(g_positions, positions));
    EXPECT_TRUE(Close(g_weights, weights, 0.0, 1e-6));
    // Against moe_routing.cc: offsets and tokens by sorted position; each pair's weight at its
    // sorted position.
    for (int64_t x = 0; x <= e; ++x) {
      ASSERT_EQ(g_offsets.data<int32_t>()[x], host.offsets[x]) << "offset " << x;
      ASSERT_EQ(offsets.data<int32_t>()[x], host.offsets[x]) << "cpu op offset " << x;
    }
    for (int64_t i = 0; i < pairs; ++i) {
      ASSERT_EQ(g_sorted.data<int32_t>()[i], host.tokens[i]) << "sorted position " << i;
      const int32_t at = g_positions.data<int32_t>()[i];
      ASSERT_GE(at, 0);
      ASSERT_LT(at, pairs);
      ASSERT_EQ(g_sorted.data<int32_t>()[at], i / k) << "pair " << i;
      const int32_t ex = g_experts.data<int32_t>()[i];
      ASSERT_GE(at, host.offsets[ex]);
      ASSERT_LT(at, host.offsets[ex + 1]);
      EXPECT_NEAR(g_weights.data<float>()[i], host.weights[at], 1e-6 * host.weights[at])
          << "pair " << i;
      EXPECT_EQ(weights.data<float>()[i], host.weights[at]) << "cpu op pair " << i;
    }
  }
}

// The combination: the routing of random logits, random expert rows, with and without a shared
// expert, against the CPU op.
void RunCombine(DType dtype, bool with_shared, std::mt19937& rng) {
  for (const int64_t t : {int64_t{1}, int64_t{19}, int64_t{130}}) {
    for (const int64_t h : {int64_t{32}, int64_t{1000}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << (with_shared ? ", shared" : "")
                                        << ", tokens " << t << ", hidden " << h);
      const int k = 2, e = 8;
      const int64_t pairs = t * k;
      HostTensor logits = Random({t, e}, rng, -4.0f, 4.0f);
      HostTensor offsets(DType::kI32, {e + 1}), sorted(DType::kI32, {pairs}),
          experts(DType::kI32, {t, k}), weights(DType::kF32, {t, k}),
          positions(DType::kI32, {t, k});
      ASSERT_TRUE(MoeRoute({}, offsets.view(), sorted.view(), experts.view(), weights.view(),
                           positions.view(), logits.view(), k, true)
                      .ok());
      HostTensor rows = Random({pairs, h}, rng, -2.0f, 2.0f);
      HostTensor shared = Random({t, h}, rng, -2.0f, 2.0f);
      HostTensor gate = Random({t, 1}, rng, -3.0f, 3.0f);
      if (dtype != DType::kF32) {
        rows = gpu_testing::RoundedThroughHalf(rows, dtype);
        shared = gpu_testing::RoundedThroughHalf(shared, dtype);
      }
      HostTensor want = Poisoned({t, h});
      const TensorView none;
      ASSERT_TRUE(MoeCombine({}, want.view(), rows.view(), weights.view(), positions.view(),
                             with_shared ? shared.view() : none, with_shared ? gate.view() : none)
                      .ok());
      auto on_device = [&](const HostTensor& x) {
        return dtype == DType::kF32 ? DeviceTensor(x) : DeviceTensor(gpu_testing::ToHalf(x, dtype));
      };
      DeviceTensor d_rows = on_device(rows), d_shared = on_device(shared), d_gate(gate);
      DeviceTensor d_weights(weights), d_positions(positions);
      HostTensor got[2];
      for (HostTensor& g : got) {
        DeviceTensor d_out = on_device(want);
        d_out.Poison();
        const OpStatus s =
            MoeCombine({}, d_out.view(), d_rows.view(), d_weights.view(), d_positions.view(),
                       with_shared ? d_shared.view() : none, with_shared ? d_gate.view() : none);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        g = d_out.Download();
      }
      EXPECT_TRUE(BitEqual(got[0], got[1]));  // deterministic
      if (dtype == DType::kF32) {
        EXPECT_TRUE(Close(got[0], want, 1e-6, 1e-5));
      } else {
        EXPECT_TRUE(
            Close(gpu_testing::HalfToF32(got[0]), want, 1e-6, gpu_testing::HalfRtol(dtype) + 1e-5));
      }
    }
  }
}

TEST_F(CudaMoe, CombineMatchesCpuAndRepeatsBitForBit) {
  std::mt19937 rng(73);
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const bool with_shared : {false, true}) {
      ASSERT_NO_FATAL_FAILURE(RunCombine(dtype, with_shared, rng));
    }
  }
}

TEST_F(CudaMoe, BadArgumentsAreErrorsNamingThem) {
  HostTensor logits(DType::kF32, {3, 4}), offsets(DType::kI32, {5}), sorted(DType::kI32, {15}),
      experts(DType::kI32, {3, 5}), weights(DType::kF32, {3, 5}), positions(DType::kI32, {3, 5});
  EXPECT_EQ(MoeRoute({}, offsets.view(), sorted.view(), experts.view(), weights.view(),
                     positions.view(), logits.view(), 5, true)
                .message,
            "MoeRoute: k: expected 1 <= k <= 4 experts, got 5");
  HostTensor out(DType::kF32, {3, 8}), rows(DType::kF32, {6, 8}), w(DType::kF32, {3, 2}),
      pos(DType::kI32, {3, 2}), shared(DType::kF32, {3, 8});
  std::memset(pos.data<int32_t>(), 0, 6 * sizeof(int32_t));
  EXPECT_EQ(
      MoeCombine({}, out.view(), rows.view(), w.view(), pos.view(), shared.view(), {}).message,
      "MoeCombine: shared and shared_gate: expected both present or both absent");
  pos.data<int32_t>()[3] = 6;
  EXPECT_EQ(MoeCombine({}, out.view(), rows.view(), w.view(), pos.view(), {}, {}).message,
            "MoeCombine: positions: 6 is outside [0, 6)");
}

}  // namespace
}  // namespace llm::ops
