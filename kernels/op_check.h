// Argument checks shared by the op dispatchers (kernels/ops.cc) and backends: each returns an
// error that names the op and the argument, with the expected and the actual dtype and shape.
#ifndef LLM_KERNELS_OP_CHECK_H_
#define LLM_KERNELS_OP_CHECK_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm::ops::internal {

// Matches any size in CheckArg's expected shape.
inline constexpr int64_t kAny = -1;

// `t` has one of `dtypes`, exactly dims.size() dimensions whose sizes match `dims` (kAny
// matches any size >= 0), is contiguous, and has data unless it is empty.
OpStatus CheckArg(const char* op, const char* arg, const TensorView& t,
                  std::initializer_list<DType> dtypes, std::initializer_list<int64_t> dims);

// CheckArg for a [T, H, D] view that may be token-strided (kernels/ops.h): strides
// [token_stride, D, 1] with token_stride >= H * D (a dim of size 1 may have any stride). The
// backends index token t's heads at data + t * strides[0].
OpStatus CheckTokenStridedArg(const char* op, const char* arg, const TensorView& t,
                              std::initializer_list<DType> dtypes,
                              std::initializer_list<int64_t> dims);

// The elements between token t's and token t + 1's heads in a view CheckTokenStridedArg
// accepted: strides[0], or H * D when there is at most one token (whose stride may be anything).
inline int64_t TokenStride(const TensorView& t) {
  return t.shape[0] <= 1 ? t.shape[1] * t.shape[2] : t.strides[0];
}

// Every present tensor of `args` is on the device of the first one, which is returned in
// *device.
struct NamedView {
  const char* name;
  const TensorView* view;
};
OpStatus CheckSameDevice(const char* op, std::initializer_list<NamedView> args,
                         TensorDevice* device);

// The error of a tensor on a device this build has no backend for.
OpStatus NoBackend(const char* op, const TensorDevice& device);

// Reads element i of an i32 or i64 index tensor on the host.
inline int64_t IndexAt(const TensorView& t, int64_t i) {
  return t.dtype == DType::kI64 ? t.data_as<const int64_t>()[i]
                                : static_cast<int64_t>(t.data_as<const int32_t>()[i]);
}

// "op: message".
OpStatus Error(const char* op, const std::string& message);

}  // namespace llm::ops::internal

#endif  // LLM_KERNELS_OP_CHECK_H_
