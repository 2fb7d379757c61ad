// The emulated cuBLAS (cuda_emu/cublas.cc): cuBLAS's column-major GEMM semantics with
// every transpose, its argument checks, beta == 0 never reading C, the pointer modes, and the
// math mode's TF32 lowering of CUBLAS_COMPUTE_32F.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace llm::cuda_emu {
namespace {

// op(X)[r][c] of a column-major matrix with leading dimension ld.
float At(const std::vector<float>& x, bool transposed, int ld, int r, int c) {
  return transposed ? x[c + static_cast<size_t>(r) * ld] : x[r + static_cast<size_t>(c) * ld];
}

class EmuCublasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override { cublasDestroy(handle_); }

  float* Upload(const std::vector<float>& h) {
    float* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    buffers_.push_back(d);
    return d;
  }
  std::vector<float> Download(const float* d, size_t n) {
    std::vector<float> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void TearDownBuffers() {
    for (float* d : buffers_) cudaFree(d);
    buffers_.clear();
  }

  cublasHandle_t handle_ = nullptr;
  std::vector<float*> buffers_;
};

TEST_F(EmuCublasTest, GemmIsColumnMajorWithEveryTranspose) {
  std::mt19937 rng(901);
  std::uniform_real_distribution<float> u(-1, 1);
  const int m = 5, n = 7, k = 3;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "transa " << ta << ", transb " << tb);
      // Leading dimensions larger than the rows, as cuBLAS allows.
      const int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
      std::vector<float> a(static_cast<size_t>(lda) * (ta ? m : k));
      std::vector<float> b(static_cast<size_t>(ldb) * (tb ? k : n));
      std::vector<float> c(static_cast<size_t>(ldc) * n);
      for (float& x : a) x = u(rng);
      for (float& x : b) x = u(rng);
      for (float& x : c) x = u(rng);
      const float alpha = 0.5f, beta = -2.0f;
      float* da = Upload(a);
      float* db = Upload(b);
      float* dc = Upload(c);
      ASSERT_EQ(
          cublasGemmEx(handle_, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m,
                       n, k, &alpha, da, CUDA_R_32F, lda, db, CUDA_R_32F, ldb, &beta, dc,
                       CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
          CUBLAS_STATUS_SUCCESS);
      const std::vector<float> got = Download(dc, c.size());
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < ldc; ++i) {
          const size_t at = i + static_cast<size_t>(j) * ldc;
          if (i >= m) {
            EXPECT_EQ(got[at], c[at]) << "padding row " << i << " was written";
            continue;
          }
          double want = 0;
          for (int l = 0; l < k; ++l) want += At(a, ta, lda, i, l) * At(b, tb, ldb, l, j);
          want = alpha * want + beta * c[at];
          EXPECT_NEAR(got[at], want, 1e-5) << i << ", " << j;
        }
      }
      TearDownBuffers();
    }
  }
}

TEST_F(EmuCublasTest, ArgumentsAreCheckedAsCublasDoes) {
  const float one = 1, zero = 0;
  float* d = Upload(std::vector<float>(64, 1.0f));
  auto gemm = [&](cublasOperation_t ta, int m, int n, int k, int lda, int ldb, int ldc,
                  cudaDataType_t type = CUDA_R_32F) {
    return cublasGemmEx(handle_, ta, CUBLAS_OP_N, m, n, k, &one, d, type, lda, d, type, ldb, &zero,
                        d, type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 2, 3, 4, 3, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 2, 3, 3, 3, 4), CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(gemm(CUBLAS_OP_T, 4, 2, 3, 3, 3, 4), CUBLAS_STATUS_SUCCESS);        // lda >= k
  EXPECT_EQ(gemm(CUBLAS_OP_T, 4, 2, 5, 4, 5, 4), CUBLAS_STATUS_INVALID_VALUE);  // lda < k
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 2, 3, 4, 2, 4), CUBLAS_STATUS_INVALID_VALUE);  // ldb < k
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 2, 3, 4, 3, 3), CUBLAS_STATUS_INVALID_VALUE);  // ldc < m
  EXPECT_EQ(gemm(CUBLAS_OP_N, -1, 2, 3, 4, 3, 4), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 0, 0, 0, 1, 1, 1), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 2, 3, 4, 3, 4, CUDA_R_16BF), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(
      cublasGemmEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, d, CUDA_R_32F, 1, d,
                   CUDA_R_32F, 1, &zero, d, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_NOT_INITIALIZED);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  TearDownBuffers();
}

// beta == 0: C is output only, so a NaN there does not reach the result. Alpha and beta may
// also live on the device (CUBLAS_POINTER_MODE_DEVICE).
TEST_F(EmuCublasTest, BetaZeroNeverReadsCAndDevicePointersWork) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float* a = Upload({1, 2});  // [2 x 1]
  float* b = Upload({3});     // [1 x 1]
  float* c = Upload({nan, nan});
  const float one = 1, zero = 0;
  ASSERT_EQ(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 1, 1, &one, a, 2, b, 1, &zero, c, 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Download(c, 2), (std::vector<float>{3, 6}));
  float* scalars = Upload({2, 1});  // alpha 2, beta 1
  ASSERT_EQ(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 1, 1, scalars, a, 2, b, 1,
                        scalars + 1, c, 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Download(c, 2), (std::vector<float>{9, 18}));  // 2 (a b) + c
  TearDownBuffers();
}

// CUBLAS_COMPUTE_32F follows the handle's math mode (TF32 inputs under
// CUBLAS_TF32_TENSOR_OP_MATH); CUBLAS_COMPUTE_32F_PEDANTIC ignores it.
TEST_F(EmuCublasTest, Tf32MathModeLowersCompute32FButNotPedantic) {
  const float x = 1.0f + 0x1.0p-20f;  // not representable in TF32's 10 mantissa bits
  float* a = Upload({x});
  float* b = Upload({1.0f});
  float* c = Upload({0.0f});
  const float one = 1, zero = 0;
  ASSERT_EQ(cublasSetMathMode(handle_, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  auto gemm = [&](cublasComputeType_t compute) {
    EXPECT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a, CUDA_R_32F, 1, b,
                           CUDA_R_32F, 1, &zero, c, CUDA_R_32F, 1, compute, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    return Download(c, 1)[0];
  };
  EXPECT_EQ(gemm(CUBLAS_COMPUTE_32F), 1.0f);
  EXPECT_EQ(gemm(CUBLAS_COMPUTE_32F_PEDANTIC), x);
  ASSERT_EQ(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(CUBLAS_COMPUTE_32F), x);
  TearDownBuffers();
}

}  // namespace
}  // namespace llm::cuda_emu
