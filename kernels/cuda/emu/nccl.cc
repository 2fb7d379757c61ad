// Emulated NCCL (include/nccl.h): ranks are host threads of one process, each on its own
// emulated device; they find each other through a process-wide registry keyed by the unique
// id's random token.
//
// A collective call checks its arguments, gives the communicator's next sequence number to the
// operation and queues two pieces of work on the stream (runtime.h EnqueueHostWork): an
// arrival, which runs in stream order after the work before it and records the rank's buffers
// (the last rank to arrive combines every rank's buffers: sums in rank order, so every rank
// gets the same bits), and a gate that holds the stream until the operation is complete, the
// rank aborts, or a peer aborts. Nothing blocks the calling thread: cudaStreamQuery answers
// cudaErrorNotReady at the gate, so NcclCommunicator's polling (ncclCommGetAsyncError,
// cudaStreamQuery, ncclCommAbort at its deadline) works as with NCCL; a synchronizing call
// (cudaStreamSynchronize, a blocking copy) waits at the gate, as on a GPU. An operation's data
// moves when every rank's stream has been forced up to it (any sync or query of it does).
//
// Errors as NCCL reports them: argument errors are returned by the call; a peer that aborted
// (ncclCommAbort) makes every other rank's ncclCommGetAsyncError report ncclRemoteError and
// releases their waiting collectives without writing their outputs; ranks that disagree about
// a collective (kind, count, type, operation, root) get ncclInvalidUsage.
//
// Not emulated: ranks in separate processes (init with an id made by another process fails
// with ncclInvalidUsage), ncclFloat16/ncclBfloat16 reductions, ncclAvg, communicator splits,
// point-to-point calls. A non-blocking init never times out by itself: the caller polls and
// aborts (a blocking one waits, as NCCL's, until every rank has joined or one aborted).
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr char kMagic[] = "llm-emu-nccl";  // 13 bytes with its NUL

enum class Kind { kAllReduce, kAllGather, kBroadcast };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "ncclAllReduce";
    case Kind::kAllGather:
      return "ncclAllGather";
    default:
      return "ncclBroadcast";
  }
}

struct Op {
  Kind kind = Kind::kAllReduce;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t red = ncclSum;
  size_t count = 0;
  int root = 0;
  std::vector<const void*> send;
  std::vector<void*> recv;
  std::vector<bool> arrived;
  int num_arrived = 0;
};

struct Group {
  std::string key;
  int nranks = 0;
  std::vector<int> devices;  // -1: not joined
  int joined = 0;
  bool complete = false;
  bool broken = false;  // a rank aborted, or ranks disagreed
  ncclResult_t why = ncclSuccess;
  std::string message;  // why it broke
  std::vector<bool> aborted;
  std::map<uint64_t, Op> ops;  // queued and not complete yet, by sequence number
};

std::mutex g_mu;               // every group; taken inside the runtime's lock, never around it
std::condition_variable g_cv;  // any group changed
std::map<std::string, std::shared_ptr<Group>>* g_registry = nullptr;  // groups still joining
thread_local std::string t_last_error;
thread_local int t_group_depth = 0;

ncclResult_t Error(ncclResult_t r, std::string message) {
  t_last_error = std::move(message);
  return r;
}

size_t TypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

template <typename T>
void Reduce(const Op& op, std::vector<T>& acc) {
  const size_t n = op.count;
  std::memcpy(acc.data(), op.send[0], n * sizeof(T));
  for (size_t r = 1; r < op.send.size(); ++r) {
    const T* in = static_cast<const T*>(op.send[r]);
    for (size_t i = 0; i < n; ++i) {
      switch (op.red) {
        case ncclSum:
          acc[i] = acc[i] + in[i];
          break;
        case ncclProd:
          acc[i] = acc[i] * in[i];
          break;
        case ncclMax:
          acc[i] = std::max(acc[i], in[i]);
          break;
        default:
          acc[i] = std::min(acc[i], in[i]);
          break;
      }
    }
  }
  for (void* out : op.recv) std::memcpy(out, acc.data(), n * sizeof(T));
}

template <typename T>
void ReduceAs(const Op& op) {
  std::vector<T> acc(op.count);
  Reduce(op, acc);
}

// Every rank has arrived: writes every rank's output (device memory is accessible: this runs
// inside the runtime's host work). Inputs are staged first, since outputs may alias them.
void Combine(const Op& op) {
  const size_t bytes = op.count * TypeSize(op.type);
  switch (op.kind) {
    case Kind::kAllReduce:
      switch (op.type) {
        case ncclInt8:
          ReduceAs<int8_t>(op);
          break;
        case ncclUint8:
          ReduceAs<uint8_t>(op);
          break;
        case ncclInt32:
          ReduceAs<int32_t>(op);
          break;
        case ncclUint32:
          ReduceAs<uint32_t>(op);
          break;
        case ncclInt64:
          ReduceAs<int64_t>(op);
          break;
        case ncclUint64:
          ReduceAs<uint64_t>(op);
          break;
        case ncclFloat32:
          ReduceAs<float>(op);
          break;
        default:
          ReduceAs<double>(op);
          break;
      }
      break;
    case Kind::kAllGather: {
      std::vector<char> staged(bytes * op.send.size());
      for (size_t r = 0; r < op.send.size(); ++r) {
        std::memcpy(staged.data() + r * bytes, op.send[r], bytes);
      }
      for (void* out : op.recv) std::memcpy(out, staged.data(), staged.size());
      break;
    }
    case Kind::kBroadcast: {
      std::vector<char> staged(static_cast<const char*>(op.send[op.root]),
                               static_cast<const char*>(op.send[op.root]) + bytes);
      for (void* out : op.recv) std::memcpy(out, staged.data(), bytes);
      break;
    }
  }
}

// Holds a rank's stream until its operation `seq` is complete or the group is broken.
class OpGate : public llm::cuda_emu::StreamGate {
 public:
  OpGate(std::shared_ptr<Group> group, uint64_t seq) : group_(std::move(group)), seq_(seq) {}
  bool Open() override {
    std::lock_guard<std::mutex> lock(g_mu);
    return OpenLocked();
  }
  void Wait() override {
    std::unique_lock<std::mutex> lock(g_mu);
    g_cv.wait(lock, [this] { return OpenLocked(); });
  }

 private:
  bool OpenLocked() const { return group_->broken || !group_->ops.contains(seq_); }
  std::shared_ptr<Group> group_;
  uint64_t seq_;
};

}  // namespace

struct ncclComm {
  std::shared_ptr<Group> group;
  int rank = 0;
  int device = 0;
  uint64_t next_seq = 0;
  bool finalizing = false;
};

namespace {

// Breaks the group (under g_mu): every rank's waiting and later collectives fail.
void Break(Group& g, ncclResult_t why, std::string message) {
  if (!g.broken) {
    g.broken = true;
    g.why = why;
    g.message = std::move(message);
  }
  if (g_registry != nullptr) {
    auto it = g_registry->find(g.key);
    if (it != g_registry->end() && it->second.get() == &g) g_registry->erase(it);
  }
  g_cv.notify_all();
}

ncclResult_t Enqueue(Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type,
                     ncclRedOp_t red, int root, ncclComm_t comm, cudaStream_t stream) {
  const char* what = KindName(kind);
  if (comm == nullptr) return Error(ncclInvalidArgument, std::string(what) + ": comm is null");
  if (TypeSize(type) == 0 ||
      (kind == Kind::kAllReduce && (type == ncclFloat16 || type == ncclBfloat16))) {
    return Error(ncclInvalidArgument,
                 std::string(what) + ": data type " + std::to_string(type) +
                     " is not supported (emulated NCCL: integer, float32 and float64)");
  }
  if (kind == Kind::kAllReduce && (red < ncclSum || red > ncclMin)) {
    return Error(ncclInvalidArgument, std::string(what) + ": reduction " + std::to_string(red) +
                                          " is not supported (emulated NCCL: sum, prod, max, min)");
  }
  Group& g = *comm->group;
  if (kind == Kind::kBroadcast && (root < 0 || root >= g.nranks)) {
    return Error(ncclInvalidArgument, std::string(what) + ": root " + std::to_string(root) +
                                          " is not a rank of " + std::to_string(g.nranks));
  }
  // Buffers: device memory of the communicator's device.
  const bool needs_send = kind != Kind::kBroadcast || root == comm->rank;
  for (int i = 0; i < 2; ++i) {
    const void* p = i == 0 ? send : recv;
    if (i == 0 && !needs_send) continue;
    cudaPointerAttributes attr{};
    if (p == nullptr || cudaPointerGetAttributes(&attr, p) != cudaSuccess ||
        attr.type != cudaMemoryTypeDevice || attr.device != comm->device) {
      cudaGetLastError();
      return Error(ncclInvalidArgument,
                   std::string(what) + ": " + (i == 0 ? "sendbuff" : "recvbuff") +
                       " is not device memory of cuda:" + std::to_string(comm->device));
    }
  }
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g.complete && !g.broken) {
      return Error(ncclInvalidUsage, std::string(what) + ": the communicator's init is not done");
    }
    if (g.broken) return Error(g.why, std::string(what) + ": " + g.message);
    seq = comm->next_seq++;
    auto [it, fresh] = g.ops.try_emplace(seq);
    Op& op = it->second;
    if (fresh) {
      op.kind = kind;
      op.type = type;
      op.red = red;
      op.count = count;
      op.root = root;
      op.send.assign(g.nranks, nullptr);
      op.recv.assign(g.nranks, nullptr);
      op.arrived.assign(g.nranks, false);
    } else if (op.kind != kind || op.type != type || op.count != count ||
               (kind == Kind::kAllReduce && op.red != red) ||
               (kind == Kind::kBroadcast && op.root != root)) {
      std::string message = std::string("collective #") + std::to_string(seq) + ": rank " +
                            std::to_string(comm->rank) + " called " + what + " of " +
                            std::to_string(count) + " elements, a peer " + KindName(op.kind) +
                            " of " + std::to_string(op.count) + " (ranks disagree)";
      Break(g, ncclInvalidUsage, message);
      return Error(ncclInvalidUsage, message);
    }
  }
  std::shared_ptr<Group> group = comm->group;
  const int rank = comm->rank;
  cudaError_t e = llm::cuda_emu::EnqueueHostWork(comm->device, stream,
                                                 [group, seq, rank, send, recv, needs_send] {
                                                   std::lock_guard<std::mutex> lock(g_mu);
                                                   auto it = group->ops.find(seq);
                                                   if (group->broken || it == group->ops.end())
                                                     return cudaSuccess;
                                                   Op& op = it->second;
                                                   op.send[rank] = needs_send ? send : nullptr;
                                                   op.recv[rank] = recv;
                                                   if (!op.arrived[rank]) {
                                                     op.arrived[rank] = true;
                                                     ++op.num_arrived;
                                                   }
                                                   if (op.num_arrived == group->nranks) {
                                                     Combine(op);
                                                     group->ops.erase(it);
                                                     g_cv.notify_all();
                                                   }
                                                   return cudaSuccess;
                                                 });
  if (e == cudaSuccess) {
    e = llm::cuda_emu::EnqueueHostWork(
        comm->device, stream, [] { return cudaSuccess; }, std::make_shared<OpGate>(group, seq));
  }
  if (e != cudaSuccess) {
    std::lock_guard<std::mutex> lock(g_mu);
    std::string message = std::string(what) +
                          ": queueing on the stream failed: " + cudaGetErrorName(e) +
                          " (a peer's collective will not complete)";
    Break(g, ncclUnhandledCudaError, message);
    return Error(ncclUnhandledCudaError, message);
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return Error(ncclInvalidArgument, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return Error(ncclInvalidArgument, "ncclGetUniqueId: id is null");
  std::memset(unique_id->internal, 0, sizeof(unique_id->internal));
  std::memcpy(unique_id->internal, kMagic, sizeof(kMagic));
  const int32_t pid = getpid();
  std::memcpy(unique_id->internal + 16, &pid, sizeof(pid));
  static std::mutex mu;
  static std::random_device device;
  static std::mt19937_64 rng(device() ^ (static_cast<uint64_t>(device()) << 32));
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < 4; ++i) {
    const uint64_t word = rng();
    std::memcpy(unique_id->internal + 24 + 8 * i, &word, sizeof(word));
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr) return Error(ncclInvalidArgument, "ncclCommInitRank: comm is null");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Error(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                          std::to_string(nranks) + " ranks");
  }
  if (std::memcmp(comm_id.internal, kMagic, sizeof(kMagic)) != 0) {
    return Error(ncclInvalidArgument, "ncclCommInitRank: the id is not one of ncclGetUniqueId");
  }
  int32_t pid = 0;
  std::memcpy(&pid, comm_id.internal + 16, sizeof(pid));
  if (pid != getpid()) {
    return Error(ncclInvalidUsage, "ncclCommInitRank: the id was made by process " +
                                       std::to_string(pid) +
                                       "; emulated NCCL joins ranks of one process only (threads)");
  }
  const bool blocking = config == nullptr || config->blocking != 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    return Error(ncclUnhandledCudaError, "ncclCommInitRank: cudaGetDevice failed");
  }
  const std::string key(comm_id.internal, sizeof(comm_id.internal));
  std::unique_lock<std::mutex> lock(g_mu);
  if (g_registry == nullptr) g_registry = new std::map<std::string, std::shared_ptr<Group>>();
  std::shared_ptr<Group>& slot = (*g_registry)[key];
  if (slot == nullptr) {
    slot = std::make_shared<Group>();
    slot->key = key;
    slot->nranks = nranks;
    slot->devices.assign(nranks, -1);
    slot->aborted.assign(nranks, false);
  }
  std::shared_ptr<Group> g = slot;
  if (g->nranks != nranks) {
    return Error(ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(rank) + " says " +
                                       std::to_string(nranks) + " ranks, a peer " +
                                       std::to_string(g->nranks));
  }
  if (g->devices[rank] != -1) {
    return Error(ncclInvalidUsage,
                 "ncclCommInitRank: rank " + std::to_string(rank) + " joined twice");
  }
  if (std::find(g->devices.begin(), g->devices.end(), device) != g->devices.end()) {
    return Error(ncclInvalidUsage, "ncclCommInitRank: duplicate GPU detected: rank " +
                                       std::to_string(rank) +
                                       " and a peer both on cuda:" + std::to_string(device));
  }
  g->devices[rank] = device;
  if (++g->joined == nranks) {
    g->complete = true;
    g_registry->erase(key);  // an id is good for one communicator
    g_cv.notify_all();
  }
  auto* c = new ncclComm();
  c->group = g;
  c->rank = rank;
  c->device = device;
  *comm = c;
  if (!blocking) return g->complete ? ncclSuccess : ncclInProgress;
  g_cv.wait(lock, [&] { return g->complete || g->broken; });
  return g->broken ? Error(g->why, "ncclCommInitRank: " + g->message) : ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, comm_id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) {
    return Error(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  }
  std::lock_guard<std::mutex> lock(g_mu);
  const Group& g = *comm->group;
  if (g.broken) {
    t_last_error = g.message;
    *async_error = g.why;
  } else if (!g.complete) {
    *async_error = ncclInProgress;
  } else if (comm->finalizing && !g.ops.empty() && g.ops.begin()->first < comm->next_seq) {
    *async_error = ncclInProgress;  // its own collectives are not all complete
  } else {
    *async_error = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return Error(ncclInvalidArgument, "ncclCommFinalize: comm is null");
  std::lock_guard<std::mutex> lock(g_mu);
  comm->finalizing = true;
  const Group& g = *comm->group;
  if (g.broken) return Error(g.why, "ncclCommFinalize: " + g.message);
  const bool pending = !g.ops.empty() && g.ops.begin()->first < comm->next_seq;
  return pending ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  delete comm;  // queued work holds the group
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Group& g = *comm->group;
    g.aborted[comm->rank] = true;
    Break(g, ncclRemoteError,
          "rank " + std::to_string(comm->rank) + " aborted the communicator (ncclCommAbort)");
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return Error(ncclInvalidArgument, "null argument");
  *count = comm->group->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return Error(ncclInvalidArgument, "null argument");
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return Error(ncclInvalidArgument, "null argument");
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return Enqueue(Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return Enqueue(Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm,
                 stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return Enqueue(Kind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm,
                 stream);
}

// Collectives never block at the call here (they wait on the stream), so a group needs no
// deferral: calls inside one are queued at once, in order.
ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return Error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  --t_group_depth;
  return ncclSuccess;
}
