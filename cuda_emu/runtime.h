// Emulated CUDA runtime (LLM_CUDA_EMU): the subset of cuda_runtime_api.h this project calls,
// with a GPU's discipline on the CPU.
//
// - Devices: LLM_CUDA_EMU_DEVICES (default 2) H100-like devices (132 SMs, compute capability
//   9.0); LLM_CUDA_EMU_MEMORY_BYTES sets each one's memory (default 80 GiB), so out-of-memory
//   paths are testable. The current device is per host thread, as in CUDA.
// - Device memory: one mmap'ed arena per device, PROT_NONE except while a kernel or a copy
//   runs, so host code that dereferences a device pointer dies with "host code dereferenced
//   device pointer 0x... (emulated CUDA)".
// - Streams are lazy: work queued on a stream runs only when something forces it (a stream,
//   event or device synchronization, an event or stream query, a blocking copy to pageable
//   host memory, cudaFree), in stream order, honouring cudaStreamWaitEvent and the legacy
//   default stream's implicit ordering with blocking streams. A missing synchronization is
//   therefore observable: pinned host memory read before the sync still holds the old bytes.
// - Errors: a failing call returns its error and records it for cudaGetLastError /
//   cudaPeekAtLastError; a kernel fault (a barrier only part of a block reaches, a shuffle
//   naming an exited lane) is sticky on its device, as on a GPU: every later call returns it
//   until cudaDeviceReset. cudaGetErrorString of it names the kernel and the source line.
//
// - Graphs: stream capture records the kernels, async copies and memsets queued on a stream
//   (cudaStreamBeginCapture .. cudaStreamEndCapture) as the nodes of a graph, in order, and
//   cudaGraphLaunch queues them again on a stream. Capture supports one stream: a synchronizing
//   call, an event record or wait, or a free on a capturing stream fails with
//   cudaErrorStreamCaptureUnsupported and invalidates the capture.
//
// - Host work (EnqueueHostWork, below) lets an emulated library queue work on a stream, e.g.
//   NCCL's collectives, which wait at a gate for their peers: a stream query returns
//   cudaErrorNotReady there instead of blocking.
//
// - Dynamic shared memory: a launch's shared_bytes may be at most 48 KB
//   (sharedMemPerBlock), or what cudaFuncSetAttribute(kernel,
//   cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) allowed that kernel on the current
//   device, up to 227 KB (sharedMemPerBlockOptin, an H100's); more fails the launch with
//   cudaErrorInvalidValue, as on a GPU. Only the dynamic part is checked: the kernels' static
//   __shared__ variables are not counted. cudaDeviceReset forgets the attributes.
//
// Not emulated (calls fail to compile, since they are not declared): peer access, managed memory,
// the per-thread default stream, graphs built node by node. Thread-safety: every call may be made
// from any host thread (one lock serializes them).
#ifndef LLM_CUDA_EMU_RUNTIME_H_
#define LLM_CUDA_EMU_RUNTIME_H_

#include <cstddef>
#include <functional>
#include <memory>

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorUnknown = 999,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
struct CUgraph_st;
struct CUgraphNode_st;
struct CUgraphExec_st;
using cudaGraph_t = CUgraph_st*;
using cudaGraphNode_t = CUgraphNode_st*;
using cudaGraphExec_t = CUgraphExec_st*;

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaGraphNodeType {
  cudaGraphNodeTypeKernel = 0x00,
  cudaGraphNodeTypeMemcpy = 0x01,
  cudaGraphNodeTypeMemset = 0x02,
  cudaGraphNodeTypeHost = 0x03,
  cudaGraphNodeTypeGraph = 0x04,
  cudaGraphNodeTypeEmpty = 0x05,
};

#define cudaStreamLegacy (reinterpret_cast<cudaStream_t>(0x1))
inline constexpr unsigned cudaStreamDefault = 0x0;
inline constexpr unsigned cudaStreamNonBlocking = 0x1;
inline constexpr unsigned cudaEventDefault = 0x0;
inline constexpr unsigned cudaEventBlockingSync = 0x1;
inline constexpr unsigned cudaEventDisableTiming = 0x2;
inline constexpr unsigned cudaHostAllocDefault = 0x0;
inline constexpr unsigned cudaHostAllocPortable = 0x1;
inline constexpr unsigned cudaHostAllocMapped = 0x2;
inline constexpr unsigned cudaHostRegisterDefault = 0x0;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  size_t sharedMemPerMultiprocessor;
  size_t sharedMemPerBlockOptin;
  int memoryBusWidth;
  int l2CacheSize;
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
// The attributes this project reads (values as cudaGetDeviceProperties reports them).
enum cudaDeviceAttr {
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceReset();
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
template <typename T>  // cuda_runtime.h's overload for a kernel's function pointer
cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned flags);
cudaError_t cudaHostUnregister(void* ptr);

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
// As CUDA 11+: host memory that is not pinned is cudaMemoryTypeUnregistered (not an error).
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr);

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* num_nodes);
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType* type);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// The typed overloads of cuda_runtime.h.
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t size) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), size);
}
template <typename T>
cudaError_t cudaMallocAsync(T** ptr, size_t size, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(ptr), size, stream);
}
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t size) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), size);
}
template <typename T>
cudaError_t cudaHostAlloc(T** ptr, size_t size, unsigned flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(ptr), size, flags);
}

namespace llm::cuda_emu {

// Internal hook for the emulated libraries built on this runtime (nccl.cc), not CUDA's API.
//
// A gate holds back the work queued behind it on its stream: Open() says whether it may run
// (called with the runtime's lock held; it must not call the runtime), Wait() blocks until
// Open() would return true (called with the runtime's lock released, so that other host
// threads, e.g. the peer ranks of a collective, can run their streams meanwhile).
class StreamGate {
 public:
  virtual ~StreamGate() = default;
  virtual bool Open() = 0;
  virtual void Wait() = 0;
};

// Queues `run` on `stream` (null or cudaStreamLegacy: the legacy default stream of `device`;
// otherwise a stream of `device`) as a kernel would be queued: it runs in stream order when the
// stream is forced, inside DeviceAccess (device memory may be touched), with the runtime's lock
// held (it must not call the runtime); an error it returns is sticky on the device, as a
// kernel fault. With a `gate`, it runs only once the gate is open: cudaStreamQuery and
// cudaEventQuery then answer cudaErrorNotReady at a closed gate, and synchronizing calls wait
// for it (with the runtime's lock released). Errors: cudaErrorInvalidDevice, -ResourceHandle
// (a destroyed stream or one of another device), cudaErrorStreamCaptureUnsupported (a capturing
// stream: the capture is invalidated), or the device's sticky error.
cudaError_t EnqueueHostWork(int device, cudaStream_t stream, std::function<cudaError_t()> run,
                            std::shared_ptr<StreamGate> gate = nullptr);

}  // namespace llm::cuda_emu

#endif  // LLM_CUDA_EMU_RUNTIME_H_
