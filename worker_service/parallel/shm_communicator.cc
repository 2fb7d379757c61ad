// ShmCommunicator: the segment's layout, the rendezvous through the store, and the
// collectives over two sets of per-rank buffers (see the header).
//
//   [Header, 64 B][RankState x world_size, 64 B each][set 0: world_size x slot_bytes][set 1: ...]
#include "worker_service/parallel/shm_communicator.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"

namespace llm {
namespace {

constexpr uint64_t kMagic = 0x316d68732d6d6c6cULL;  // "llm-shm1"
constexpr size_t kLine = 64;
// Spins before a waiter sleeps: a peer a few microseconds behind is not worth a futex.
constexpr int kSpins = 2000;

struct alignas(kLine) Header {
  uint64_t magic;
  uint64_t token;
  uint64_t slot_bytes;
  uint32_t world_size;
};

struct alignas(kLine) RankState {
  std::atomic<uint32_t> posted;    // collectives this rank has posted (the futex word)
  std::atomic<uint32_t> sleepers;  // ranks asleep on `posted`
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

size_t SegmentBytes(int world_size, size_t slot_bytes) {
  return sizeof(Header) + world_size * sizeof(RankState) + 2 * world_size * slot_bytes;
}

RankState* States(void* base) {
  return reinterpret_cast<RankState*>(static_cast<char*>(base) + sizeof(Header));
}

uint32_t* FutexWord(std::atomic<uint32_t>* a) { return reinterpret_cast<uint32_t*>(a); }

// Not FUTEX_PRIVATE: the word is shared between processes.
void FutexWait(std::atomic<uint32_t>* a, uint32_t seen, std::chrono::nanoseconds limit) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(limit.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(limit.count() % 1000000000);
  syscall(SYS_futex, FutexWord(a), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* a) {
  syscall(SYS_futex, FutexWord(a), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

std::string Errno(const std::string& what) { return absl::StrCat(what, ": ", strerror(errno)); }

std::vector<char> Bytes(std::string_view s) { return std::vector<char>(s.begin(), s.end()); }
std::string String(const std::vector<char>& v) { return std::string(v.begin(), v.end()); }

struct Mapping {
  void* base = nullptr;
  int fd = -1;
};

void Unmap(const Mapping& m, size_t bytes) {
  if (m.base != nullptr) munmap(m.base, bytes);
  if (m.fd >= 0) close(m.fd);
}

// Byte `rank` of the file, write-locked by that rank for as long as its communicator lives:
// the kernel drops an open file description's lock when its process dies, however it dies,
// so a waiter can tell a dead peer from a slow one (across PID namespaces too).
flock RankByte(int rank, short type) {
  flock lock = {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = rank;
  lock.l_len = 1;
  return lock;
}

// Maps `path` (created at `bytes` when `create`) and locks byte `rank`.
absl::StatusOr<Mapping> MapFile(const std::string& path, size_t bytes, bool create, int rank) {
  Mapping m;
  m.fd = create ? open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)
                : open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (m.fd < 0) return absl::FailedPreconditionError(Errno("cannot open " + path));
  std::string error;
  struct stat st;
  if (create && ftruncate(m.fd, static_cast<off_t>(bytes)) != 0) {
    error = Errno("cannot size " + path);
  } else if (!create && fstat(m.fd, &st) == 0 && static_cast<size_t>(st.st_size) != bytes) {
    error = absl::StrCat(path, " has ", st.st_size, " bytes; ", bytes, " expected");
  } else if (flock lock = RankByte(rank, F_WRLCK); fcntl(m.fd, F_OFD_SETLK, &lock) != 0) {
    error = Errno(absl::StrCat("cannot lock byte ", rank, " of ", path));
  } else if (void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
             base == MAP_FAILED) {
    error = Errno("cannot map " + path);
  } else {
    m.base = base;
    return m;
  }
  Unmap(m, bytes);
  if (create) unlink(path.c_str());
  return absl::FailedPreconditionError(error);
}

}  // namespace

int ShmCommunicator::RemoveAbandonedSegments(const std::string& directory,
                                             std::chrono::seconds min_age) {
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return 0;
  const time_t now = time(nullptr);
  int removed = 0;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (!name.starts_with(kSegmentPrefix)) continue;
    const std::string path = absl::StrCat(directory, "/", name);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    struct stat st;
    // Any lock on the file: a rank (of a group in its rendezvous, or a process that still maps
    // it) holds its byte.
    flock probe = RankByte(0, F_WRLCK);
    probe.l_len = 0;  // to the end of the file
    const bool old = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                     now - st.st_mtime >= min_age.count();
    if (old && fcntl(fd, F_OFD_GETLK, &probe) == 0 && probe.l_type == F_UNLCK &&
        unlink(path.c_str()) == 0) {
      ++removed;
    }
    close(fd);
  }
  closedir(dir);
  return removed;
}

absl::StatusOr<std::unique_ptr<ShmCommunicator>> ShmCommunicator::Create(
    gloo::rendezvous::Store& store, int rank, int world_size, const ShmOptions& options) {
  if (absl::Status s = CheckGroupArgs(rank, world_size, options.timeout); !s.ok()) return s;
  if (options.slot_bytes < kLine || options.slot_bytes % kLine != 0) {
    return absl::InvalidArgumentError(absl::StrCat("slot_bytes must be a positive multiple of ",
                                                   kLine, ", got ", options.slot_bytes));
  }
  const size_t bytes = SegmentBytes(world_size, options.slot_bytes);
  Mapping mapping;
  std::string path;
  try {
    gloo::rendezvous::PrefixStore prefixed(options.prefix, store);
    std::string outcome;  // this rank's: empty when the segment is mapped
    if (!options.enabled) {
      outcome = "shared-memory collectives are disabled";
      prefixed.set(rank == 0 ? "shm" : absl::StrCat("shm/", rank),
                   Bytes(rank == 0 ? "fail " + outcome : outcome));
    } else if (rank == 0) {
      std::random_device random;
      const uint64_t token = (static_cast<uint64_t>(random()) << 32) | random();
      const uint64_t name = (static_cast<uint64_t>(random()) << 32) | random();
      // A rank 0 killed in an earlier rendezvous left its segment (RAM, in a tmpfs).
      if (const int removed = RemoveAbandonedSegments(
              options.directory,
              std::chrono::ceil<std::chrono::seconds>(options.timeout) + std::chrono::seconds(1));
          removed > 0) {
        LOG(INFO) << "removed " << removed << " abandoned shared-memory segment(s) from "
                  << options.directory;
      }
      const std::string file = absl::StrCat(kSegmentPrefix, absl::Hex(name, absl::kZeroPad16));
      path = absl::StrCat(options.directory, "/", file);
      absl::StatusOr<Mapping> mapped = MapFile(path, bytes, /*create=*/true, rank);
      if (mapped.ok()) {
        mapping = *mapped;
        Header* header = static_cast<Header*>(mapping.base);
        header->token = token;
        header->slot_bytes = options.slot_bytes;
        header->world_size = static_cast<uint32_t>(world_size);
        header->magic = kMagic;
        prefixed.set("shm", Bytes(absl::StrCat(file, " ", token)));
      } else {
        path.clear();
        outcome = std::string(mapped.status().message());
        prefixed.set("shm", Bytes("fail " + outcome));
      }
    } else {
      prefixed.wait({"shm"}, options.timeout);
      // "FILE TOKEN", or "fail REASON". Each rank looks for FILE in its own directory.
      const std::string offer = String(prefixed.get("shm"));
      const size_t space = offer.find(' ');
      const std::string offered_path = absl::StrCat(options.directory, "/", offer.substr(0, space));
      uint64_t token = 0;
      if (offer.rfind("fail ", 0) == 0 || space == std::string::npos ||
          !absl::SimpleAtoi(offer.substr(space + 1), &token)) {
        outcome = "rank 0 has no segment";
      } else if (absl::StatusOr<Mapping> mapped =
                     MapFile(offered_path, bytes, /*create=*/false, rank);
                 !mapped.ok()) {
        outcome = std::string(mapped.status().message());
      } else {
        mapping = *mapped;
        const Header* header = static_cast<const Header*>(mapping.base);
        if (header->magic != kMagic || header->token != token ||
            header->world_size != static_cast<uint32_t>(world_size) ||
            header->slot_bytes != options.slot_bytes) {
          outcome = absl::StrCat(offered_path, " is another group's segment");
        }
      }
      prefixed.set(absl::StrCat("shm/", rank), Bytes(outcome.empty() ? "ok" : outcome));
    }
    // Rank 0 decides for all, then unlinks: every rank that could map the segment has.
    std::string decision;
    if (rank == 0) {
      decision = outcome.empty() ? "ok" : absl::StrCat("rank 0: ", outcome);
      std::vector<std::string> keys;
      for (int r = 1; r < world_size; ++r) keys.push_back(absl::StrCat("shm/", r));
      if (!keys.empty()) prefixed.wait(keys, options.timeout);
      for (int r = 1; r < world_size; ++r) {
        const std::string answer = String(prefixed.get(keys[r - 1]));
        if (answer != "ok" && decision == "ok") decision = absl::StrCat("rank ", r, ": ", answer);
      }
      if (!path.empty()) unlink(path.c_str());
      prefixed.set("shm/decision", Bytes(decision));
    } else {
      prefixed.wait({"shm/decision"}, options.timeout);
      decision = String(prefixed.get("shm/decision"));
    }
    if (decision != "ok") {
      Unmap(mapping, bytes);
      return absl::FailedPreconditionError(
          absl::StrCat("the ranks cannot share a segment in ", options.directory, ": ", decision));
    }
  } catch (const std::exception& e) {
    Unmap(mapping, bytes);
    if (!path.empty()) unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("shm rendezvous on rank ", rank, ": ", e.what()));
  }
  return std::unique_ptr<ShmCommunicator>(
      new ShmCommunicator(rank, world_size, options, mapping.base, mapping.fd, bytes));
}

ShmCommunicator::ShmCommunicator(int rank, int world_size, const ShmOptions& options, void* base,
                                 int fd, size_t mapped_bytes)
    : rank_(rank),
      world_size_(world_size),
      options_(options),
      base_(base),
      fd_(fd),
      mapped_bytes_(mapped_bytes) {}

ShmCommunicator::~ShmCommunicator() { Unmap(Mapping{base_, fd_}, mapped_bytes_); }

bool ShmCommunicator::PeerHolds(int rank) const {
  flock lock = RankByte(rank, F_WRLCK);
  if (fcntl(fd_, F_OFD_GETLK, &lock) != 0) return true;  // cannot tell: assume alive
  return lock.l_type != F_UNLCK;
}

float* ShmCommunicator::Buffer(int set, int rank) const {
  char* buffers = static_cast<char*>(base_) + sizeof(Header) + world_size_ * sizeof(RankState);
  return reinterpret_cast<float*>(buffers + (static_cast<size_t>(set) * world_size_ + rank) *
                                                options_.slot_bytes);
}

absl::Status ShmCommunicator::PostAndWait(const char* what) {
  if (!broken_.ok()) return broken_;
  const uint32_t k = ++posted_;
  RankState* states = States(base_);
  states[rank_].posted.store(k, std::memory_order_seq_cst);
  if (states[rank_].sleepers.load(std::memory_order_seq_cst) > 0) {
    FutexWakeAll(&states[rank_].posted);
  }
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    RankState& peer = states[r];
    // Counts wrap; a peer is never more than one collective ahead.
    auto reached = [&](uint32_t seen) { return static_cast<int32_t>(seen - k) >= 0; };
    bool done = reached(peer.posted.load(std::memory_order_acquire));
    for (int i = 0; i < kSpins && !done; ++i) {
      CpuRelax();
      done = reached(peer.posted.load(std::memory_order_acquire));
    }
    if (done) continue;
    peer.sleepers.fetch_add(1, std::memory_order_seq_cst);
    while (true) {
      const uint32_t seen = peer.posted.load(std::memory_order_seq_cst);
      if (reached(seen)) break;
      const auto now = std::chrono::steady_clock::now();
      // A peer that posted and then left is not gone for this collective: look again.
      const bool gone = !PeerHolds(r) && !reached(peer.posted.load(std::memory_order_seq_cst));
      if (now >= deadline || gone) {
        peer.sleepers.fetch_sub(1, std::memory_order_seq_cst);
        broken_ = absl::UnavailableError(absl::StrCat(
            "shm ", what, " on rank ", rank_, ": rank ", r, " did not reach collective ", k,
            now >= deadline ? absl::StrCat(" within ", options_.timeout.count(), " ms")
                            : std::string(" and has left the group (its process exited or "
                                          "closed the group)")));
        return broken_;
      }
      // Slices of 100 ms: a peer that died is noticed within one.
      FutexWait(&peer.posted, seen,
                std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(100)));
    }
    peer.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::AllReduceSum(float* data, size_t count) {
  for (size_t done = 0; done < count; done += slot_floats()) {
    const size_t n = std::min(slot_floats(), count - done);
    const int set = next_set();
    std::memcpy(Buffer(set, rank_), data + done, n * sizeof(float));
    if (absl::Status s = PostAndWait("all-reduce"); !s.ok()) return s;
    // In rank order on every rank, so that every rank gets the same bits.
    float* out = data + done;
    std::memcpy(out, Buffer(set, 0), n * sizeof(float));
    for (int r = 1; r < world_size_; ++r) {
      const float* in = Buffer(set, r);
      for (size_t i = 0; i < n; ++i) out[i] += in[i];
    }
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::AllGather(const float* in, size_t count, float* out) {
  for (size_t done = 0; done < count; done += slot_floats()) {
    const size_t n = std::min(slot_floats(), count - done);
    const int set = next_set();
    std::memcpy(Buffer(set, rank_), in + done, n * sizeof(float));
    if (absl::Status s = PostAndWait("all-gather"); !s.ok()) return s;
    for (int r = 0; r < world_size_; ++r) {
      std::memcpy(out + r * count + done, Buffer(set, r), n * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Broadcast(float* data, size_t count, int root) {
  if (absl::Status s = CheckRoot(root, world_size_); !s.ok()) return s;
  for (size_t done = 0; done < count; done += slot_floats()) {
    const size_t n = std::min(slot_floats(), count - done);
    const int set = next_set();
    if (rank_ == root) std::memcpy(Buffer(set, rank_), data + done, n * sizeof(float));
    if (absl::Status s = PostAndWait("broadcast"); !s.ok()) return s;
    if (rank_ != root) std::memcpy(data + done, Buffer(set, root), n * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Barrier() { return PostAndWait("barrier"); }

}  // namespace llm
