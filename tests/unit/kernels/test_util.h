// Helpers for the CPU op tests: random and poisoned (NaN) host tensors, index tensors, and an
// element-wise comparison that reports the first mismatch.
#ifndef LLM_TESTS_UNIT_KERNELS_TEST_UTIL_H_
#define LLM_TESTS_UNIT_KERNELS_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
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

}  // namespace llm::ops::testing

#endif  // LLM_TESTS_UNIT_KERNELS_TEST_UTIL_H_
