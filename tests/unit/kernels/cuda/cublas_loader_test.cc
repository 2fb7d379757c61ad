// kernels/cuda/cublas_loader.cc: cuBLAS and cuBLASLt are not mapped into a process that has not
// called them, and the first call loads the real libraries and forwards to them. Needs the CUDA
// toolkit's libraries, not a GPU (a status name comes from the library, not the device).
#include <cublas_v2.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace {

bool Mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(library) != std::string::npos) return true;
  }
  return false;
}

TEST(CublasLoader, LoadsTheLibrariesAtTheFirstCallAndForwardsToThem) {
  EXPECT_FALSE(Mapped("libcublasLt.so"));
  EXPECT_FALSE(Mapped("libcublas.so"));
  // Without the libraries the loader answers CUBLAS_STATUS_NOT_INITIALIZED's name for any status.
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_TRUE(Mapped("libcublasLt.so"));
  EXPECT_TRUE(Mapped("libcublas.so"));
}

}  // namespace
