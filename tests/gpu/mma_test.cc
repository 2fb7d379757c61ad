// The warp-level matrix functions of kernels/cuda/mma.cuh (mma.sync m16n8k16 bf16 / f16 -> f32,
// ldmatrix x2 / x4, plain and .trans): on a device the PTX instructions, under the emulation
// its implementation of the PTX ISA's fragment layouts. Checked here against those layouts as
// the PTX ISA tables state them (written out again below, independently of mma.cuh):
//   * the fragment coordinate functions, per lane and element;
//   * mma against a reference matmul in double, with A, B and C placed in and D read from the
//     fragments by the tables, several warps per block and chained calls (D fed back as C);
//   * ldmatrix and ldmatrix.trans: each lane's registers hold the elements the tables name, the
//     rows given by per-lane addresses in a scrambled order.
// Built as CUDA for the device run (a .cu wrapper, tests/gpu/CMakeLists.txt) and as C++ for the
// emulated one.
#include "kernels/cuda/mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/launch.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::CudaTest;

// The PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", as its text
// reads: groupID = %laneid >> 2, threadID_in_group = %laneid % 4.
struct RowCol {
  int row, col;
};
// A (.f16 / .bf16, 16x16): a0..a7.
//   row = groupID for a0 and a1; groupID + 8 for a2 and a3; groupID for a4 and a5;
//         groupID + 8 for a6 and a7
//   col = threadID_in_group * 2 + (i & 0x1) for ai where i < 4;
//         threadID_in_group * 2 + (i & 0x1) + 8 for ai where i >= 4
RowCol PtxA(int lane, int i) {
  const int group = lane >> 2, tig = lane % 4;
  int row = 0;
  switch (i) {
    case 0:
    case 1:
    case 4:
    case 5:
      row = group;
      break;
    default:
      row = group + 8;
  }
  const int col = i < 4 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8;
  return {row, col};
}
// B (16x8): b0..b3. row = threadID_in_group * 2 + (i & 0x1) for bi where i < 2;
// threadID_in_group * 2 + (i & 0x1) + 8 for bi where i >= 2. col = groupID.
RowCol PtxB(int lane, int i) {
  const int group = lane >> 2, tig = lane % 4;
  return {i < 2 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8, group};
}
// C / D (16x8 f32): c0..c3. row = groupID for c0 and c1; groupID + 8 for c2 and c3.
// col = threadID_in_group * 2 + (i & 0x1).
RowCol PtxC(int lane, int i) {
  const int group = lane >> 2, tig = lane % 4;
  return {i < 2 ? group : group + 8, tig * 2 + (i & 1)};
}

TEST(MmaLayout, FragmentCoordinatesMatchThePtxTables) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      SCOPED_TRACE(::testing::Message() << "lane " << lane << " element " << i);
      EXPECT_EQ(cuda_mma::AElement(lane, i).row, PtxA(lane, i).row);
      EXPECT_EQ(cuda_mma::AElement(lane, i).col, PtxA(lane, i).col);
      if (i < 4) {
        EXPECT_EQ(cuda_mma::BElement(lane, i).row, PtxB(lane, i).row);
        EXPECT_EQ(cuda_mma::BElement(lane, i).col, PtxB(lane, i).col);
        EXPECT_EQ(cuda_mma::CElement(lane, i).row, PtxC(lane, i).row);
        EXPECT_EQ(cuda_mma::CElement(lane, i).col, PtxC(lane, i).col);
      }
    }
  }
  // Each table covers its matrix exactly once.
  std::vector<int> a(256, 0), b(128, 0), c(128, 0);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) ++a[PtxA(lane, i).row * 16 + PtxA(lane, i).col];
    for (int i = 0; i < 4; ++i) ++b[PtxB(lane, i).row * 8 + PtxB(lane, i).col];
    for (int i = 0; i < 4; ++i) ++c[PtxC(lane, i).row * 8 + PtxC(lane, i).col];
  }
  for (int v : a) EXPECT_EQ(v, 1);
  for (int v : b) EXPECT_EQ(v, 1);
  for (int v : c) EXPECT_EQ(v, 1);
}

// Per lane and element, the tables' coordinates as flat indices (row-major A 16x16, B 16x8 as
// [k][n], C 16x8), uploaded for the kernels: the kernels place and read fragments by these.
struct Tables {
  int a[32][8];
  int b[32][4];
  int c[32][4];
};

Tables MakeTables() {
  Tables t{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) t.a[lane][i] = PtxA(lane, i).row * 16 + PtxA(lane, i).col;
    for (int i = 0; i < 4; ++i) t.b[lane][i] = PtxB(lane, i).row * 8 + PtxB(lane, i).col;
    for (int i = 0; i < 4; ++i) t.c[lane][i] = PtxC(lane, i).row * 8 + PtxC(lane, i).col;
  }
  return t;
}

template <typename T>
__device__ __forceinline__ uint16_t Bits(T v);
template <>
__device__ __forceinline__ uint16_t Bits<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat16_as_ushort(v);
}
template <>
__device__ __forceinline__ uint16_t Bits<__half>(__half v) {
  return __half_as_ushort(v);
}

// Warp w of the block computes d = a[w] b[w] + c[w] `chain` times (d fed back as c):
// a [warps][16][16], b [warps][16][8] (k, n), c, d [warps][16][8].
template <typename T>
__global__ void MmaKernel(const Tables* tables, const T* a, const T* b, const float* c, float* d,
                          int chain) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* wa = a + warp * 256;
  const T* wb = b + warp * 128;
  uint32_t af[4], bf[2];
  for (int r = 0; r < 4; ++r) {
    af[r] = Bits(wa[tables->a[lane][2 * r]]) |
            static_cast<uint32_t>(Bits(wa[tables->a[lane][2 * r + 1]])) << 16;
  }
  for (int r = 0; r < 2; ++r) {
    bf[r] = Bits(wb[tables->b[lane][2 * r]]) |
            static_cast<uint32_t>(Bits(wb[tables->b[lane][2 * r + 1]])) << 16;
  }
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[warp * 128 + tables->c[lane][i]];
  for (int k = 0; k < chain; ++k) cuda_mma::MmaM16N8K16<T>(acc, af, bf, acc);
  for (int i = 0; i < 4; ++i) d[warp * 128 + tables->c[lane][i]] = acc[i];
}

// Shared 32 rows x 24 columns of 16-bit values v(r, c) = r * 64 + c (exact in f16; bf16 holds
// them as bits only, never converted). Lane l points at row perm[l] (a permutation), column
// col0. Out: out[lane][j] = register j.
template <int kNum, bool kTrans>
__global__ void LdMatrixKernel(const int* perm, int col0, uint32_t* out) {
  struct alignas(16) Tile {
    uint16_t v[32][24];
  };
  __shared__ Tile smem;
  uint16_t(*tile)[24] = smem.v;
  for (int e = threadIdx.x; e < 32 * 24; e += 32) tile[e / 24][e % 24] = (e / 24) * 64 + e % 24;
  __syncthreads();
  const int lane = threadIdx.x;
  const void* row = &tile[perm[lane]][col0];
  uint32_t r[kNum];
  if constexpr (kNum == 4) {
    if constexpr (kTrans) {
      cuda_mma::LdMatrixX4Trans(r, row);
    } else {
      cuda_mma::LdMatrixX4(r, row);
    }
  } else {
    if constexpr (kTrans) {
      cuda_mma::LdMatrixX2Trans(r, row);
    } else {
      cuda_mma::LdMatrixX2(r, row);
    }
  }
  for (int j = 0; j < kNum; ++j) out[lane * kNum + j] = r[j];
}

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, n_ * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return data_; }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t n_;
};

class CudaMma : public CudaTest {
 protected:
  template <typename T>
  void CheckMma(int warps, int chain) {
    std::mt19937 rng(7 + warps + chain);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<T> a(warps * 256), b(warps * 128);
    std::vector<double> ad(a.size()), bd(b.size());
    auto round = [](float v) {
      if constexpr (std::is_same_v<T, __half>) {
        return __float2half_rn(v);
      } else {
        return __float2bfloat16_rn(v);
      }
    };
    auto widen = [](T v) -> double {
      if constexpr (std::is_same_v<T, __half>) {
        return __half2float(v);
      } else {
        return __bfloat162float(v);
      }
    };
    for (size_t i = 0; i < a.size(); ++i) ad[i] = widen(a[i] = round(dist(rng)));
    for (size_t i = 0; i < b.size(); ++i) bd[i] = widen(b[i] = round(dist(rng)));
    std::vector<float> c(warps * 128);
    for (float& v : c) v = dist(rng);
    std::vector<float> d(c.size(), NAN);
    const std::vector<Tables> tables = {MakeTables()};
    DeviceBuffer<Tables> d_tables(tables);
    DeviceBuffer<T> d_a(a), d_b(b);
    DeviceBuffer<float> d_c(c), d_d(d);
    ::llm::cuda::Launch(MmaKernel<T>, 1, 32 * warps, 0, nullptr, d_tables.get(), d_a.get(),
                        d_b.get(), d_c.get(), d_d.get(), chain);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(Sync(), "");
    const std::vector<float> got = d_d.Download();
    for (int w = 0; w < warps; ++w) {
      for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 8; ++j) {
          double dot = 0.0;
          for (int k = 0; k < 16; ++k) dot += ad[w * 256 + i * 16 + k] * bd[w * 128 + k * 8 + j];
          const double want = c[w * 128 + i * 8 + j] + chain * dot;
          // f32 accumulation of exact products: a few ulps of the partial sums.
          EXPECT_NEAR(got[w * 128 + i * 8 + j], want, 1e-5 * (1 + chain * 16))
              << "warp " << w << " D[" << i << "][" << j << "]";
        }
      }
    }
  }

  template <int kNum, bool kTrans>
  void CheckLdMatrix(int col0) {
    std::vector<int> perm(32);
    for (int i = 0; i < 32; ++i) perm[i] = (i * 13 + 5) % 32;  // 13 is odd: a permutation
    DeviceBuffer<int> d_perm(perm);
    DeviceBuffer<uint32_t> d_out(std::vector<uint32_t>(32 * kNum, 0xdeadbeefu));
    ::llm::cuda::Launch(LdMatrixKernel<kNum, kTrans>, 1, 32, 0, nullptr, d_perm.get(), col0,
                        d_out.get());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(Sync(), "");
    const std::vector<uint32_t> got = d_out.Download();
    // Matrix j's row q is at the address of lane 8 j + q: tile row perm[8 j + q]. The PTX ISA:
    // each thread receives two elements of one row of each matrix, thread l row l / 4, columns
    // 2 (l % 4) and 2 (l % 4) + 1; with .trans the matrix is transposed, so row and column
    // swap: elements M[2 (l % 4)][l / 4] and M[2 (l % 4) + 1][l / 4].
    auto value = [&](int j, int q, int col) {
      return static_cast<uint32_t>(perm[8 * j + q] * 64 + col0 + col);
    };
    for (int l = 0; l < 32; ++l) {
      for (int j = 0; j < kNum; ++j) {
        uint32_t lo, hi;
        if (kTrans) {
          lo = value(j, 2 * (l % 4), l / 4);
          hi = value(j, 2 * (l % 4) + 1, l / 4);
        } else {
          lo = value(j, l / 4, 2 * (l % 4));
          hi = value(j, l / 4, 2 * (l % 4) + 1);
        }
        EXPECT_EQ(got[l * kNum + j], lo | hi << 16) << "lane " << l << " register " << j;
      }
    }
  }
};

TEST_F(CudaMma, Bf16MatchesReferenceMatmul) { CheckMma<__nv_bfloat16>(1, 1); }
TEST_F(CudaMma, F16MatchesReferenceMatmul) { CheckMma<__half>(1, 1); }
TEST_F(CudaMma, SeveralWarpsAndChainedCalls) {
  CheckMma<__nv_bfloat16>(4, 3);
  CheckMma<__half>(3, 5);
}

TEST_F(CudaMma, LdMatrixX4) { CheckLdMatrix<4, false>(0); }
TEST_F(CudaMma, LdMatrixX4Trans) { CheckLdMatrix<4, true>(8); }
TEST_F(CudaMma, LdMatrixX2) { CheckLdMatrix<2, false>(16); }
TEST_F(CudaMma, LdMatrixX2Trans) { CheckLdMatrix<2, true>(0); }

}  // namespace
}  // namespace llm::ops
