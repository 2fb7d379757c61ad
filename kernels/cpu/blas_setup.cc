#include "kernels/cpu/blas_setup.h"

#include <cblas.h>
#include <strings.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "common/reexec.h"

namespace llm::cpu {

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

void ReexecWithMatchingBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (strcasecmp(BlasCoreName().c_str(), "prescott") != 0) return;
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f")) {
    core = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    core = "Haswell";
  }
  if (core == nullptr) return;
  setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/1);
  ReexecSelf(argv);
  // Still here: exec failed; run on with the slower kernels.
  std::fprintf(stderr, "note: OpenBLAS uses Prescott kernels; restarting with %s ones failed\n",
               core);
}

}  // namespace llm::cpu
