// GlooCommunicator: Gloo's TCP transport, full-mesh rendezvous through a store, and the
// collectives with a timeout each. Gloo reports failures by throwing; they become statuses.
#include "worker_service/parallel/gloo_communicator.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace llm {
namespace {

absl::Status Failed(const char* what, int rank, const std::exception& e) {
  return absl::UnavailableError(absl::StrCat("gloo ", what, " on rank ", rank, ": ", e.what()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    gloo::rendezvous::Store& store, int rank, int world_size, const GlooOptions& options) {
  if (absl::Status s = CheckGroupArgs(rank, world_size, options.timeout); !s.ok()) return s;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->setTimeout(options.timeout);
    gloo::rendezvous::PrefixStore prefixed(options.prefix, store);
    context->connectFullMesh(prefixed, device);
    // A rank's mesh can be complete while a peer is still connecting; a rank that returned
    // and went away at once would break that peer's rendezvous. Leave together.
    gloo::BarrierOptions barrier(context);
    barrier.setTimeout(options.timeout);
    gloo::barrier(barrier);
    return std::unique_ptr<GlooCommunicator>(
        new GlooCommunicator(std::move(context), rank, world_size, options.timeout));
  } catch (const std::exception& e) {
    return Failed("rendezvous", rank, e);
  }
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::CreateWithFileStore(
    const std::string& directory, int rank, int world_size, const GlooOptions& options) {
  try {
    gloo::rendezvous::FileStore store(directory);
    return Create(store, rank, world_size, options);
  } catch (const std::exception& e) {
    return Failed("file store", rank, e);
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank, int world_size,
                                   std::chrono::milliseconds timeout)
    : context_(std::move(context)), rank_(rank), world_size_(world_size), timeout_(timeout) {}

GlooCommunicator::~GlooCommunicator() = default;

absl::Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  if (count == 0) return absl::OkStatus();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(NextTag());
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return Failed("all-reduce", rank_, e);
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllGather(const float* in, size_t count, float* out) {
  if (count == 0) return absl::OkStatus();
  try {
    gloo::AllgatherOptions opts(context_);
    // Gloo only reads the input; its setter is not const-correct.
    opts.setInput(const_cast<float*>(in), count);
    opts.setOutput(out, count * static_cast<size_t>(world_size_));
    opts.setTag(NextTag());
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return Failed("all-gather", rank_, e);
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Broadcast(float* data, size_t count, int root) {
  if (absl::Status s = CheckRoot(root, world_size_); !s.ok()) return s;
  if (count == 0) return absl::OkStatus();
  try {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, count);
    opts.setRoot(root);
    opts.setTag(NextTag());
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    return Failed("broadcast", rank_, e);
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Barrier() {
  try {
    gloo::BarrierOptions opts(context_);
    opts.setTag(NextTag());
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  } catch (const std::exception& e) {
    return Failed("barrier", rank_, e);
  }
  return absl::OkStatus();
}

}  // namespace llm
