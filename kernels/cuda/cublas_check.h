// Error checking for cuBLAS / cuBLASLt calls: the message names the call, the file, the line and
// cuBLAS's status (name and description).
#ifndef LLM_KERNELS_CUDA_CUBLAS_CHECK_H_
#define LLM_KERNELS_CUDA_CUBLAS_CHECK_H_

#include <cublas_v2.h>

#include <string>

namespace llm::cuda {

// "" when status is CUBLAS_STATUS_SUCCESS, else "file:line: expr failed: NAME (description)".
inline std::string BlasErrorMessage(cublasStatus_t status, const char* expr, const char* file,
                                    int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return {};
  return std::string(file) + ":" + std::to_string(line) + ": " + expr +
         " failed: " + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")";
}

}  // namespace llm::cuda

// Evaluates a cuBLAS(Lt) call; on failure returns its message from the enclosing function, which
// must return std::string (an error message, empty on success).
#define LLM_CUBLAS_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                                   \
    std::string _msg = ::llm::cuda::BlasErrorMessage((expr), #expr, __FILE__, __LINE__); \
    if (!_msg.empty()) return _msg;                                                      \
  } while (0)

#endif  // LLM_KERNELS_CUDA_CUBLAS_CHECK_H_
