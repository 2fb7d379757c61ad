// Argument checks for the ops: messages name the op, the argument, expected and actual.
#include "kernels/op_check.h"

namespace llm::ops::internal {
namespace {

std::string Expected(std::initializer_list<DType> dtypes, std::initializer_list<int64_t> dims) {
  std::string s;
  bool first = true;
  for (DType d : dtypes) {
    if (!first) s += "|";
    s += DTypeName(d);
    first = false;
  }
  s += " [";
  first = true;
  for (int64_t d : dims) {
    if (!first) s += ", ";
    s += d == kAny ? std::string("?") : std::to_string(d);
    first = false;
  }
  return s + "]";
}

// The dtype and shape part of CheckArg.
OpStatus CheckDTypeAndShape(const char* op, const char* arg, const TensorView& t,
                            std::initializer_list<DType> dtypes,
                            std::initializer_list<int64_t> dims) {
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || d == t.dtype;
  bool shape_ok = t.ndim == static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) {
    if (!shape_ok) break;
    shape_ok = t.shape[i] >= 0 && (d == kAny || t.shape[i] == d);
    ++i;
  }
  if (!dtype_ok || !shape_ok) {
    return Error(
        op, std::string(arg) + ": expected " + Expected(dtypes, dims) + ", got " + t.ToString());
  }
  return OpStatus::Ok();
}

std::string StridesString(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i > 0 ? ", " : "") + std::to_string(t.strides[i]);
  return s + "]";
}

}  // namespace

OpStatus Error(const char* op, const std::string& message) {
  return OpStatus::Error(std::string(op) + ": " + message);
}

OpStatus CheckTokenStridedArg(const char* op, const char* arg, const TensorView& t,
                              std::initializer_list<DType> dtypes,
                              std::initializer_list<int64_t> dims) {
  if (OpStatus st = CheckDTypeAndShape(op, arg, t, dtypes, dims); !st.ok()) return st;
  if (t.ndim != 3) return Error(op, std::string(arg) + ": expected 3 dims, got " + t.ToString());
  const int64_t tokens = t.shape[0], heads = t.shape[1], head_size = t.shape[2];
  const bool ok = (head_size <= 1 || t.strides[2] == 1) &&
                  (heads <= 1 || t.strides[1] == head_size) &&
                  (tokens <= 1 || t.strides[0] >= heads * head_size);
  if (!ok) {
    return Error(op, std::string(arg) + ": expected contiguous heads with a token stride " +
                         "(strides [>= " + std::to_string(heads * head_size) + ", " +
                         std::to_string(head_size) + ", 1]), got " + t.ToString() +
                         " with strides " + StridesString(t));
  }
  if (t.data == nullptr && t.numel() > 0) {
    return Error(op, std::string(arg) + ": data is null for " + t.ToString());
  }
  return OpStatus::Ok();
}

OpStatus CheckArg(const char* op, const char* arg, const TensorView& t,
                  std::initializer_list<DType> dtypes, std::initializer_list<int64_t> dims) {
  if (OpStatus st = CheckDTypeAndShape(op, arg, t, dtypes, dims); !st.ok()) return st;
  if (!t.is_contiguous()) {
    return Error(op, std::string(arg) + ": must be contiguous, got " + t.ToString() +
                         " with non-row-major strides");
  }
  if (t.data == nullptr && t.numel() > 0) {
    return Error(op, std::string(arg) + ": data is null for " + t.ToString());
  }
  return OpStatus::Ok();
}

OpStatus CheckSameDevice(const char* op, std::initializer_list<NamedView> args,
                         TensorDevice* device) {
  const NamedView* first = nullptr;
  for (const NamedView& a : args) {
    if (a.view->data == nullptr) continue;
    if (first == nullptr) {
      first = &a;
      continue;
    }
    if (!(a.view->device == first->view->device)) {
      return Error(op, std::string(a.name) + ": on " + a.view->device.ToString() + " but " +
                           first->name + " is on " + first->view->device.ToString());
    }
  }
  *device = first == nullptr ? TensorDevice::Cpu() : first->view->device;
  return OpStatus::Ok();
}

OpStatus NoBackend(const char* op, const TensorDevice& device) {
  return Error(op, "no backend for tensors on " + device.ToString() +
                       " in this build (built without the CUDA backend: no nvcc, or LLM_CUDA=OFF)");
}

}  // namespace llm::ops::internal
