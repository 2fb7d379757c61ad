// The emulated cuBLASLt (cuda_emu/cublaslt.cc): the column-major matmul with every
// transpose, bf16 / f16 inputs with f32 accumulation and round-to-nearest-even outputs, the bias
// epilogue, beta, and the argument checks a real cuBLASLt makes.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace llm::cuda_emu {
namespace {

class EmuCublasLtTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cublasLtCreate(&handle_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    for (void* d : buffers_) cudaFree(d);
    cublasLtDestroy(handle_);
  }
  template <typename T>
  T* Upload(const std::vector<T>& h) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    buffers_.push_back(d);
    return static_cast<T*>(d);
  }
  template <typename T>
  std::vector<T> Download(const T* d, size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

  cublasLtHandle_t handle_ = nullptr;
  std::vector<void*> buffers_;
};

// Owns one problem's descriptors.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descs() {
    cublasLtMatmulDescDestroy(op);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
  }
};

TEST_F(EmuCublasLtTest, Bf16MatmulWithBiasAndEveryTranspose) {
  std::mt19937 rng(911);
  std::uniform_real_distribution<float> u(-1, 1);
  const int m = 5, n = 7, k = 9;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "transa " << ta << ", transb " << tb);
      const int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
      std::vector<__nv_bfloat16> a(lda * (ta ? m : k)), b(ldb * (tb ? k : n));
      for (auto& v : a) v = __float2bfloat16_rn(u(rng));
      for (auto& v : b) v = __float2bfloat16_rn(u(rng));
      std::vector<__nv_bfloat16> bias(m), c(ldc * n, __float2bfloat16_rn(NAN));
      for (auto& v : bias) v = __float2bfloat16_rn(u(rng));
      Descs d;
      ASSERT_EQ(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                CUBLAS_STATUS_SUCCESS);
      const int32_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
      const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const __nv_bfloat16* d_bias = Upload(bias);
      ASSERT_EQ(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, 4),
                CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, 4),
                CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, 4),
                CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d_bias,
                                               sizeof(d_bias)),
                CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda),
                CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb),
                CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_16BF, m, n, ldc), CUBLAS_STATUS_SUCCESS);
      const float alpha = 1.0f, beta = 0.0f;
      auto* d_a = Upload(a);
      auto* d_b = Upload(b);
      auto* d_c = Upload(c);
      ASSERT_EQ(cublasLtMatmul(handle_, d.op, &alpha, d_a, d.a, d_b, d.b, &beta, d_c, d.c, d_c, d.c,
                               nullptr, nullptr, 0, nullptr),
                CUBLAS_STATUS_SUCCESS);
      const std::vector<__nv_bfloat16> got = Download(d_c, c.size());
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < m; ++i) {
          float acc = 0;
          for (int l = 0; l < k; ++l) {
            const float av = __bfloat162float(ta ? a[l + i * lda] : a[i + l * lda]);
            const float bv = __bfloat162float(tb ? b[j + l * ldb] : b[l + j * ldb]);
            acc += av * bv;
          }
          const float want = __bfloat162float(__float2bfloat16_rn(acc + __bfloat162float(bias[i])));
          EXPECT_EQ(__bfloat162float(got[i + j * ldc]), want) << i << ", " << j;
        }
        // Rows past m in each column (ld padding) are untouched: still NaN.
        for (int i = m; i < ldc; ++i) EXPECT_TRUE(std::isnan(__bfloat162float(got[i + j * ldc])));
      }
    }
  }
}

TEST_F(EmuCublasLtTest, ArgumentChecks) {
  Descs d;
  ASSERT_EQ(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  // An attribute of the wrong size.
  const int64_t wide = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)),
            CUBLAS_STATUS_INVALID_VALUE);
  // A: 4 x 3, B: 3 x 2, C: 4 x 2 is fine; B 5 x 2 (inner dims differ) and ld < rows are not.
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_32F, 3, 2, 3), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, 4, 2, 4), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint64_t ws = 0;
  ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof(ws)),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  EXPECT_EQ(
      cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, pref, 1, &result, &count),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(
      cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, pref, 0, &result, &count),
      CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayout_t bad_b = nullptr, bad_ld = nullptr, f16_c = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&bad_b, CUDA_R_32F, 5, 2, 5), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&bad_ld, CUDA_R_32F, 4, 3, 3), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&f16_c, CUDA_R_16F, 4, 2, 4), CUBLAS_STATUS_SUCCESS);
  const float alpha = 1, beta = 0;
  float* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 64 * sizeof(float)), cudaSuccess);
  buffers_.push_back(buf);
  EXPECT_EQ(cublasLtMatmul(handle_, d.op, &alpha, buf, d.a, buf, bad_b, &beta, buf, d.c, buf, d.c,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(handle_, d.op, &alpha, buf, bad_ld, buf, d.b, &beta, buf, d.c, buf, d.c,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  // f32 inputs into an f16 output: not a combination cuBLASLt has.
  EXPECT_EQ(cublasLtMatmul(handle_, d.op, &alpha, buf, d.a, buf, d.b, &beta, buf, f16_c, buf, f16_c,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // A workspace size without a workspace.
  EXPECT_EQ(cublasLtMatmul(handle_, d.op, &alpha, buf, d.a, buf, d.b, &beta, buf, d.c, buf, d.c,
                           nullptr, nullptr, 1024, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(nullptr, d.op, &alpha, buf, d.a, buf, d.b, &beta, buf, d.c, buf, d.c,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmul(handle_, d.op, &alpha, buf, d.a, buf, d.b, &beta, buf, d.c, buf, d.c,
                           &result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  // The heuristic's algorithm assumes 256-byte aligned matrices (the default preference): a
  // pointer 4 bytes in is rejected; one chosen for 4-byte alignment takes it.
  EXPECT_EQ(cublasLtMatmul(handle_, d.op, &alpha, buf + 1, d.a, buf, d.b, &beta, buf, d.c, buf, d.c,
                           &result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  const uint32_t four = 4;
  for (const auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &four, sizeof(four)),
              CUBLAS_STATUS_SUCCESS);
  }
  ASSERT_EQ(
      cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, pref, 1, &result, &count),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmul(handle_, d.op, &alpha, buf + 1, d.a, buf + 17, d.b, &beta, buf + 33, d.c,
                           buf + 33, d.c, &result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cublasLtMatrixLayoutDestroy(bad_b);
  cublasLtMatrixLayoutDestroy(bad_ld);
  cublasLtMatrixLayoutDestroy(f16_c);
  cublasLtMatmulPreferenceDestroy(pref);
}

// beta != 0 reads C: D = alpha A B + beta C, in f32 (pedantic: no TF32 rounding).
TEST_F(EmuCublasLtTest, AlphaAndBetaInF32) {
  Descs d;
  ASSERT_EQ(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_32F, 1, 1, 1), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_32F, 1, 1, 1), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, 1, 1, 1), CUBLAS_STATUS_SUCCESS);
  // 1 + 2^-20 has bits TF32 would drop.
  const float x = 1.0f + 0x1p-20f;
  float* d_a = Upload(std::vector<float>{x});
  float* d_b = Upload(std::vector<float>{3.0f});
  float* d_c = Upload(std::vector<float>{10.0f});
  const float alpha = 2.0f, beta = 0.5f;
  ASSERT_EQ(cublasLtMatmul(handle_, d.op, &alpha, d_a, d.a, d_b, d.b, &beta, d_c, d.c, d_c, d.c,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Download(d_c, 1)[0], 2.0f * (x * 3.0f) + 5.0f);
}

}  // namespace
}  // namespace llm::cuda_emu
