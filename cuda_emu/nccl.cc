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
// Ranks in separate processes of one host (each with its own emulated devices) join through a
// shared-memory segment named from the id's token, which every rank attaches at init (it is
// unlinked once all have): when every rank is a thread of one process, collectives run as
// above; otherwise every rank runs them through the segment, in rounds of at most kSlotBytes
// per rank: an arrival (host work on the stream) copies the rank's input from its device into
// its slot and bumps its round counter; a gate holds the stream until every rank has arrived
// (spin, then futex waits of a few ms), the segment says broken (a rank aborted or ranks
// disagreed), or a peer is dead (each rank holds an OFD lock on its byte of the segment while
// its communicator lives); then a host work combines the slots in rank order (the same bits on
// every rank) into the rank's device memory. Slots alternate by round parity, so a round's
// inputs are never overwritten before every rank has read them. ncclCommGetAsyncError reports
// a dead peer as ncclRemoteError, so a caller's deadline + ncclCommAbort works as in-process.
//
// f16 and bf16 reductions accumulate in fp32 (ReduceHalf). Not emulated: ncclAvg, communicator
// splits, point-to-point calls. A non-blocking init never times out by itself: the caller polls and
// aborts (a blocking one waits, as NCCL's, until every rank has joined or one aborted).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
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

// f16 / bf16 reductions as NCCL's pairwise ones would round them at best: accumulated in fp32
// in rank order and rounded once to nearest (real NCCL may round after each step of its ring,
// so its sums can differ from these in the last bit).
void ReduceHalf(const Op& op) {
  const size_t n = op.count;
  const bool bf16 = op.type == ncclBfloat16;
  auto load = [bf16](const void* p, size_t i) {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                : __half2float(static_cast<const __half*>(p)[i]);
  };
  std::vector<float> acc(n);
  for (size_t i = 0; i < n; ++i) acc[i] = load(op.send[0], i);
  for (size_t r = 1; r < op.send.size(); ++r) {
    for (size_t i = 0; i < n; ++i) {
      const float v = load(op.send[r], i);
      switch (op.red) {
        case ncclSum:
          acc[i] += v;
          break;
        case ncclProd:
          acc[i] *= v;
          break;
        case ncclMax:
          acc[i] = std::max(acc[i], v);
          break;
        default:
          acc[i] = std::min(acc[i], v);
          break;
      }
    }
  }
  for (void* out : op.recv) {
    for (size_t i = 0; i < n; ++i) {
      if (bf16) {
        static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(acc[i]);
      } else {
        static_cast<__half*>(out)[i] = __float2half_rn(acc[i]);
      }
    }
  }
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
        case ncclFloat16:
        case ncclBfloat16:
          ReduceHalf(op);
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

// ---- Ranks in separate processes: the shared-memory segment ----

constexpr size_t kSlotBytes = size_t{1} << 20;  // per rank, per round parity
constexpr int kMaxShmRanks = 64;

struct RoundDesc {  // what a rank called in a round (ranks must agree)
  uint32_t kind, type, red, root;
  uint64_t count;
};

struct alignas(64) ShmRank {
  std::atomic<uint32_t> attached;
  int32_t pid;
  std::atomic<uint64_t> arrived;  // rounds whose input this rank has put in its slot
  RoundDesc desc[2];              // by round parity
};

struct ShmHeader {
  std::atomic<uint32_t> nranks;
  std::atomic<uint32_t> joined;
  std::atomic<uint32_t> word;    // futex word: bumped at every change
  std::atomic<uint32_t> broken;  // 0; 1: being written; 2: why and message written
  int32_t why;
  char message[256];
  ShmRank ranks[kMaxShmRanks];
};

size_t ShmBytes(int nranks) {
  const size_t header = (sizeof(ShmHeader) + 4095) / 4096 * 4096;
  return header + static_cast<size_t>(nranks) * 2 * kSlotBytes;
}

// One rank's attachment (its own open file description holds its OFD lock).
struct Shm {
  std::string name;
  int fd = -1;
  void* base = nullptr;
  size_t bytes = 0;
  int rank = 0;
  int nranks = 0;
  std::atomic<uint64_t> finished{0};  // rounds this rank has completed (or skipped: broken)
  ShmHeader* hdr() const { return static_cast<ShmHeader*>(base); }
  char* Slot(int r, uint64_t round) const {
    const size_t header = (sizeof(ShmHeader) + 4095) / 4096 * 4096;
    return static_cast<char*>(base) + header +
           (static_cast<size_t>(r) * 2 + round % 2) * kSlotBytes;
  }
  ~Shm() {
    if (base != nullptr) munmap(base, bytes);
    if (fd >= 0) close(fd);
  }
};

void Wake(ShmHeader* h) {
  h->word.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

void SleepOn(ShmHeader* h, uint32_t seen, int ms) {
  timespec ts{0, ms * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void ShmBreak(const Shm& s, ncclResult_t why, const std::string& message) {
  ShmHeader* h = s.hdr();
  uint32_t expected = 0;
  if (h->broken.compare_exchange_strong(expected, 1)) {
    h->why = why;
    std::snprintf(h->message, sizeof(h->message), "%s", message.c_str());
    h->broken.store(2, std::memory_order_release);
  }
  Wake(h);
}

// The segment's reason, once it is broken (waits out a writer's few instructions).
std::pair<ncclResult_t, std::string> ShmWhy(const Shm& s) {
  ShmHeader* h = s.hdr();
  while (h->broken.load(std::memory_order_acquire) == 1) std::this_thread::yield();
  return {static_cast<ncclResult_t>(h->why), std::string(h->message)};
}

flock RankByte(int rank, short type) {
  flock l{};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = rank;
  l.l_len = 1;
  return l;
}

// A peer that attached and no longer holds its lock (its process died or it destroyed its
// communicator): breaks the segment and returns true.
bool CheckPeers(const Shm& s) {
  ShmHeader* h = s.hdr();
  for (int r = 0; r < s.nranks; ++r) {
    if (r == s.rank || h->ranks[r].attached.load(std::memory_order_acquire) == 0) continue;
    flock l = RankByte(r, F_WRLCK);
    if (fcntl(s.fd, F_OFD_GETLK, &l) != 0) continue;  // cannot tell: assume alive
    if (l.l_type == F_UNLCK) {
      ShmBreak(s, ncclRemoteError,
               "rank " + std::to_string(r) + " (process " + std::to_string(h->ranks[r].pid) +
                   ") exited or left the communicator");
      return true;
    }
  }
  return false;
}

// Attaches rank `rank` to the segment of `key`; on failure returns null with `error` set.
std::shared_ptr<Shm> ShmAttach(const std::string& key, int nranks, int rank, ncclResult_t* error,
                               std::string* message) {
  static const char kHex[] = "0123456789abcdef";
  auto s = std::make_shared<Shm>();
  s->name = "/llm-emu-nccl-";
  for (int i = 24; i < 40; ++i) {
    s->name += kHex[static_cast<unsigned char>(key[i]) >> 4];
    s->name += kHex[static_cast<unsigned char>(key[i]) & 15];
  }
  s->rank = rank;
  s->nranks = nranks;
  s->bytes = ShmBytes(nranks);
  *error = ncclSystemError;
  s->fd = shm_open(s->name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  struct stat st {};
  if (s->fd < 0 || fstat(s->fd, &st) != 0 ||
      (static_cast<size_t>(st.st_size) < s->bytes &&
       ftruncate(s->fd, static_cast<off_t>(s->bytes)) != 0)) {
    *message = "shared memory " + s->name + ": " + std::strerror(errno);
    return nullptr;
  }
  s->base = mmap(nullptr, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (s->base == MAP_FAILED) {
    s->base = nullptr;
    *message = "mmap of " + s->name + ": " + std::strerror(errno);
    return nullptr;
  }
  ShmHeader* h = s->hdr();
  uint32_t n = 0;
  if (!h->nranks.compare_exchange_strong(n, static_cast<uint32_t>(nranks)) &&
      n != static_cast<uint32_t>(nranks)) {
    *error = ncclInvalidUsage;
    *message = "rank " + std::to_string(rank) + " says " + std::to_string(nranks) +
               " ranks, a peer " + std::to_string(n);
    return nullptr;
  }
  // The lock first: a peer that sees the rank attached must see it alive.
  flock l = RankByte(rank, F_WRLCK);
  uint32_t was = 0;
  if (fcntl(s->fd, F_OFD_SETLK, &l) != 0 ||
      !h->ranks[rank].attached.compare_exchange_strong(was, 1)) {
    *error = ncclInvalidUsage;
    *message = "rank " + std::to_string(rank) + " joined twice";
    return nullptr;
  }
  h->ranks[rank].pid = getpid();
  if (h->joined.fetch_add(1) + 1 == static_cast<uint32_t>(nranks)) shm_unlink(s->name.c_str());
  Wake(h);
  return s;
}

// Holds a rank's stream until every rank has arrived at `round` or the segment is broken.
class ShmGate : public llm::cuda_emu::StreamGate {
 public:
  ShmGate(std::shared_ptr<Shm> shm, uint64_t round) : shm_(std::move(shm)), round_(round) {}
  bool Open() override {
    ShmHeader* h = shm_->hdr();
    if (h->broken.load(std::memory_order_acquire) != 0) return true;
    for (int r = 0; r < shm_->nranks; ++r) {
      if (h->ranks[r].arrived.load(std::memory_order_acquire) <= round_) return false;
    }
    return true;
  }
  void Wait() override {
    for (int i = 0; i < 2000; ++i) {
      if (Open()) return;
      std::this_thread::yield();
    }
    ShmHeader* h = shm_->hdr();
    for (;;) {
      const uint32_t seen = h->word.load(std::memory_order_acquire);
      if (Open() || CheckPeers(*shm_)) return;
      SleepOn(h, seen, 5);
    }
  }

 private:
  std::shared_ptr<Shm> shm_;
  uint64_t round_;
};

template <typename T>
void ReduceInto(const std::vector<const char*>& in, ncclRedOp_t red, size_t n, char* out) {
  Op op;
  op.red = red;
  op.count = n;
  for (const char* p : in) op.send.push_back(p);
  op.recv.push_back(out);
  ReduceAs<T>(op);
}

// Every rank has arrived at `round`: writes this rank's share of it (host work).
void ShmFinish(const Shm& s, uint64_t round, const RoundDesc& d, size_t offset, size_t bytes,
               size_t total, char* recv) {
  ShmHeader* h = s.hdr();
  if (h->broken.load(std::memory_order_acquire) != 0) return;
  for (int r = 0; r < s.nranks; ++r) {
    const RoundDesc& o = h->ranks[r].desc[round % 2];
    if (std::memcmp(&o, &d, sizeof(d)) != 0) {
      ShmBreak(s, ncclInvalidUsage,
               "round " + std::to_string(round) + ": rank " + std::to_string(r) + " called " +
                   KindName(static_cast<Kind>(o.kind)) + " of " + std::to_string(o.count) +
                   " elements, rank " + std::to_string(s.rank) + " " +
                   KindName(static_cast<Kind>(d.kind)) + " of " + std::to_string(d.count) +
                   " (ranks disagree)");
      return;
    }
  }
  switch (static_cast<Kind>(d.kind)) {
    case Kind::kAllReduce: {
      std::vector<const char*> in;
      for (int r = 0; r < s.nranks; ++r) in.push_back(s.Slot(r, round));
      const auto red = static_cast<ncclRedOp_t>(d.red);
      const size_t n = bytes / TypeSize(static_cast<ncclDataType_t>(d.type));
      switch (static_cast<ncclDataType_t>(d.type)) {
        case ncclInt8:
          ReduceInto<int8_t>(in, red, n, recv + offset);
          break;
        case ncclUint8:
          ReduceInto<uint8_t>(in, red, n, recv + offset);
          break;
        case ncclInt32:
          ReduceInto<int32_t>(in, red, n, recv + offset);
          break;
        case ncclUint32:
          ReduceInto<uint32_t>(in, red, n, recv + offset);
          break;
        case ncclInt64:
          ReduceInto<int64_t>(in, red, n, recv + offset);
          break;
        case ncclUint64:
          ReduceInto<uint64_t>(in, red, n, recv + offset);
          break;
        case ncclFloat32:
          ReduceInto<float>(in, red, n, recv + offset);
          break;
        case ncclFloat16:
        case ncclBfloat16: {
          Op op;
          op.red = red;
          op.count = n;
          op.type = static_cast<ncclDataType_t>(d.type);
          for (const char* p : in) op.send.push_back(p);
          op.recv.push_back(recv + offset);
          ReduceHalf(op);
          break;
        }
        default:
          ReduceInto<double>(in, red, n, recv + offset);
          break;
      }
      break;
    }
    case Kind::kAllGather:
      for (int r = 0; r < s.nranks; ++r) {
        std::memcpy(recv + r * total + offset, s.Slot(r, round), bytes);
      }
      break;
    case Kind::kBroadcast:
      std::memcpy(recv + offset, s.Slot(static_cast<int>(d.root), round), bytes);
      break;
  }
}

}  // namespace

struct ncclComm {
  std::shared_ptr<Group> group;
  int rank = 0;
  int device = 0;
  uint64_t next_seq = 0;
  bool finalizing = false;
  std::shared_ptr<Shm> shm;  // null: ranks are threads of this process only
  enum Mode { kJoining, kThreads, kProcesses } mode = kJoining;
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

// Under g_mu: whether the communicator's init is done, and how its ranks meet. A broken
// segment or a dead peer breaks the local group too.
ncclComm::Mode Resolve(ncclComm& c) {
  Group& g = *c.group;
  if (c.shm != nullptr && !g.broken) {
    ShmHeader* h = c.shm->hdr();
    if (h->broken.load(std::memory_order_acquire) != 0 ||
        ((c.mode == ncclComm::kJoining ||
          (c.mode == ncclComm::kProcesses && c.shm->finished.load() < c.next_seq)) &&
         CheckPeers(*c.shm))) {  // a peer that left after the last collective is no error
      auto [why, message] = ShmWhy(*c.shm);
      Break(g, why, message);
    }
  }
  if (c.mode != ncclComm::kJoining || g.broken) return c.mode;
  if (g.complete) {
    c.mode = ncclComm::kThreads;
  } else if (c.shm != nullptr && c.shm->hdr()->joined.load() == static_cast<uint32_t>(g.nranks)) {
    c.mode = ncclComm::kProcesses;
    if (g_registry != nullptr) {
      auto it = g_registry->find(g.key);
      if (it != g_registry->end() && it->second == c.group) g_registry->erase(it);
    }
  }
  return c.mode;
}

ncclResult_t EnqueueShm(Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t red, int root, ncclComm& comm, cudaStream_t stream) {
  const size_t tsize = TypeSize(type);
  const size_t total = count * tsize;
  const size_t step = kind == Kind::kAllReduce ? kSlotBytes / tsize * tsize : kSlotBytes;
  const size_t rounds = std::max<size_t>(1, (total + step - 1) / step);
  RoundDesc d{static_cast<uint32_t>(kind), static_cast<uint32_t>(type),
              kind == Kind::kAllReduce ? static_cast<uint32_t>(red) : 0u,
              kind == Kind::kBroadcast ? static_cast<uint32_t>(root) : 0u, count};
  const bool contributes = kind != Kind::kBroadcast || root == comm.rank;
  std::shared_ptr<Shm> shm = comm.shm;
  cudaError_t e = cudaSuccess;
  for (size_t i = 0; i < rounds && e == cudaSuccess; ++i) {
    const uint64_t round = comm.next_seq++;
    const size_t offset = i * step;
    const size_t bytes = std::min(step, total - std::min(total, offset));
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    e = llm::cuda_emu::EnqueueHostWork(comm.device, stream, [=] {
      ShmRank& me = shm->hdr()->ranks[shm->rank];
      me.desc[round % 2] = d;
      if (contributes && bytes > 0) std::memcpy(shm->Slot(shm->rank, round), in + offset, bytes);
      me.arrived.store(round + 1, std::memory_order_release);
      Wake(shm->hdr());
      return cudaSuccess;
    });
    if (e != cudaSuccess) break;
    e = llm::cuda_emu::EnqueueHostWork(
        comm.device, stream,
        [=] {
          ShmFinish(*shm, round, d, offset, bytes, total, out);
          shm->finished.store(round + 1, std::memory_order_release);
          return cudaSuccess;
        },
        std::make_shared<ShmGate>(shm, round));
  }
  if (e != cudaSuccess) {
    std::string message = std::string(KindName(kind)) +
                          ": queueing on the stream failed: " + cudaGetErrorName(e) +
                          " (a peer's collective will not complete)";
    ShmBreak(*shm, ncclUnhandledCudaError, message);
    return Error(ncclUnhandledCudaError, message);
  }
  return ncclSuccess;
}

ncclResult_t Enqueue(Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type,
                     ncclRedOp_t red, int root, ncclComm_t comm, cudaStream_t stream) {
  const char* what = KindName(kind);
  if (comm == nullptr) return Error(ncclInvalidArgument, std::string(what) + ": comm is null");
  if (TypeSize(type) == 0) {
    return Error(ncclInvalidArgument,
                 std::string(what) + ": data type " + std::to_string(type) + " is not supported");
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
  bool processes = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    processes = Resolve(*comm) == ncclComm::kProcesses && !g.broken;
  }
  if (processes) {  // queued outside g_mu: the runtime's lock is never taken inside it
    return EnqueueShm(kind, send, recv, count, type, red, root, *comm, stream);
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
  const bool local = pid == getpid();  // else: a rank of another process's communicator
  const bool blocking = config == nullptr || config->blocking != 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    return Error(ncclUnhandledCudaError, "ncclCommInitRank: cudaGetDevice failed");
  }
  const std::string key(comm_id.internal, sizeof(comm_id.internal));
  std::unique_lock<std::mutex> lock(g_mu);
  if (g_registry == nullptr) g_registry = new std::map<std::string, std::shared_ptr<Group>>();
  std::shared_ptr<Group> own;  // a rank of another process's id: a group of its own
  std::shared_ptr<Group>& slot = local ? (*g_registry)[key] : own;
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
  std::shared_ptr<Shm> shm;
  if (nranks <= kMaxShmRanks) {  // peers may be in other processes: meet in the segment too
    ncclResult_t why = ncclSuccess;
    std::string message;
    shm = ShmAttach(key, nranks, rank, &why, &message);
    if (shm == nullptr && (!local || why == ncclInvalidUsage)) {
      return Error(why, "ncclCommInitRank: " + message);
    }
  } else if (!local) {
    return Error(ncclInvalidUsage, "ncclCommInitRank: ranks in separate processes: at most " +
                                       std::to_string(kMaxShmRanks));
  }
  g->devices[rank] = device;
  if (++g->joined == nranks && local) {
    g->complete = true;
    g_registry->erase(key);  // an id is good for one communicator
    g_cv.notify_all();
  }
  auto* c = new ncclComm();
  c->group = g;
  c->rank = rank;
  c->device = device;
  c->shm = std::move(shm);
  *comm = c;
  for (;;) {
    const ncclComm::Mode mode = Resolve(*c);
    if (g->broken) {
      if (!blocking) return ncclSuccess;  // ncclCommGetAsyncError says why
      return Error(g->why, "ncclCommInitRank: " + g->message);
    }
    if (mode != ncclComm::kJoining) return ncclSuccess;
    if (!blocking) return ncclInProgress;
    g_cv.wait_for(lock, std::chrono::milliseconds(2));
  }
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, comm_id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) {
    return Error(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  }
  std::lock_guard<std::mutex> lock(g_mu);
  const ncclComm::Mode mode = Resolve(*comm);
  const Group& g = *comm->group;
  if (g.broken) {
    t_last_error = g.message;
    *async_error = g.why;
  } else if (mode == ncclComm::kJoining) {
    *async_error = ncclInProgress;
  } else if (mode == ncclComm::kProcesses) {
    const bool pending = comm->shm->finished.load() < comm->next_seq;
    *async_error = comm->finalizing && pending ? ncclInProgress : ncclSuccess;
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
  const ncclComm::Mode mode = Resolve(*comm);
  const Group& g = *comm->group;
  if (g.broken) return Error(g.why, "ncclCommFinalize: " + g.message);
  if (mode == ncclComm::kProcesses) {
    return comm->shm->finished.load() < comm->next_seq ? ncclInProgress : ncclSuccess;
  }
  const bool pending = !g.ops.empty() && g.ops.begin()->first < comm->next_seq;
  return pending ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (comm->shm != nullptr &&
      comm->shm->hdr()->joined.load() < static_cast<uint32_t>(comm->shm->nranks)) {
    shm_unlink(comm->shm->name.c_str());  // left before every rank joined
  }
  delete comm;  // queued work holds the group
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Group& g = *comm->group;
    g.aborted[comm->rank] = true;
    const std::string message =
        "rank " + std::to_string(comm->rank) + " aborted the communicator (ncclCommAbort)";
    Break(g, ncclRemoteError, message);
    if (comm->shm != nullptr) {
      ShmBreak(*comm->shm, ncclRemoteError, message);
      if (comm->shm->hdr()->joined.load() < static_cast<uint32_t>(comm->shm->nranks)) {
        shm_unlink(comm->shm->name.c_str());
      }
    }
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
