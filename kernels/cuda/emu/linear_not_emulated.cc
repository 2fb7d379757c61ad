// Emulated CUDA: cuBLAS is not emulated yet, so the CUDA Linear fails, naming why (no result
// is made up). linear.cu is left out of the emulated build until it is.
#include "kernels/cuda/cuda_ops.h"

namespace llm::ops::cuda {

OpStatus Linear(void*, void*, const TensorView&, const TensorView&, const TensorView&,
                const TensorView&) {
  return OpStatus::Error("Linear: cuBLAS is not emulated yet (emulated CUDA build)");
}

}  // namespace llm::ops::cuda
