// NcclCommunicator: NCCL in non-blocking mode, every call polled against a deadline.
#include "worker_service/parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace llm {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(NcclCommunicator::kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES);

std::string CudaError(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

std::string NcclError(ncclResult_t result, ncclComm_t comm) {
  std::string msg = ncclGetErrorString(result);
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&msg, ": ", last);
  return msg;
}

// Between two polls: yield for the first few (a decode step's all-reduce takes tens of
// microseconds), then sleep 100 us so that a long wait does not burn a core.
void Backoff(int* polls) {
  if (++*polls <= 256) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// `p` is memory of CUDA device `device` (device or managed memory), as NCCL needs.
absl::Status CheckDevicePointer(const char* what, const char* arg, const void* p, int device) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " is null"));
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", arg, ": cudaPointerGetAttributes failed: ", CudaError(err)));
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", arg, " must be device memory of cuda:", device,
                     " (NCCL collectives take device pointers), got host memory"));
  }
  if (attr.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", arg, " is on cuda:", attr.device,
                                                   " but the communicator is on cuda:", device));
  }
  return absl::OkStatus();
}

absl::Status SetDevice(const char* what, int device) {
  const cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(what, ": cudaSetDevice(", device, ") failed: ", CudaError(err)));
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one device float, for Barrier
  int device = 0;
  std::chrono::milliseconds timeout{0};
  std::string broken;     // why the communicator was aborted; empty while it works
  bool deferred = false;  // collectives return once enqueued; WaitForCollectives awaits them

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  ~Impl() {
    if (cudaSetDevice(device) != cudaSuccess) cudaGetLastError();
    if (comm != nullptr) {
      // Finalize flushes outstanding work (non-blocking: poll it); destroy only a communicator
      // that finalized cleanly, abort any other.
      bool clean = false;
      ncclResult_t r = ncclCommFinalize(comm);
      if (r == ncclSuccess || r == ncclInProgress) {
        const Clock::time_point deadline = Clock::now() + timeout;
        ncclResult_t state = ncclInProgress;
        int polls = 0;
        while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
               Clock::now() < deadline) {
          Backoff(&polls);
        }
        clean = state == ncclSuccess;
      }
      if (clean) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
      comm = nullptr;
    }
    if (scratch != nullptr) cudaFree(scratch);
  }

  // Aborts the communicator (which also ends its kernels) and returns UNAVAILABLE: `message`.
  absl::Status Fail(std::string message) {
    if (comm != nullptr) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
    absl::StrAppend(&message, "; the NCCL communicator is aborted (every rank must rebuild it)");
    broken = message;
    return absl::UnavailableError(std::move(message));
  }

  // Polls until NCCL's pending call has completed (ncclCommGetAsyncError leaves ncclInProgress)
  // and, with wait_stream, the stream has drained; or fails (and aborts) on an NCCL or CUDA
  // error, or at `deadline`.
  absl::Status Await(const std::string& what, bool wait_stream, Clock::time_point deadline) {
    int polls = 0;
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) {
        return Fail(absl::StrCat(what, ": ncclCommGetAsyncError failed: ", NcclError(r, comm)));
      }
      if (state != ncclSuccess && state != ncclInProgress) {
        return Fail(absl::StrCat(what, " failed: ", NcclError(state, comm)));
      }
      if (state == ncclSuccess) {
        if (!wait_stream) return absl::OkStatus();
        const cudaError_t err = cudaStreamQuery(stream);
        if (err == cudaSuccess) return absl::OkStatus();
        if (err != cudaErrorNotReady) {
          return Fail(absl::StrCat(what, ": cudaStreamQuery failed: ", CudaError(err)));
        }
      }
      if (Clock::now() >= deadline) {
        return Fail(absl::StrCat(what, " did not complete within ", timeout.count(),
                                 " ms (a peer that is gone, stuck or never joined)"));
      }
      Backoff(&polls);
    }
  }

  // Enqueues one collective (`enqueue` returns NCCL's result) and awaits it with the stream.
  // The caller has made `device` current.
  template <typename Enqueue>
  absl::Status Run(const std::string& what, Enqueue enqueue) {
    if (comm == nullptr) {
      return absl::UnavailableError(absl::StrCat(what, ": the communicator is broken: ", broken));
    }
    const Clock::time_point deadline = Clock::now() + timeout;
    const ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) {
      return Fail(absl::StrCat(what, " failed: ", NcclError(r, comm)));
    }
    return Await(what, /*wait_stream=*/!deferred, deadline);
  }
};

absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    return absl::InternalError(absl::StrCat("ncclGetUniqueId failed: ", NcclError(r, nullptr)));
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::string_view unique_id, int rank, int world_size, int device, void* stream,
    std::chrono::milliseconds timeout) {
  if (unique_id.size() != kUniqueIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL unique id must be ", kUniqueIdBytes, " bytes, got ", unique_id.size()));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of world_size ", world_size,
                     ": need world_size >= 1 and 0 <= rank < world_size"));
  }
  if (timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout must be > 0 ms, got ", timeout.count()));
  }
  int num_devices = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&num_devices); err != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("NCCL rank ", rank, ": no usable CUDA device: ", CudaError(err)));
  }
  if (device < 0 || device >= num_devices) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL rank ", rank, ": device cuda:", device,
                                                   " does not exist (", num_devices, " devices)"));
  }
  const std::string what =
      absl::StrCat("NCCL init of rank ", rank, " of ", world_size, " on cuda:", device);
  if (absl::Status s = SetDevice(what.c_str(), device); !s.ok()) return s;

  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->stream = static_cast<cudaStream_t>(stream);
  impl->timeout = timeout;
  if (const cudaError_t err = cudaMalloc(&impl->scratch, sizeof(float)); err != cudaSuccess) {
    impl->scratch = nullptr;
    return absl::UnavailableError(absl::StrCat(what, ": cudaMalloc failed: ", CudaError(err)));
  }
  if (const cudaError_t err = cudaMemset(impl->scratch, 0, sizeof(float)); err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat(what, ": cudaMemset failed: ", CudaError(err)));
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), kUniqueIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and collectives return at once; Await polls them
  const Clock::time_point deadline = Clock::now() + timeout;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  impl->comm = comm;
  if (r != ncclSuccess && r != ncclInProgress) {
    return impl->Fail(absl::StrCat(what, " failed: ", NcclError(r, comm)));
  }
  if (comm == nullptr) return absl::InternalError(absl::StrCat(what, ": NCCL returned no comm"));
  if (absl::Status s = impl->Await(what, /*wait_stream=*/false, deadline); !s.ok()) return s;
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(std::move(impl), rank, world_size, device));
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size, int device)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size), device_(device) {}

NcclCommunicator::~NcclCommunicator() = default;

void* NcclCommunicator::stream() const { return impl_->stream; }

absl::Status NcclCommunicator::AllReduceSum(float* data, size_t count) {
  constexpr const char* kWhat = "NCCL AllReduceSum";
  if (count == 0) return absl::OkStatus();  // every rank passes the same count
  if (absl::Status s = SetDevice(kWhat, device_); !s.ok()) return s;
  if (absl::Status s = CheckDevicePointer(kWhat, "data", data, device_); !s.ok()) return s;
  return impl_->Run(absl::StrCat(kWhat, " of ", count, " floats"), [&] {
    return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, impl_->comm, impl_->stream);
  });
}

absl::Status NcclCommunicator::AllReduceSum16(void* data, size_t count, bool bf16) {
  constexpr const char* kWhat = "NCCL AllReduceSum";
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = SetDevice(kWhat, device_); !s.ok()) return s;
  if (absl::Status s = CheckDevicePointer(kWhat, "data", data, device_); !s.ok()) return s;
  return impl_->Run(absl::StrCat(kWhat, " of ", count, bf16 ? " bf16" : " f16"), [&] {
    return ncclAllReduce(data, data, count, bf16 ? ncclBfloat16 : ncclFloat16, ncclSum, impl_->comm,
                         impl_->stream);
  });
}

void NcclCommunicator::SetDeferredWait(bool deferred) { impl_->deferred = deferred; }

absl::Status NcclCommunicator::WaitForCollectives() {
  constexpr const char* kWhat = "NCCL collectives of the step";
  if (impl_->comm == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(kWhat, ": the communicator is broken: ", impl_->broken));
  }
  if (absl::Status s = SetDevice(kWhat, device_); !s.ok()) return s;
  return impl_->Await(kWhat, /*wait_stream=*/true, Clock::now() + impl_->timeout);
}

absl::Status NcclCommunicator::AllGather(const float* in, size_t count, float* out) {
  constexpr const char* kWhat = "NCCL AllGather";
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = SetDevice(kWhat, device_); !s.ok()) return s;
  if (absl::Status s = CheckDevicePointer(kWhat, "in", in, device_); !s.ok()) return s;
  if (absl::Status s = CheckDevicePointer(kWhat, "out", out, device_); !s.ok()) return s;
  return impl_->Run(absl::StrCat(kWhat, " of ", count, " floats per rank"), [&] {
    return ncclAllGather(in, out, count, ncclFloat32, impl_->comm, impl_->stream);
  });
}

absl::Status NcclCommunicator::Broadcast(float* data, size_t count, int root) {
  constexpr const char* kWhat = "NCCL Broadcast";
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": root ", root, " is outside [0, ", world_size_, ")"));
  }
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = SetDevice(kWhat, device_); !s.ok()) return s;
  if (absl::Status s = CheckDevicePointer(kWhat, "data", data, device_); !s.ok()) return s;
  return impl_->Run(absl::StrCat(kWhat, " of ", count, " floats from rank ", root), [&] {
    return ncclBroadcast(data, data, count, ncclFloat32, root, impl_->comm, impl_->stream);
  });
}

absl::Status NcclCommunicator::Barrier() {
  if (absl::Status s = SetDevice("NCCL Barrier", device_); !s.ok()) return s;
  return impl_->Run("NCCL Barrier", [&] {
    return ncclAllReduce(impl_->scratch, impl_->scratch, 1, ncclFloat32, ncclSum, impl_->comm,
                         impl_->stream);
  });
}

}  // namespace llm
