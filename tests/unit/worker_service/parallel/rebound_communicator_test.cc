// ReboundCommunicator: collectives fail with FAILED_PRECONDITION while nothing is bound, go to
// the bound communicator (its results and its errors) once something is, and to the new one
// after a Rebind, which destroys the old; rank and world size stay the constructor's.
#include "worker_service/parallel/rebound_communicator.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

// Adds `tag` to every element (AllReduceSum, Broadcast) or fails with `error` when set; counts
// its calls and its destruction.
class TaggingCommunicator : public Communicator {
 public:
  TaggingCommunicator(float tag, int* destroyed) : tag_(tag), destroyed_(destroyed) {}
  ~TaggingCommunicator() override { ++*destroyed_; }

  void set_error(absl::Status error) { error_ = std::move(error); }
  int calls() const { return calls_; }

  int rank() const override { return 1; }
  int world_size() const override { return 2; }
  absl::Status AllReduceSum(float* data, size_t count) override {
    ++calls_;
    if (!error_.ok()) return error_;
    for (size_t i = 0; i < count; ++i) data[i] += tag_;
    return absl::OkStatus();
  }
  absl::Status AllGather(const float* in, size_t count, float* out) override {
    ++calls_;
    for (size_t i = 0; i < count; ++i) out[i] = out[count + i] = in[i] + tag_;
    return error_;
  }
  absl::Status Broadcast(float* data, size_t count, int root) override {
    ++calls_;
    for (size_t i = 0; i < count; ++i) data[i] += tag_ * static_cast<float>(root + 1);
    return error_;
  }
  absl::Status Barrier() override {
    ++calls_;
    return error_;
  }

 private:
  const float tag_;
  int* const destroyed_;
  absl::Status error_;
  int calls_ = 0;
};

TEST(ReboundCommunicator, FailsEveryCollectiveUntilBound) {
  ReboundCommunicator comm(/*rank=*/1, /*world_size=*/2);
  EXPECT_EQ(comm.rank(), 1);
  EXPECT_EQ(comm.world_size(), 2);
  float data[2] = {1, 2};
  float out[4] = {};
  for (const absl::Status& s : {comm.AllReduceSum(data, 2), comm.AllGather(data, 2, out),
                                comm.Broadcast(data, 2, 0), comm.Barrier()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("not connected (Init)"));
  }
  EXPECT_EQ(data[0], 1);  // untouched
}

TEST(ReboundCommunicator, ForwardsToTheBoundCommunicatorAndItsErrors) {
  int destroyed = 0;
  ReboundCommunicator comm(1, 2);
  auto inner = std::make_unique<TaggingCommunicator>(10, &destroyed);
  TaggingCommunicator* first = inner.get();
  comm.Rebind(std::move(inner));

  float data[2] = {1, 2};
  ASSERT_TRUE(comm.AllReduceSum(data, 2).ok());
  EXPECT_EQ(data[0], 11);
  EXPECT_EQ(data[1], 12);
  float out[4] = {};
  ASSERT_TRUE(comm.AllGather(data, 2, out).ok());
  EXPECT_EQ(out[3], 22);
  ASSERT_TRUE(comm.Broadcast(data, 2, /*root=*/1).ok());
  EXPECT_EQ(data[0], 31);
  ASSERT_TRUE(comm.Barrier().ok());
  EXPECT_EQ(first->calls(), 4);

  first->set_error(absl::DeadlineExceededError("peer 0 is gone"));
  const absl::Status s = comm.AllReduceSum(data, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "peer 0 is gone");
  EXPECT_EQ(comm.Barrier().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(destroyed, 0);
}

// A GPU worker's ops run on its communicator's stream; through the rebound front it is the bound
// communicator's, and null while none is bound.
TEST(ReboundCommunicator, ForwardsTheBoundCommunicatorsStream) {
  class StreamCommunicator : public TaggingCommunicator {
   public:
    StreamCommunicator(void* stream, int* destroyed)
        : TaggingCommunicator(0.0f, destroyed), stream_(stream) {}
    void* stream() const override { return stream_; }

   private:
    void* const stream_;
  };
  int destroyed = 0;
  int stream_a = 0, stream_b = 0;  // any distinct addresses stand for two streams
  ReboundCommunicator rebound(1, 2);
  EXPECT_EQ(rebound.stream(), nullptr);
  rebound.Rebind(std::make_unique<StreamCommunicator>(&stream_a, &destroyed));
  EXPECT_EQ(rebound.stream(), &stream_a);
  rebound.Rebind(std::make_unique<StreamCommunicator>(&stream_b, &destroyed));
  EXPECT_EQ(rebound.stream(), &stream_b);
  rebound.Rebind(std::make_unique<TaggingCommunicator>(1.0f, &destroyed));
  EXPECT_EQ(rebound.stream(), nullptr);  // a host communicator
  rebound.Rebind(nullptr);
  EXPECT_EQ(rebound.stream(), nullptr);
}

TEST(ReboundCommunicator, RebindReplacesAndDestroysTheOldGroup) {
  int destroyed = 0;
  ReboundCommunicator comm(1, 2);
  comm.Rebind(std::make_unique<TaggingCommunicator>(10, &destroyed));
  comm.Rebind(std::make_unique<TaggingCommunicator>(100, &destroyed));
  EXPECT_EQ(destroyed, 1);
  float data[1] = {1};
  ASSERT_TRUE(comm.AllReduceSum(data, 1).ok());
  EXPECT_EQ(data[0], 101);  // the new group's

  comm.Rebind(nullptr);  // torn down: unbound again
  EXPECT_EQ(destroyed, 2);
  EXPECT_EQ(comm.Barrier().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace llm
