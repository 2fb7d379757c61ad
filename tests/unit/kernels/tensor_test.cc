// TensorView: strides, contiguity, printing; HostTensor alignment.
#include "kernels/tensor.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace llm {
namespace {

TEST(TensorView, ContiguousHasRowMajorStrides) {
  float data[2 * 3 * 4];
  const TensorView v = TensorView::Contiguous(data, DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.nbytes(), 96u);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.ToString(), "f32 [2, 3, 4] on cpu");
}

TEST(TensorView, TransposedIsNotContiguous) {
  float data[6];
  TensorView v = TensorView::Contiguous(data, DType::kF32, {2, 3});
  std::swap(v.shape[0], v.shape[1]);
  std::swap(v.strides[0], v.strides[1]);
  EXPECT_FALSE(v.is_contiguous());
}

TEST(TensorView, TooManyDimsIsInvalid) {
  const TensorView v = TensorView::Contiguous(nullptr, DType::kF32, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(v.ndim, -1);
  EXPECT_EQ(v.ShapeString(), "[more than 5 dims]");
}

TEST(TensorView, DeviceAndDTypeNames) {
  EXPECT_EQ(TensorDevice::Cuda(3).ToString(), "cuda:3");
  EXPECT_EQ(TensorDevice::Cpu().ToString(), "cpu");
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
}

TEST(HostTensor, IsAlignedAndSized) {
  HostTensor t(DType::kI32, {5, 7});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data<int32_t>()) % 64, 0u);
  EXPECT_EQ(t.numel(), 35);
  EXPECT_EQ(t.view().dtype, DType::kI32);
  HostTensor empty(DType::kF32, {0, 4});
  EXPECT_NE(empty.data<float>(), nullptr);
  EXPECT_EQ(empty.numel(), 0);
}

}  // namespace
}  // namespace llm
