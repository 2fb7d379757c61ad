// Error checking for CUDA runtime calls: the message names the call, the file and the line.
#ifndef LLM_KERNELS_CUDA_CUDA_CHECK_H_
#define LLM_KERNELS_CUDA_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include <string>

namespace llm::cuda {

// "" when err is cudaSuccess, else "file:line: expr failed: <CUDA error string>".
inline std::string ErrorMessage(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return {};
  return std::string(file) + ":" + std::to_string(line) + ": " + expr +
         " failed: " + cudaGetErrorString(err);
}

}  // namespace llm::cuda

// Evaluates a CUDA call; on failure returns its message from the enclosing function, which
// must return std::string (an error message, empty on success).
#define LLM_CUDA_RETURN_IF_ERROR(expr)                                               \
  do {                                                                               \
    std::string _msg = ::llm::cuda::ErrorMessage((expr), #expr, __FILE__, __LINE__); \
    if (!_msg.empty()) return _msg;                                                  \
  } while (0)

#endif  // LLM_KERNELS_CUDA_CUDA_CHECK_H_
