// Copy-on-write of whole KV blocks (any cache dtype) inside one device's caches, every layer, in
// one kernel launch per chunk of up to kPairsPerLaunch pairs (the pairs travel by value in the
// kernel parameters): thread block (p, c) copies pair p's block of cache c. When the 2L caches
// (every layer's K and V) are equal-shaped views at a uniform address stride (one arena, in any
// order of K and V), one launch covers them all (base + c * stride); otherwise each cache gets
// its own launch. Pairs are on the host, so their block ids are checked here like the CPU op
// checks them. Pairs run concurrently: when a block is the destination of one pair and the
// source (or destination) of another, the sequential order matters and each pair gets its own
// cudaMemcpyAsync per cache instead, in order, as the CPU op does.
#include <algorithm>
#include <unordered_set>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {
namespace {

constexpr int kPairsPerLaunch = 256;

// Block ids of one launch's pairs, by value (2 KiB of kernel parameters).
struct PairChunk {
  int32_t src[kPairsPerLaunch];
  int32_t dst[kPairsPerLaunch];
};

// 16 bytes, copied as one 128-bit load and store.
struct alignas(16) Words16 {
  uint32_t w[4];
};

// Word = Words16 when every block and cache base is 16-byte aligned, else unsigned short
// (every cache dtype is 2 or 4 bytes). block_words: words per KV block.
template <typename Word>
__global__ void CopyBlocksKernel(char* base, int64_t cache_stride_bytes, PairChunk pairs,
                                 int64_t block_words) {
  Word* cache = reinterpret_cast<Word*>(base + blockIdx.y * cache_stride_bytes);
  const Word* from = cache + static_cast<int64_t>(pairs.src[blockIdx.x]) * block_words;
  Word* to = cache + static_cast<int64_t>(pairs.dst[blockIdx.x]) * block_words;
  for (int64_t i = threadIdx.x; i < block_words; i += blockDim.x) to[i] = from[i];
}

// The caches' base pointers sorted, and their uniform stride if they have one.
bool UniformStride(std::span<const TensorView> key_caches, std::span<const TensorView> value_caches,
                   char** base, int64_t* stride) {
  std::vector<char*> ptrs;
  for (const TensorView& t : key_caches) ptrs.push_back(static_cast<char*>(t.data));
  for (const TensorView& t : value_caches) ptrs.push_back(static_cast<char*>(t.data));
  std::sort(ptrs.begin(), ptrs.end());
  *base = ptrs[0];
  *stride = ptrs.size() > 1 ? ptrs[1] - ptrs[0] : 0;
  if (ptrs.size() > 1 && *stride <= 0) return false;  // the same cache twice
  for (size_t i = 1; i < ptrs.size(); ++i) {
    if (ptrs[i] - ptrs[i - 1] != *stride) return false;
  }
  return true;
}

}  // namespace

OpStatus CopyBlocks(void* stream, std::span<const TensorView> key_caches,
                    std::span<const TensorView> value_caches, std::span<const BlockPair> pairs) {
  constexpr const char* kOp = "CopyBlocks";
  const TensorView& first = key_caches[0];
  if (OpStatus st = cuda_internal::StartOp(kOp, first.device); !st.ok()) return st;
  const int64_t num_blocks = first.shape[0];
  const size_t block_bytes = static_cast<size_t>(first.shape[1] * first.shape[2] * first.shape[3]) *
                             cuda_internal::ElementSize(first.dtype);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const BlockPair& p = pairs[i];
    if (p.src < 0 || p.src >= num_blocks || p.dst < 0 || p.dst >= num_blocks) {
      return cuda_internal::Error(kOp, "pairs[" + std::to_string(i) + "] = (" +
                                           std::to_string(p.src) + ", " + std::to_string(p.dst) +
                                           ") is outside [0, " + std::to_string(num_blocks) + ")");
    }
  }
  const cudaStream_t s = cuda_internal::AsStream(stream);
  // The pairs that move anything; whether they are independent (no block written twice or
  // written and read).
  std::vector<BlockPair> moves;
  std::unordered_set<int64_t> dsts;
  bool independent = true;
  for (const BlockPair& p : pairs) {
    if (p.src == p.dst) continue;
    moves.push_back(p);
    independent = independent && dsts.insert(p.dst).second;
  }
  for (const BlockPair& p : moves) independent = independent && dsts.count(p.src) == 0;
  if (moves.empty() || block_bytes == 0) return OpStatus::Ok();
  if (!independent || num_blocks > INT32_MAX) {
    // In order, pair by pair, as the CPU op.
    for (const BlockPair& p : moves) {
      for (size_t l = 0; l < key_caches.size(); ++l) {
        for (const TensorView* cache : {&key_caches[l], &value_caches[l]}) {
          char* base = static_cast<char*>(cache->data);
          // cache[dst][:][:][:] = cache[src][:][:][:]
          LLM_CUDA_OP_RETURN_IF_ERROR(
              kOp, cudaMemcpyAsync(base + p.dst * block_bytes, base + p.src * block_bytes,
                                   block_bytes, cudaMemcpyDeviceToDevice, s));
        }
      }
    }
    return OpStatus::Ok();
  }
  // (base, stride, count) per launch group: one group for a uniform arena, else one per cache.
  struct Group {
    char* base;
    int64_t stride;
    int64_t count;
  };
  std::vector<Group> groups;
  char* arena = nullptr;
  int64_t stride = 0;
  const int64_t num_caches = static_cast<int64_t>(2 * key_caches.size());
  if (UniformStride(key_caches, value_caches, &arena, &stride) && num_caches <= 65535) {
    groups.push_back({arena, stride, num_caches});
  } else {
    for (size_t l = 0; l < key_caches.size(); ++l) {
      groups.push_back({static_cast<char*>(key_caches[l].data), 0, 1});
      groups.push_back({static_cast<char*>(value_caches[l].data), 0, 1});
    }
  }
  bool aligned = block_bytes % 16 == 0;
  for (const Group& g : groups) {
    aligned = aligned && reinterpret_cast<uintptr_t>(g.base) % 16 == 0 && g.stride % 16 == 0;
  }
  const int64_t word_bytes = aligned ? 16 : 2;
  const int64_t block_words = static_cast<int64_t>(block_bytes) / word_bytes;
  const int threads = cuda_internal::RowThreads(block_words > 256 ? 256 : block_words);
  for (size_t begin = 0; begin < moves.size(); begin += kPairsPerLaunch) {
    const size_t n = std::min<size_t>(kPairsPerLaunch, moves.size() - begin);
    PairChunk chunk{};
    for (size_t i = 0; i < n; ++i) {
      chunk.src[i] = static_cast<int32_t>(moves[begin + i].src);
      chunk.dst[i] = static_cast<int32_t>(moves[begin + i].dst);
    }
    for (const Group& g : groups) {
      const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(g.count));
      if (aligned) {
        ::llm::cuda::Launch(CopyBlocksKernel<Words16>, grid, threads, 0, s, g.base, g.stride, chunk,
                            block_words);
      } else {
        ::llm::cuda::Launch(CopyBlocksKernel<unsigned short>, grid, threads, 0, s, g.base, g.stride,
                            chunk, block_words);
      }
      LLM_CUDA_OP_CHECK_LAUNCH(kOp);
    }
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
