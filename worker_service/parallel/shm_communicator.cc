// ShmCommunicator: the segment's layout, the rendezvous through the store, and the
// collectives over two sets of per-rank buffers (see the header).
//
//   [Header, 64 B][RankState x world_size, 64 B each][set 0: world_size x slot_bytes][set 1: ...]
#include "worker_service/parallel/shm_communicator.h"

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

// Maps `path` (created at `bytes` when `create`). Returns the mapping, or an error text.
absl::StatusOr<void*> MapFile(const std::string& path, size_t bytes, bool create) {
  const int fd = create ? open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)
                        : open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return absl::FailedPreconditionError(Errno("cannot open " + path));
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string error = Errno("cannot size " + path);
    close(fd);
    unlink(path.c_str());
    return absl::FailedPreconditionError(error);
  }
  if (struct stat st; !create && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " has ", st.st_size, " bytes; ", bytes, " expected"));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const std::string error = Errno("cannot map " + path);
  close(fd);
  if (base == MAP_FAILED) {
    if (create) unlink(path.c_str());
    return absl::FailedPreconditionError(error);
  }
  return base;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmCommunicator>> ShmCommunicator::Create(
    gloo::rendezvous::Store& store, int rank, int world_size, const ShmOptions& options) {
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in a world of size ", world_size));
  }
  if (options.timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout must be > 0, got ", options.timeout.count(), " ms"));
  }
  if (options.slot_bytes < kLine || options.slot_bytes % kLine != 0) {
    return absl::InvalidArgumentError(absl::StrCat("slot_bytes must be a positive multiple of ",
                                                   kLine, ", got ", options.slot_bytes));
  }
  const size_t bytes = SegmentBytes(world_size, options.slot_bytes);
  void* base = nullptr;
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
      const std::string file = absl::StrCat("llm-shm-", absl::Hex(name, absl::kZeroPad16));
      path = absl::StrCat(options.directory, "/", file);
      absl::StatusOr<void*> mapped = MapFile(path, bytes, /*create=*/true);
      if (mapped.ok()) {
        base = *mapped;
        Header* header = static_cast<Header*>(base);
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
      } else if (absl::StatusOr<void*> mapped = MapFile(offered_path, bytes, /*create=*/false);
                 !mapped.ok()) {
        outcome = std::string(mapped.status().message());
      } else {
        base = *mapped;
        const Header* header = static_cast<const Header*>(base);
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
      if (base != nullptr) munmap(base, bytes);
      return absl::FailedPreconditionError(
          absl::StrCat("the ranks cannot share a segment in ", options.directory, ": ", decision));
    }
  } catch (const std::exception& e) {
    if (base != nullptr) munmap(base, bytes);
    if (!path.empty()) unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("shm rendezvous on rank ", rank, ": ", e.what()));
  }
  return std::unique_ptr<ShmCommunicator>(
      new ShmCommunicator(rank, world_size, options, base, bytes));
}

ShmCommunicator::ShmCommunicator(int rank, int world_size, const ShmOptions& options, void* base,
                                 size_t mapped_bytes)
    : rank_(rank),
      world_size_(world_size),
      options_(options),
      base_(base),
      mapped_bytes_(mapped_bytes) {}

ShmCommunicator::~ShmCommunicator() { munmap(base_, mapped_bytes_); }

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
      if (now >= deadline) {
        peer.sleepers.fetch_sub(1, std::memory_order_seq_cst);
        broken_ = absl::UnavailableError(absl::StrCat("shm ", what, " on rank ", rank_, ": rank ",
                                                      r, " did not reach collective ", k,
                                                      " within ", options_.timeout.count(), " ms"));
        return broken_;
      }
      FutexWait(&peer.posted, seen,
                std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::seconds(1)));
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
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not in a world of size ", world_size_));
  }
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
