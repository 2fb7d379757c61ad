// Helpers for the CPU op tests: random and poisoned (NaN) host tensors, index tensors, an
// element-wise comparison that reports the first mismatch, and the checks the gated activations
// (SiLU, GeGLU) share.
#ifndef LLM_TESTS_UNIT_KERNELS_TEST_UTIL_H_
#define LLM_TESTS_UNIT_KERNELS_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/tensor.h"

namespace llm::ops::testing {

// Uniform in [lo, hi).
inline HostTensor Random(std::initializer_list<int64_t> shape, std::mt19937& rng, float lo = -1.0f,
                         float hi = 1.0f) {
  HostTensor t(DType::kF32, shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Every element NaN: what an op does not write stays NaN and fails any comparison.
inline HostTensor Poisoned(std::initializer_list<int64_t> shape) {
  HostTensor t(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return t;
}

// The input [1, 2n] of a gated activation (SiluAndMul, GeluTanhAndMul): the n gates, then n
// copies of `up`.
inline HostTensor GatedRow(const std::vector<float>& gates, float up) {
  const int64_t n = static_cast<int64_t>(gates.size());
  HostTensor x(DType::kF32, {1, 2 * n});
  for (int64_t i = 0; i < n; ++i) {
    x.data<float>()[i] = gates[i];
    x.data<float>()[n + i] = up;
  }
  return x;
}

// Tensor parallelism splits a gated activation's rows over the ranks: an element's result must
// not depend on where in the row it falls (a partial register at the end of one rank's half, a
// full one in the whole row). `op(out, x)` is the op; rows of 42, halves of 21.
template <class Op>
void ExpectHalvesOfARowGiveTheWholeRowsBits(Op op, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t tokens = 5, inter = 42;
  HostTensor x = Random({tokens, 2 * inter}, rng, -8.0f, 8.0f);
  HostTensor whole = Poisoned({tokens, inter});
  ASSERT_TRUE(op(whole.view(), x.view()).ok());
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t n = inter / 2;
    HostTensor xh(DType::kF32, {tokens, 2 * n}), oh = Poisoned({tokens, n});
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < n; ++i) {
        xh.data<float>()[t * 2 * n + i] = x.data<float>()[t * 2 * inter + half * n + i];
        xh.data<float>()[t * 2 * n + n + i] = x.data<float>()[t * 2 * inter + inter + half * n + i];
      }
    }
    ASSERT_TRUE(op(oh.view(), xh.view()).ok());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(oh.data<float>()[t * n + i], whole.data<float>()[t * inter + half * n + i])
            << "token " << t << ", half " << half << ", element " << i;
      }
    }
  }
}

// A gated activation's shape errors name the op and the argument: an odd last dim of x, an out
// of the wrong width.
template <class Op>
void ExpectGatedShapeErrorsNameTheArgument(Op op, const std::string& name) {
  std::mt19937 rng(21);
  HostTensor odd = Random({2, 7}, rng);
  HostTensor out = Poisoned({2, 3});
  EXPECT_EQ(op(out.view(), odd.view()).message,
            name + ": x: expected an even last dim [T, 2 * I], got f32 [2, 7] on cpu");
  HostTensor x = Random({2, 8}, rng);
  EXPECT_EQ(op(out.view(), x.view()).message,
            name + ": out: expected f32 [2, 4], got f32 [2, 3] on cpu");
}

// A 1-D or 2-D index tensor holding `values` (i32 or i64).
inline HostTensor Indices(const std::vector<int64_t>& values, DType dtype,
                          std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape.push_back(static_cast<int64_t>(values.size()));
  HostTensor t(dtype, shape);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kI64) {
      t.data<int64_t>()[i] = values[i];
    } else {
      t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
    }
  }
  return t;
}

inline std::vector<float> ToVector(const HostTensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

// |got - want| <= atol + rtol * |want| everywhere (NaN never passes).
inline ::testing::AssertionResult AllClose(const float* got, const std::vector<double>& want,
                                           double atol, double rtol) {
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= atol + rtol * std::abs(want[i]))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << want.size() << " elements differ; first at " << first << ": got "
         << got[first] << ", want " << want[first] << " (atol " << atol << ", rtol " << rtol << ")";
}

// Token-strided views (kernels/ops.h), as the model's q, k and v inside the rows of its fused
// qkv projection: a [T, row] buffer whose columns col .. col + H * D - 1 are a [T, H, D] view.

// A [T, row] tensor of `dtype` with every byte 0xFF (NaN in f32, bf16 and f16).
inline HostTensor PoisonedRows(DType dtype, int64_t tokens, int64_t row) {
  HostTensor t(dtype, {tokens, row});
  std::memset(t.view().data, 0xFF, t.view().nbytes());
  return t;
}

// rows[t][col + i] = heads[t][i] for the [T, H, D] contiguous `heads` (the same dtype).
inline void PutHeads(const HostTensor& rows, int64_t col, const HostTensor& heads) {
  const size_t esize = DTypeSize(heads.view().dtype);
  const int64_t tokens = heads.view().shape[0],
                width = heads.numel() / std::max<int64_t>(tokens, 1);
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(static_cast<char*>(rows.view().data) + (t * rows.view().shape[1] + col) * esize,
                static_cast<const char*>(heads.view().data) + t * width * esize, width * esize);
  }
}

// The token-strided [T, heads, head_size] view of columns col .. of the [T, row] view `rows`
// (host or device): strides [row, head_size, 1].
inline TensorView HeadsView(const TensorView& rows, int64_t col, int64_t heads, int64_t head_size) {
  TensorView v = rows;
  v.data = static_cast<char*>(rows.data) + col * DTypeSize(rows.dtype);
  v.ndim = 3;
  v.shape = {rows.shape[0], heads, head_size};
  v.strides = {rows.shape[1], head_size, 1};
  return v;
}

// Whether a and b hold the same bytes.
inline bool SameBytes(const HostTensor& a, const HostTensor& b) {
  return a.view().nbytes() == b.view().nbytes() &&
         std::memcmp(a.view().data, b.view().data, a.view().nbytes()) == 0;
}

}  // namespace llm::ops::testing

#endif  // LLM_TESTS_UNIT_KERNELS_TEST_UTIL_H_
