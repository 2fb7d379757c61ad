#include "worker_service/model/device_context.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

#ifdef LLM_WITH_CUDA
#include "kernels/cuda/device.h"
#include "kernels/cuda/runtime_api.h"
#endif

namespace llm {

absl::Status CudaStatus(const std::string& error) {
  return error.empty() ? absl::OkStatus() : absl::InternalError(error);
}

absl::StatusOr<std::unique_ptr<DeviceContext>> DeviceContext::Create(TensorDevice device) {
  std::unique_ptr<DeviceContext> ctx(new DeviceContext(device));
  if (device.is_cpu()) return ctx;
#ifdef LLM_WITH_CUDA
  std::string why_none;
  const int count = cuda::DeviceCount(&why_none);
  if (device.ordinal < 0 || device.ordinal >= count) {
    return absl::UnavailableError(absl::StrCat(
        device.ToString(), " is not available: ",
        count == 0 ? why_none : absl::StrCat("this host has ", count, " CUDA devices")));
  }
  if (std::string err = cuda::SelfTest(device.ordinal); !err.empty()) {
    return absl::UnavailableError(
        absl::StrCat(device.ToString(), " cannot run this build's kernels: ", err));
  }
  if (absl::Status s = ctx->MakeCurrent(); !s.ok()) return s;
  auto unavailable = [&](const std::string& err) {
    return absl::UnavailableError(absl::StrCat(device.ToString(), ": ", err));
  };
  if (std::string err = cuda::StreamCreate(&ctx->stream_); !err.empty()) return unavailable(err);
  if (std::string err = cuda::BlasCreate(ctx->stream_, &ctx->blas_); !err.empty()) {
    return unavailable(err);
  }
  if (std::string err = cuda::BlasLtCreate(&ctx->blas_lt_); !err.empty()) return unavailable(err);
  size_t free_bytes = 0, total_bytes = 0;
  if (std::string err = cuda::MemGetInfo(&free_bytes, &total_bytes); !err.empty()) {
    return unavailable(err);
  }
  // 32 MiB, or 1/128 of a small device's memory.
  const size_t workspace = std::min(kBlasWorkspaceBytes, total_bytes / 128 / 256 * 256);
  if (std::string err = Tensor::Allocate(DType::kI32, {static_cast<int64_t>(workspace / 4)}, device,
                                         &ctx->blas_workspace_);
      !err.empty()) {
    return unavailable(err);
  }
  return ctx;
#else
  return absl::UnavailableError(
      absl::StrCat(device.ToString(), ": this build has no CUDA backend (no CUDA toolkit found)"));
#endif
}

DeviceContext::~DeviceContext() {
#ifdef LLM_WITH_CUDA
  if (device_.is_cpu()) return;
  (void)cuda::SetDevice(device_.ordinal);
  if (stream_ != nullptr) (void)cuda::StreamSynchronize(stream_);
  blas_workspace_ = Tensor();
  (void)cuda::BlasLtDestroy(blas_lt_);
  (void)cuda::BlasDestroy(blas_);
  (void)cuda::StreamDestroy(stream_);
#endif
}

ops::OpContext DeviceContext::op_context() const {
  ops::OpContext ctx;
  ctx.stream = stream_;
  ctx.blas_handle = blas_;
  ctx.blaslt_handle = blas_lt_;
  ctx.blas_workspace = blas_workspace_.view().data;
  ctx.blas_workspace_bytes = blas_workspace_.capacity_bytes();
  return ctx;
}

absl::Status DeviceContext::MakeCurrent() const {
#ifdef LLM_WITH_CUDA
  if (device_.is_cuda()) return CudaStatus(cuda::SetDevice(device_.ordinal));
#endif
  return absl::OkStatus();
}

absl::Status DeviceContext::Synchronize() const {
#ifdef LLM_WITH_CUDA
  if (device_.is_cuda()) return CudaStatus(cuda::StreamSynchronize(stream_));
#endif
  return absl::OkStatus();
}

absl::Status DeviceContext::MemoryInfo(size_t* free_bytes, size_t* total_bytes) const {
#ifdef LLM_WITH_CUDA
  if (device_.is_cuda()) {
    if (absl::Status s = MakeCurrent(); !s.ok()) return s;
    return CudaStatus(cuda::MemGetInfo(free_bytes, total_bytes));
  }
#endif
  (void)free_bytes, (void)total_bytes;
  return absl::UnimplementedError("memory info of the host is not measured");
}

}  // namespace llm
