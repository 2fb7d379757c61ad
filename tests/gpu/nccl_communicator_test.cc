// NcclCommunicator. The id and argument tests run anywhere (NCCL needs no device for them);
// the collectives need one device per rank (NCCL does not take two ranks on one device), so
// they run with world_size 1 on one device, with 2 ranks only where 2 devices exist, and skip
// with the reason otherwise. A peer that never joins, or never calls a collective, must make
// the call fail within its timeout: each such call runs under a watchdog that aborts the test
// binary with a message if it hangs instead.
#include "worker_service/parallel/nccl_communicator.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace llm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

// Runs `fn` on a thread; if it has not returned after `limit`, the process aborts naming
// `what` (a hang is the bug these tests look for, and a hung test would hide it).
void WithinOrDie(const char* what, std::chrono::steady_clock::duration limit,
                 std::function<void()> fn) {
  auto task = std::make_shared<std::packaged_task<void()>>(std::move(fn));
  std::future<void> done = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (done.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "HANG: %s did not return within %lld s\n", what,
                 static_cast<long long>(std::chrono::duration_cast<seconds>(limit).count()));
    std::abort();
  }
  done.get();
}

// A device buffer of floats on the current device. Upload and Poison wait for the device: a
// pageable cudaMemcpy and a cudaMemset may still be running on the legacy default stream when
// they return, and a non-blocking stream (the communicator's) does not wait for that stream.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&data_, n * sizeof(float)), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(data_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  float* data() const { return data_; }
  void Upload(const std::vector<float>& v) {
    ASSERT_EQ(v.size(), n_);
    ASSERT_EQ(cudaMemcpy(data_, v.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // NaN everywhere: whatever a collective does not write shows.
  void Poison() {
    ASSERT_EQ(cudaMemset(data_, 0xFF, n_ * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::vector<float> Download() const {
    std::vector<float> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), data_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  float* data_ = nullptr;
  size_t n_;
};

std::vector<float> Iota(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

std::string MustNewId() {
  absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? *id : std::string(NcclCommunicator::kUniqueIdBytes, '\0');
}

// Skips every test of a suite where there are fewer than kDevices usable devices.
template <int kDevices>
class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why_none;
    const int count = cuda::DeviceCount(&why_none);
    if (count == 0) GTEST_SKIP() << "no usable CUDA device: " << why_none;
    if (count < kDevices) {
      GTEST_SKIP() << "needs " << kDevices
                   << " CUDA devices (NCCL takes one rank per device), found " << count;
    }
  }
};
using NcclOneDevice = NcclTest<1>;
using NcclTwoDevices = NcclTest<2>;

TEST(NcclUniqueId, Is128FreshBytes) {
  const std::string a = MustNewId(), b = MustNewId();
  EXPECT_EQ(a.size(), NcclCommunicator::kUniqueIdBytes);
  EXPECT_EQ(b.size(), NcclCommunicator::kUniqueIdBytes);
  EXPECT_NE(a, b);
}

TEST(NcclCreate, RejectsBadArgumentsBeforeTouchingADevice) {
  const std::string id = MustNewId();
  auto bad = [](absl::StatusOr<std::unique_ptr<NcclCommunicator>> c) {
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    return std::string(c.status().message());
  };
  EXPECT_THAT(bad(NcclCommunicator::Create("short", 0, 1, 0, nullptr, seconds(1))),
              HasSubstr("must be 128 bytes, got 5"));
  EXPECT_THAT(bad(NcclCommunicator::Create(id, 2, 2, 0, nullptr, seconds(1))),
              HasSubstr("rank 2 of world_size 2"));
  EXPECT_THAT(bad(NcclCommunicator::Create(id, 0, 0, 0, nullptr, seconds(1))),
              HasSubstr("rank 0 of world_size 0"));
  EXPECT_THAT(bad(NcclCommunicator::Create(id, 0, 1, 0, nullptr, milliseconds(0))),
              HasSubstr("timeout must be > 0"));
}

TEST_F(NcclOneDevice, WorldSizeOneCollectives) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm;
    WithinOrDie("Create(world_size 1)", seconds(60), [&] {
      comm = NcclCommunicator::Create(MustNewId(), 0, 1, 0, stream, seconds(20));
    });
    ASSERT_TRUE(comm.ok()) << comm.status();
    NcclCommunicator& c = **comm;
    EXPECT_EQ(c.rank(), 0);
    EXPECT_EQ(c.world_size(), 1);
    // The collectives run on threads other than Create's (as a worker's step thread may).
    WithinOrDie("world_size 1 collectives", seconds(60), [&] {
      constexpr size_t kCount = 1000;
      const std::vector<float> values = Iota(kCount, -3.5f);
      DeviceFloats data(kCount), out(kCount);
      data.Upload(values);
      ASSERT_TRUE(c.AllReduceSum(data.data(), kCount).ok());
      EXPECT_EQ(data.Download(), values);  // the sum over one rank
      out.Poison();
      const absl::Status g = c.AllGather(data.data(), kCount, out.data());
      ASSERT_TRUE(g.ok()) << g;
      EXPECT_EQ(out.Download(), values);  // rank-major over one rank: a copy
      const absl::Status b = c.Broadcast(data.data(), kCount, 0);
      ASSERT_TRUE(b.ok()) << b;
      EXPECT_EQ(data.Download(), values);
      EXPECT_TRUE(c.Barrier().ok());
      EXPECT_TRUE(c.AllReduceSum(data.data(), 0).ok());  // nothing to do
    });
  }
  cudaStreamDestroy(stream);
}

// One stream for the step: an op run on OpContext{stream = comm.stream()} and a collective
// enqueued right after it, with no synchronization between, see the op's output. (With the
// op on the legacy default stream and NCCL on its non-blocking stream, the two would be
// unordered: the gather could copy the poison.)
TEST_F(NcclOneDevice, OpsOnTheCommunicatorsStreamAreOrderedBeforeItsCollectives) {
  constexpr int64_t kTokens = 64, kHidden = 256, kVocab = 100;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm;
    WithinOrDie("Create(world_size 1)", seconds(60), [&] {
      comm = NcclCommunicator::Create(MustNewId(), 0, 1, 0, stream, seconds(20));
    });
    ASSERT_TRUE(comm.ok()) << comm.status();
    NcclCommunicator& c = **comm;
    EXPECT_EQ(c.stream(), static_cast<void*>(stream));
    WithinOrDie("an op, then a collective, on one stream", seconds(60), [&] {
      const std::vector<float> table = Iota(kVocab * kHidden, 0.5f);
      std::vector<int32_t> ids(kTokens);
      std::vector<float> want;
      for (int64_t t = 0; t < kTokens; ++t) {
        ids[t] = static_cast<int32_t>((t * 37) % kVocab);
        want.insert(want.end(), table.begin() + ids[t] * kHidden,
                    table.begin() + (ids[t] + 1) * kHidden);
      }
      DeviceFloats d_table(table.size()), d_out(kTokens * kHidden), d_gathered(kTokens * kHidden);
      d_table.Upload(table);
      int32_t* d_ids = nullptr;
      ASSERT_EQ(cudaMalloc(&d_ids, kTokens * sizeof(int32_t)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_ids, ids.data(), kTokens * sizeof(int32_t), cudaMemcpyHostToDevice),
                cudaSuccess);
      d_out.Poison();  // also waits for the ids' upload
      d_gathered.Poison();
      const TensorDevice dev = TensorDevice::Cuda(0);
      ops::OpContext ctx;
      ctx.stream = c.stream();
      const ops::OpStatus s = ops::Embedding(
          ctx, TensorView::Contiguous(d_out.data(), DType::kF32, {kTokens, kHidden}, dev),
          TensorView::Contiguous(d_ids, DType::kI32, {kTokens}, dev),
          TensorView::Contiguous(d_table.data(), DType::kF32, {kVocab, kHidden}, dev));
      EXPECT_TRUE(s.ok()) << s.message;
      const absl::Status g = c.AllGather(d_out.data(), kTokens * kHidden, d_gathered.data());
      EXPECT_TRUE(g.ok()) << g;
      EXPECT_EQ(d_gathered.Download(), want);
      cudaFree(d_ids);
    });
  }
  cudaStreamDestroy(stream);
}

TEST_F(NcclOneDevice, RejectsHostPointersAndBadRoots) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm;
  WithinOrDie("Create(world_size 1)", seconds(60),
              [&] { comm = NcclCommunicator::Create(MustNewId(), 0, 1, 0, nullptr, seconds(20)); });
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> host(8, 1.0f);
  const absl::Status s = (*comm)->AllReduceSum(host.data(), host.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("AllReduceSum: data must be device memory of cuda:0"));
  DeviceFloats data(8);
  const absl::Status r = (*comm)->Broadcast(data.data(), 8, 1);
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << r;
  EXPECT_THAT(r.message(), HasSubstr("root 1 is outside [0, 1)"));
  // Argument errors leave the communicator working.
  EXPECT_TRUE((*comm)->AllReduceSum(data.data(), 8).ok());
}

TEST_F(NcclOneDevice, PeerThatNeverJoinsFailsCreateWithinItsTimeout) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const auto timeout = seconds(3);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm;
  std::chrono::steady_clock::duration took{};
  // Rank 1 of 2 never calls Create.
  WithinOrDie("Create with a peer that never joins", seconds(60), [&] {
    const auto start = std::chrono::steady_clock::now();
    comm = NcclCommunicator::Create(MustNewId(), 0, 2, 0, nullptr, timeout);
    took = std::chrono::steady_clock::now() - start;
  });
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnavailable) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("NCCL init of rank 0 of 2 on cuda:0"));
  EXPECT_THAT(comm.status().message(), HasSubstr("did not complete within 3000 ms"));
  EXPECT_GE(took, timeout);
  EXPECT_LT(took, timeout + seconds(15));  // the abort included
}

// Rank r on cuda:r, one thread each.
TEST_F(NcclTwoDevices, TwoRanksOnTwoDevices) {
  const std::string id = MustNewId();
  constexpr size_t kCount = 4097;
  auto rank_main = [&](int rank) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    auto comm = NcclCommunicator::Create(id, rank, 2, rank, nullptr, seconds(30));
    ASSERT_TRUE(comm.ok()) << comm.status();
    NcclCommunicator& c = **comm;
    DeviceFloats data(kCount), out(2 * kCount);
    // rank r holds r * 1000 + i; the sum is 1000 + 2i.
    data.Upload(Iota(kCount, 1000.0f * static_cast<float>(rank)));
    ASSERT_TRUE(c.AllReduceSum(data.data(), kCount).ok());
    const std::vector<float> sum = data.Download();
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(sum[i], 1000.0f + 2.0f * i) << "at " << i;
    data.Upload(Iota(kCount, 1000.0f * static_cast<float>(rank)));
    out.Poison();
    ASSERT_TRUE(c.AllGather(data.data(), kCount, out.data()).ok());
    std::vector<float> want = Iota(kCount, 0.0f), second = Iota(kCount, 1000.0f);
    want.insert(want.end(), second.begin(), second.end());
    EXPECT_EQ(out.Download(), want);
    ASSERT_TRUE(c.Broadcast(data.data(), kCount, 1).ok());
    EXPECT_EQ(data.Download(), Iota(kCount, 1000.0f));
    EXPECT_TRUE(c.Barrier().ok());
  };
  WithinOrDie("two ranks' collectives", seconds(120), [&] {
    std::thread r1(rank_main, 1);
    rank_main(0);
    r1.join();
  });
}

// Rank 1 joins but never calls the all-reduce: rank 0's fails within its timeout, and the
// communicator stays broken.
TEST_F(NcclTwoDevices, PeerThatNeverCallsFailsTheCollectiveWithinItsTimeout) {
  const std::string id = MustNewId();
  const auto timeout = seconds(3);
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_f = rank0_done.get_future().share();
  // Rank 0's side; returns early on a failed assertion, after which rank 1 is released too.
  auto rank0 = [&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    auto comm = NcclCommunicator::Create(id, 0, 2, 0, nullptr, timeout);
    ASSERT_TRUE(comm.ok()) << comm.status();
    DeviceFloats data(16);
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s = (*comm)->AllReduceSum(data.data(), 16);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr("NCCL AllReduceSum of 16 floats did not complete"));
    EXPECT_LT(took, timeout + seconds(15));
    const absl::Status again = (*comm)->Barrier();
    EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable) << again;
    EXPECT_THAT(again.message(), HasSubstr("the communicator is broken"));
  };
  WithinOrDie("a collective with a peer that never calls", seconds(120), [&] {
    std::thread r1([&] {
      ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
      auto comm = NcclCommunicator::Create(id, 1, 2, 1, nullptr, timeout);
      EXPECT_TRUE(comm.ok()) << comm.status();
      rank0_done_f.wait();  // then its destructor tears down against an aborted peer
    });
    rank0();
    rank0_done.set_value();
    r1.join();
  });
}

}  // namespace
}  // namespace llm
