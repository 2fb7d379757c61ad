// Emulated CUDA (LLM_CUDA_EMU): the data types of the toolkit's library_types.h that the
// emulated cuBLAS takes (values as the toolkit's).
#ifndef LLM_CUDA_EMU_INCLUDE_LIBRARY_TYPES_H_
#define LLM_CUDA_EMU_INCLUDE_LIBRARY_TYPES_H_

enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10,
  CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;

#endif  // LLM_CUDA_EMU_INCLUDE_LIBRARY_TYPES_H_
