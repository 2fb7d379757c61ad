// Warp-level tensor-core matrix instructions (sm_80+) as small device functions:
//   mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32   D = A B + C
//   ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].shared.b16
// Under nvcc they are the PTX instructions (inline asm). Under the CUDA emulation
// (LLM_CUDA_EMU) they exchange the lanes' registers (emu/warp_exchange.h) and compute with the
// PTX ISA's fragment layouts exactly ("Matrix Fragments for mma.m16n8k16 with floating point
// type" and "Warp-level matrix load instruction: ldmatrix"), so that a kernel's index math runs
// and is tested without a GPU. Every lane of the warp must call them together (.aligned).
//
// Fragments (lane = 0..31, g = lane >> 2 (groupID), t = lane % 4 (threadID_in_group)):
//   A, 16x16 row-major, four .b32 registers of two 16-bit elements each (the lower half first):
//     a[0] = A[g][2t, 2t+1]  a[1] = A[g+8][2t, 2t+1]  a[2] = A[g][2t+8, 2t+9]
//     a[3] = A[g+8][2t+8, 2t+9]
//   B, 16x8 (K x N) "col": two .b32 registers:
//     b[0] = B[2t, 2t+1][g]  b[1] = B[2t+8, 2t+9][g]
//   C, D, 16x8 f32: c[0] = C[g][2t]  c[1] = C[g][2t+1]  c[2] = C[g+8][2t]  c[3] = C[g+8][2t+1]
// ldmatrix (8x8 matrices of 16-bit elements, one 16-byte row per address): lane l gives the
// address of row l % 8 of matrix l / 8 (x4: lanes 0..31; x2: lanes 0..15, the other lanes'
// addresses are ignored) and gets in register j, of matrix j:
//   plain:  M[l / 4][2 (l % 4)], M[l / 4][2 (l % 4) + 1]       (the A / B fragment layout)
//   .trans: M[2 (l % 4)][l / 4], M[2 (l % 4) + 1][l / 4]       (the transpose's)
// So for a row-major 16x16 A tile, x4 with lane l pointing at row l % 16, column 8 (l / 16)
// gives a[0..3]; for B = X^T with X [N][K] row-major (K^T in attention), x4 over rows n..n+7
// and columns k..k+31 gives b[0..1] of two k-steps; for B = X with X [K][N] row-major (V in
// attention), x4.trans gives b[0..1] of two n-tiles.
#ifndef LLM_KERNELS_CUDA_MMA_CUH_
#define LLM_KERNELS_CUDA_MMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#ifdef LLM_CUDA_EMU
#include "cuda_emu/warp_exchange.h"
#endif

namespace llm::cuda_mma {

// The element coordinates of fragment element i of `lane` (host and device; the emulation is
// built on them, and tests check them against the PTX tables).
struct Coord {
  int row, col;
};
// A (16x16): element i in 0..7 (register i / 2, half i % 2).
__host__ __device__ constexpr Coord AElement(int lane, int i) {
  return {(lane >> 2) + 8 * ((i >> 1) & 1), 2 * (lane & 3) + (i & 1) + 8 * (i >> 2)};
}
// B (16x8, row = k, col = n): element i in 0..3 (register i / 2, half i % 2).
__host__ __device__ constexpr Coord BElement(int lane, int i) {
  return {2 * (lane & 3) + (i & 1) + 8 * (i >> 1), lane >> 2};
}
// C / D (16x8): element i in 0..3.
__host__ __device__ constexpr Coord CElement(int lane, int i) {
  return {(lane >> 2) + 8 * (i >> 1), 2 * (lane & 3) + (i & 1)};
}

// Two floats as one .b32 of two 16-bit T (lo in the lower half), rounding to nearest.
template <typename T>
__device__ __forceinline__ uint32_t PackFloats(float lo, float hi) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
#ifdef LLM_CUDA_EMU
  uint32_t l, h;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
    h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  } else {
    l = __half_as_ushort(__float2half_rn(lo));
    h = __half_as_ushort(__float2half_rn(hi));
  }
  return l | h << 16;
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
#endif
}

#ifdef LLM_CUDA_EMU
namespace emu {

template <typename T>
inline float Half(uint32_t reg, int which) {
  const auto bits = static_cast<unsigned short>(which == 0 ? reg & 0xffffu : reg >> 16);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

inline int Lane() { return ::llm::cuda_emu::LinearThreadIndex() % 32; }

// ldmatrix of kNum matrices: every lane publishes its row address, then reads its elements.
template <int kNum, bool kTrans>
inline void LdMatrix(uint32_t* r, const void* row, std::source_location where) {
  const uint64_t p = reinterpret_cast<uintptr_t>(row);
  const uint32_t mine[2] = {static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32)};
  const auto all = ::llm::cuda_emu::WarpExchange(mine, where);
  const uint16_t* rows[32];
  for (int i = 0; i < 32; ++i) {
    rows[i] = reinterpret_cast<const uint16_t*>(static_cast<uintptr_t>(all[i][0]) |
                                                static_cast<uintptr_t>(all[i][1]) << 32);
  }
  const int l = Lane();
  for (int j = 0; j < kNum; ++j) {
    const uint16_t *r0, *r1;  // the rows of matrix j this lane reads, and the columns
    int c0, c1;
    if constexpr (kTrans) {
      r0 = rows[8 * j + 2 * (l % 4)];
      r1 = rows[8 * j + 2 * (l % 4) + 1];
      c0 = c1 = l / 4;
    } else {
      r0 = r1 = rows[8 * j + l / 4];
      c0 = 2 * (l % 4);
      c1 = c0 + 1;
    }
    r[j] = static_cast<uint32_t>(r0[c0]) | static_cast<uint32_t>(r1[c1]) << 16;
  }
}

template <typename T>
inline void Mma(float* d, const uint32_t* a, const uint32_t* b, const float* c,
                std::source_location where) {
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  const auto all = ::llm::cuda_emu::WarpExchange(mine, where);
  // A[row][k] and B[k][col] from the lanes that hold them (the inverse of AElement, BElement).
  auto a_at = [&](int row, int k) {
    const int lane = (row % 8) * 4 + (k % 8) / 2, reg = row / 8 + 2 * (k / 8);
    return Half<T>(all[lane][reg], k % 2);
  };
  auto b_at = [&](int k, int col) {
    const int lane = col * 4 + (k % 8) / 2, reg = k / 8;
    return Half<T>(all[lane][4 + reg], k % 2);
  };
  const int l = Lane();
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const Coord e = CElement(l, i);
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc += a_at(e.row, k) * b_at(k, e.col);
    out[i] = acc;
  }
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

}  // namespace emu
#endif  // LLM_CUDA_EMU

// d = a b + c (d may alias c). T: __nv_bfloat16 or __half.
template <typename T>
__device__ __forceinline__ void MmaM16N8K16(
    float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]
#ifdef LLM_CUDA_EMU
    ,
    std::source_location where = std::source_location::current()
#endif
) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
#ifdef LLM_CUDA_EMU
  emu::Mma<T>(d, a, b, c, where);
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  }
#endif
}

#ifdef LLM_CUDA_EMU
#define LLM_MMA_WHERE_PARAM , std::source_location where = std::source_location::current()
#else
#define LLM_MMA_WHERE_PARAM
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// row: this lane's row address in shared memory (16-byte aligned).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row LLM_MMA_WHERE_PARAM) {
#ifdef LLM_CUDA_EMU
  emu::LdMatrix<4, false>(r, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(row)));
#endif
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4],
                                                const void* row LLM_MMA_WHERE_PARAM) {
#ifdef LLM_CUDA_EMU
  emu::LdMatrix<4, true>(r, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(row)));
#endif
}

__device__ __forceinline__ void LdMatrixX2(uint32_t (&r)[2], const void* row LLM_MMA_WHERE_PARAM) {
#ifdef LLM_CUDA_EMU
  emu::LdMatrix<2, false>(r, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SharedAddress(row)));
#endif
}

__device__ __forceinline__ void LdMatrixX2Trans(uint32_t (&r)[2],
                                                const void* row LLM_MMA_WHERE_PARAM) {
#ifdef LLM_CUDA_EMU
  emu::LdMatrix<2, true>(r, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SharedAddress(row)));
#endif
}

#undef LLM_MMA_WHERE_PARAM

}  // namespace llm::cuda_mma

#endif  // LLM_KERNELS_CUDA_MMA_CUH_
