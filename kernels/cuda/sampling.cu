// The device sampler (kernels/sampling.h): one thread block per row does the whole step of
// worker_service/sampler.h, with the same arithmetic, so that a seeded row samples the host
// sampler's tokens:
//   1. the non-finite check (the lowest bad column), the raw max and log-sum-exp (logprobs);
//   2. the row's logit biases (added into the scaled-logit buffer first, when it has any),
//      penalties from the row's slot (output counts, prompt bitmap), temperature scaling into
//      the workspace's scaled logits s, and the argmax (lowest id on ties; greedy's token);
//   3. min-p as a predicate (s - max >= log(min_p)); top-k and top-p as prefixes of the order
//      "s descending, then token id ascending", found by radix selection over order-preserving
//      32-bit keys of s (4 passes of 8-bit digits, histograms of counts or of fixed-point
//      masses in shared memory) and, for ties at the boundary, the lowest ids;
//   4. the exponential race (kernels/philox.h) over the kept tokens: the argmax of the scores
//      (in double), most tokens ruled out by philox::RaceBound before their logarithms;
//   5. the sampled token's raw logprob and the top N (a radix selection of the N largest raw
//      logits, then a rank sort of those N), and the slot's count of the token incremented.
// Nothing runs on the host beyond the one copy of the parameters in and of the results out.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/philox.h"
#include "kernels/sampling.h"

namespace llm::ops::sampling {

struct Workspace {
  int ordinal = 0;
  int max_rows = 0;
  int vocab = 0;
  int max_logprobs = 0;
  int num_slots = 0;
  int mask_words = 0;
  size_t result_stride = 0;  // bytes per row: RowResult, ids[max_logprobs], values[...]
  RowParams* h_params = nullptr;
  RowParams* d_params = nullptr;
  float* d_scaled = nullptr;
  char* d_results = nullptr;
  char* h_results = nullptr;
  int32_t* d_counts = nullptr;
  uint32_t* d_masks = nullptr;
  uint32_t* h_prompt = nullptr;
  int32_t* h_counts = nullptr;    // one row, InitSlot's with_counts
  uint32_t* h_allowed = nullptr;  // [max_rows, mask_words]: structured outputs' token masks
  uint32_t* d_allowed = nullptr;
  TokenBias* h_bias = nullptr;  // logit biases of a step's rows (ReserveBias)
  TokenBias* d_bias = nullptr;
  int64_t bias_capacity = 0;
};

namespace {

using ::llm::ops::cuda_internal::AsStream;

constexpr int kMaxLogprobs = 1024;
constexpr int kMaxThreads = 1024;

// An order-preserving key of a float (larger float, larger key); -0 and +0 share one.
__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t bits = __float_as_uint(f + 0.0f);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The elements kept by a prefix of the order (key descending, id ascending) that ends at
// (key, id). The whole order: key 0, id INT_MAX.
struct Bound {
  uint32_t key;
  int32_t id;
  __device__ __forceinline__ bool Keeps(uint32_t k, int32_t i) const {
    return k > key || (k == key && i <= id);
  }
};

template <typename T>
__device__ __forceinline__ void WarpArgMax(T& v, int& id) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const T ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int oid = __shfl_xor_sync(0xffffffffu, id, offset);
    if (ov > v || (ov == v && oid < id)) {
      v = ov;
      id = oid;
    }
  }
}

// The largest v over the block (lowest id among equal ones), to every thread. Threads with
// nothing pass -INFINITY, INT_MAX.
template <typename T>
__device__ void BlockArgMax(T& v, int& id, T* sv, int* si) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  WarpArgMax(v, id);
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = id;
  }
  __syncthreads();
  const int num_warps = blockDim.x / 32;
  v = lane < num_warps ? sv[lane] : static_cast<T>(-INFINITY);
  id = lane < num_warps ? si[lane] : INT_MAX;
  WarpArgMax(v, id);
  __syncthreads();
}

__device__ unsigned long long BlockSumU64(unsigned long long v, unsigned long long* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  unsigned long long total = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0ull;
  for (int offset = 16; offset > 0; offset >>= 1) {
    total += __shfl_xor_sync(0xffffffffu, total, offset);
  }
  __syncthreads();
  return total;
}

__device__ int BlockMinInt(int v, int* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset >>= 1)
    v = min(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  int m = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : INT_MAX;
  for (int offset = 16; offset > 0; offset >>= 1)
    m = min(m, __shfl_xor_sync(0xffffffffu, m, offset));
  __syncthreads();
  return m;
}

// Shared state of the radix selection.
struct SelectShared {
  unsigned long long weight[256];
  unsigned int count[256];
  unsigned int scan[kMaxThreads];
  unsigned long long above;
  unsigned long long tie_weight;
  unsigned int tie_count;
  int digit;
  int id;
};

// Among the tokens i < n with pred(i), in the order (key(i) descending, i ascending): the
// shortest prefix whose total weight(i) reaches `target` (>= 1; their total must reach it),
// as the bound at its last element. Tokens of equal key must have equal weights.
template <typename KeyFn, typename PredFn, typename WeightFn>
__device__ Bound SelectPrefix(int n, unsigned long long target, KeyFn key, PredFn pred,
                              WeightFn weight, SelectShared& sh) {
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      sh.weight[b] = 0;
      sh.count[b] = 0;
    }
    if (shift == 24 && threadIdx.x == 0) sh.above = 0;
    __syncthreads();
    // Each thread adds runs of equal digits at once: the first passes see few distinct
    // digits (logits share their sign and exponent), where an atomic per token would
    // serialize the whole block on one or two bins.
    int run_digit = -1;
    unsigned int run_count = 0;
    unsigned long long run_weight = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if (!pred(i)) continue;
      const uint32_t k = key(i);
      if ((k & mask) != prefix) continue;
      const int d = (k >> shift) & 255;
      if (d != run_digit) {
        if (run_count > 0) {
          atomicAdd(&sh.weight[run_digit], run_weight);
          atomicAdd(&sh.count[run_digit], run_count);
        }
        run_digit = d;
        run_count = 0;
        run_weight = 0;
      }
      ++run_count;
      run_weight += static_cast<unsigned long long>(weight(i));
    }
    if (run_count > 0) {
      atomicAdd(&sh.weight[run_digit], run_weight);
      atomicAdd(&sh.count[run_digit], run_count);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long acc = sh.above;
      int d = 255;
      for (; d > 0; --d) {
        if (acc + sh.weight[d] >= target) break;
        acc += sh.weight[d];
      }
      sh.digit = d;
      sh.above = acc;
      sh.tie_weight = sh.weight[d];
      sh.tie_count = sh.count[d];
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.digit) << shift;
    mask |= 255u << shift;
  }
  // The tokens of key `prefix` are ties: the first `need` of them (lowest ids) complete it.
  const unsigned long long each = sh.tie_weight / (sh.tie_count > 0 ? sh.tie_count : 1);
  const unsigned long long rest = target - sh.above;
  const unsigned int tie_count = sh.tie_count;
  const unsigned long long need = each > 0 ? (rest + each - 1) / each : tie_count;
  __syncthreads();  // sh is reused by the next selection
  if (need >= tie_count) return Bound{prefix, INT_MAX};
  // A scan of the ties' counts over contiguous chunks of ids, one chunk per thread.
  const int chunk = (n + blockDim.x - 1) / blockDim.x;
  const int lo = threadIdx.x * chunk, hi = min(n, lo + chunk);
  unsigned int mine = 0;
  for (int i = lo; i < hi; ++i) mine += (pred(i) && key(i) == prefix) ? 1u : 0u;
  sh.scan[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int acc = 0;
    for (unsigned t = 0; t < blockDim.x; ++t) {
      const unsigned int c = sh.scan[t];
      sh.scan[t] = acc;
      acc += c;
    }
  }
  __syncthreads();
  const unsigned int before = sh.scan[threadIdx.x];
  if (before < need && before + mine >= need) {
    unsigned int seen = before;
    for (int i = lo; i < hi; ++i) {
      if (pred(i) && key(i) == prefix && ++seen == need) {
        sh.id = i;
        break;
      }
    }
  }
  __syncthreads();
  const Bound b{prefix, sh.id};
  __syncthreads();
  return b;
}

struct KernelShared {
  SelectShared select;
  float fv[32];
  double dv[32];
  int fi[32];
  unsigned long long u64[32];
  float top_val[kMaxLogprobs];
  int top_id[kMaxLogprobs];
  uint32_t top_key[kMaxLogprobs];
  int top_n;
};

__global__ void __launch_bounds__(kMaxThreads, 1)
    SampleKernel(const float* __restrict__ logits, const RowParams* __restrict__ params,
                 float* scaled_all, int32_t* counts_all, const uint32_t* __restrict__ masks_all,
                 const TokenBias* __restrict__ bias_all, const uint32_t* __restrict__ allowed_all,
                 char* results, size_t result_stride, int vocab, int mask_words) {
  __shared__ KernelShared sh;
  const int row = blockIdx.x;
  const RowParams p = params[row];
  const float* x = logits + static_cast<int64_t>(row) * vocab;
  float* s = scaled_all + static_cast<int64_t>(row) * vocab;
  RowResult* res = reinterpret_cast<RowResult*>(results + row * result_stride);
  int32_t* top_ids = reinterpret_cast<int32_t*>(res + 1);
  float* top_vals = reinterpret_cast<float*>(top_ids + (result_stride - sizeof(RowResult)) / 8);

  // 1. Non-finite check, raw max.
  int bad = INT_MAX;
  float raw_max = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = x[i];
    if (!isfinite(v)) {
      bad = min(bad, i);
    } else {
      raw_max = fmaxf(raw_max, v);
    }
  }
  bad = BlockMinInt(bad, sh.fi);
  if (bad != INT_MAX) {
    if (threadIdx.x == 0) {
      res->token = -1;
      res->logprob = 0;
      res->flags = kNonFinite | (isnan(x[bad]) ? kNan : 0);
      res->bad_column = bad;
    }
    return;
  }
  raw_max = ::llm::ops::cuda_internal::BlockMax(raw_max, sh.fv);
  float lse = 0;
  if (p.num_logprobs >= 0) {
    float sum = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) sum += expf(x[i] - raw_max);
    lse = raw_max + logf(::llm::ops::cuda_internal::BlockSum(sum, sh.fv));
  }

  // 2. Penalties, temperature, argmax.
  const bool greedy = p.temperature == 0.0f;
  const int32_t* counts = p.slot >= 0 ? counts_all + static_cast<int64_t>(p.slot) * vocab : nullptr;
  const uint32_t* mask =
      p.slot >= 0 ? masks_all + static_cast<int64_t>(p.slot) * mask_words : nullptr;
  const bool repetition = p.repetition_penalty != 1.0f;
  const uint32_t* allowed =
      p.constrained != 0 ? allowed_all + static_cast<int64_t>(row) * mask_words : nullptr;
  // Logit biases: the biased logits are built in s (x stays read only), which the loop below
  // then reads and overwrites element by element, each by the thread that reads it.
  const float* z_in = x;
  if (p.bias_count > 0) {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) s[i] = x[i];
    __syncthreads();
    const TokenBias* bias = bias_all + p.bias_begin;
    for (int j = threadIdx.x; j < p.bias_count; j += blockDim.x) {
      const int t = bias[j].token;
      if (t >= 0 && t < vocab) s[t] += bias[j].bias;  // distinct ids: no two threads share one
    }
    __syncthreads();
    z_in = s;
  }
  float best = -INFINITY;
  float s_max = -INFINITY;
  int best_id = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    float z = z_in[i];
    if (allowed != nullptr && ((allowed[i >> 5] >> (i & 31)) & 1u) == 0) z = -INFINITY;
    if (counts != nullptr) {
      const int c = counts[i];
      const bool seen = repetition && (c > 0 || ((mask[i >> 5] >> (i & 31)) & 1u));
      z = ::llm::philox::Penalize(z, seen, c, p.repetition_penalty, p.frequency_penalty,
                                  p.presence_penalty);
    }
    const float v = greedy ? z : z / p.temperature + 0.0f;
    s[i] = v;
    s_max = fmaxf(s_max, v);
    if (z > best || (z == best && i < best_id)) {
      best = z;
      best_id = i;
    }
  }
  // The argmax of the penalized logits: greedy's token, and the fallback should nothing
  // survive the filters (scaled logits that overflow to inf), as on the host.
  BlockArgMax(best, best_id, sh.fv, sh.fi);
  int token = best_id;

  if (!greedy) {
    // 3. min-p, top-k, top-p.
    const float m = ::llm::ops::cuda_internal::BlockMax(s_max, sh.fv);
    const float log_min_p = p.log_min_p;
    auto key = [&](int i) { return OrderKey(s[i]); };
    auto min_p_ok = [&](int i) { return s[i] - m >= log_min_p; };
    Bound top_k{0, INT_MAX};
    if (p.top_k > 0 && p.top_k < vocab) {
      unsigned long long n0 = 0;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) n0 += min_p_ok(i) ? 1 : 0;
      n0 = BlockSumU64(n0, sh.u64);
      if (static_cast<unsigned long long>(p.top_k) < n0) {
        top_k = SelectPrefix(
            vocab, static_cast<unsigned long long>(p.top_k), key, min_p_ok,
            [](int) { return 1ull; }, sh.select);
      }
    }
    auto kept_k = [&](int i) { return min_p_ok(i) && top_k.Keeps(key(i), i); };
    Bound top_p{0, INT_MAX};
    if (p.top_p < 1.0) {
      auto mass = [&](int i) {
        return static_cast<unsigned long long>(::llm::philox::MassFixed(s[i] - m));
      };
      unsigned long long total = 0;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) total += kept_k(i) ? mass(i) : 0;
      total = BlockSumU64(total, sh.u64);
      top_p = SelectPrefix(vocab, ::llm::philox::TopPTarget(p.top_p, total), key, kept_k, mass,
                           sh.select);
    }
    // 4. The race.
    double win = -INFINITY;
    int win_id = INT_MAX;
    const int groups = (vocab + 3) / 4;
    // Exact, with most tokens ruled out by the thread's own best score so far (the block's
    // winner beats it), first without their random bits, then without their logarithms.
    auto kept = [&](int i) { return i < vocab && kept_k(i) && top_p.Keeps(key(i), i); };
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
      bool any = false;
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * g + j;
        any |= kept(i) && (win_id == INT_MAX ||
                           static_cast<double>(s[i]) + ::llm::philox::kMaxRaceBound >= win);
      }
      if (!any) continue;
      const ::llm::philox::U32x4 bits =
          ::llm::philox::DrawBits4(p.key, p.sample_index, static_cast<uint32_t>(g));
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * g + j;
        if (!kept(i)) continue;
        if (win_id != INT_MAX &&
            static_cast<double>(s[i]) + ::llm::philox::RaceBound(bits.v[j]) < win) {
          continue;
        }
        const double score = ::llm::philox::RaceScore(s[i], bits.v[j]);
        if (win_id == INT_MAX || score > win || (score == win && i < win_id)) {
          win = score;
          win_id = i;
        }
      }
    }
    BlockArgMax(win, win_id, sh.dv, sh.fi);
    if (win_id != INT_MAX) token = win_id;  // else nothing survived: the argmax, as the host
  }

  // 5. Logprobs, counts.
  if (p.num_logprobs > 0) {
    const int n = min(p.num_logprobs, vocab);
    auto raw_key = [&](int i) { return OrderKey(x[i]); };
    Bound top{0, INT_MAX};
    if (n < vocab) {
      top = SelectPrefix(
          vocab, static_cast<unsigned long long>(n), raw_key, [](int) { return true; },
          [](int) { return 1ull; }, sh.select);
    }
    if (threadIdx.x == 0) sh.top_n = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const uint32_t k = raw_key(i);
      if (!top.Keeps(k, i)) continue;
      const int at = atomicAdd(&sh.top_n, 1);
      sh.top_key[at] = k;
      sh.top_id[at] = i;
      sh.top_val[at] = x[i] - lse;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      int rank = 0;
      for (int l = 0; l < n; ++l) {
        rank += (sh.top_key[l] > sh.top_key[j] ||
                 (sh.top_key[l] == sh.top_key[j] && sh.top_id[l] < sh.top_id[j]))
                    ? 1
                    : 0;
      }
      top_ids[rank] = sh.top_id[j];
      top_vals[rank] = sh.top_val[j];
    }
  }
  if (threadIdx.x == 0) {
    res->token = token;
    res->logprob = p.num_logprobs >= 0 ? x[token] - lse : 0.0f;
    res->flags = 0;
    res->bad_column = -1;
    if (counts != nullptr) counts_all[static_cast<int64_t>(p.slot) * vocab + token] += 1;
  }
}

OpStatus Fail(const char* op, const std::string& message) {
  return OpStatus::Error(std::string(op) + ": " + message);
}

}  // namespace

OpStatus CreateWorkspace(int ordinal, int max_rows, int vocab_size, int max_logprobs, int num_slots,
                         Workspace** out) {
  constexpr const char* kOp = "sampling::CreateWorkspace";
  *out = nullptr;
  if (max_rows < 1) return Fail(kOp, "max_rows is " + std::to_string(max_rows) + "; must be >= 1");
  if (vocab_size < 1) {
    return Fail(kOp, "vocab_size is " + std::to_string(vocab_size) + "; must be >= 1");
  }
  if (max_logprobs < 0 || max_logprobs > kMaxLogprobs) {
    return Fail(kOp, "max_logprobs is " + std::to_string(max_logprobs) + "; must be in [0, " +
                         std::to_string(kMaxLogprobs) + "]");
  }
  if (num_slots < 0)
    return Fail(kOp, "num_slots is " + std::to_string(num_slots) + "; must be >= 0");
  if (OpStatus st = cuda_internal::StartOp(kOp, TensorDevice::Cuda(ordinal)); !st.ok()) return st;
  auto* ws = new Workspace;
  ws->ordinal = ordinal;
  ws->max_rows = max_rows;
  ws->vocab = vocab_size;
  ws->max_logprobs = max_logprobs;
  ws->num_slots = num_slots;
  ws->mask_words = (vocab_size + 31) / 32;
  ws->result_stride = sizeof(RowResult) + static_cast<size_t>(max_logprobs) * 8;
  const size_t rows = static_cast<size_t>(max_rows);
  const size_t slots = static_cast<size_t>(num_slots);
  auto fail = [&](const std::string& msg) {
    DestroyWorkspace(ws);
    return Fail(kOp, msg);
  };
#define LLM_SAMPLING_ALLOC(expr)                                                   \
  do {                                                                             \
    std::string _m = ::llm::cuda::ErrorMessage((expr), #expr, __FILE__, __LINE__); \
    if (!_m.empty()) return fail(_m);                                              \
  } while (0)
  LLM_SAMPLING_ALLOC(cudaMallocHost(&ws->h_params, rows * sizeof(RowParams)));
  LLM_SAMPLING_ALLOC(cudaMalloc(&ws->d_params, rows * sizeof(RowParams)));
  LLM_SAMPLING_ALLOC(cudaMalloc(&ws->d_scaled, rows * vocab_size * sizeof(float)));
  LLM_SAMPLING_ALLOC(cudaMalloc(&ws->d_results, rows * ws->result_stride));
  LLM_SAMPLING_ALLOC(cudaMallocHost(&ws->h_results, rows * ws->result_stride));
  LLM_SAMPLING_ALLOC(cudaMallocHost(&ws->h_allowed, rows * ws->mask_words * sizeof(uint32_t)));
  LLM_SAMPLING_ALLOC(cudaMalloc(&ws->d_allowed, rows * ws->mask_words * sizeof(uint32_t)));
  if (slots > 0) {
    LLM_SAMPLING_ALLOC(cudaMallocHost(&ws->h_prompt, slots * ws->mask_words * sizeof(uint32_t)));
    LLM_SAMPLING_ALLOC(cudaMallocHost(&ws->h_counts, vocab_size * sizeof(int32_t)));
    LLM_SAMPLING_ALLOC(cudaMalloc(&ws->d_counts, slots * vocab_size * sizeof(int32_t)));
    LLM_SAMPLING_ALLOC(cudaMalloc(&ws->d_masks, slots * ws->mask_words * sizeof(uint32_t)));
  }
#undef LLM_SAMPLING_ALLOC
  std::memset(ws->h_params, 0, rows * sizeof(RowParams));
  *out = ws;
  return OpStatus::Ok();
}

void DestroyWorkspace(Workspace* ws) {
  if (ws == nullptr) return;
  int current = -1;
  cudaGetDevice(&current);
  cudaSetDevice(ws->ordinal);
  cudaDeviceSynchronize();
  cudaFreeHost(ws->h_params);
  cudaFree(ws->d_params);
  cudaFree(ws->d_scaled);
  cudaFree(ws->d_results);
  cudaFreeHost(ws->h_results);
  cudaFreeHost(ws->h_allowed);
  cudaFree(ws->d_allowed);
  cudaFreeHost(ws->h_prompt);
  cudaFreeHost(ws->h_counts);
  cudaFree(ws->d_counts);
  cudaFree(ws->d_masks);
  cudaFreeHost(ws->h_bias);
  cudaFree(ws->d_bias);
  if (current >= 0) cudaSetDevice(current);
  delete ws;
}

RowParams* HostParams(Workspace* ws) { return ws->h_params; }

uint32_t* PromptStaging(Workspace* ws, int slot) {
  return ws->h_prompt + static_cast<size_t>(slot) * ws->mask_words;
}

int32_t* CountStaging(Workspace* ws) { return ws->h_counts; }

uint32_t* AllowedStaging(Workspace* ws, int row) {
  return ws->h_allowed + static_cast<size_t>(row) * ws->mask_words;
}

OpStatus ReserveBias(Workspace* ws, int64_t entries) {
  constexpr const char* kOp = "sampling::ReserveBias";
  if (entries < 0) return Fail(kOp, "entries is " + std::to_string(entries) + "; must be >= 0");
  if (entries <= ws->bias_capacity) return OpStatus::Ok();
  if (OpStatus st = cuda_internal::StartOp(kOp, TensorDevice::Cuda(ws->ordinal)); !st.ok()) {
    return st;
  }
  const int64_t capacity = std::max<int64_t>({entries, 2 * ws->bias_capacity, 1024});
  // The old buffers may still be read by a copy in flight.
  LLM_CUDA_OP_RETURN_IF_ERROR(kOp, cudaDeviceSynchronize());
  cudaFreeHost(ws->h_bias);
  cudaFree(ws->d_bias);
  ws->h_bias = nullptr;
  ws->d_bias = nullptr;
  ws->bias_capacity = 0;
  LLM_CUDA_OP_RETURN_IF_ERROR(kOp, cudaMallocHost(&ws->h_bias, capacity * sizeof(TokenBias)));
  LLM_CUDA_OP_RETURN_IF_ERROR(kOp, cudaMalloc(&ws->d_bias, capacity * sizeof(TokenBias)));
  ws->bias_capacity = capacity;
  return OpStatus::Ok();
}

TokenBias* BiasStaging(Workspace* ws) { return ws->h_bias; }

OpStatus InitSlot(const OpContext& ctx, Workspace* ws, int slot, bool with_prompt,
                  bool with_counts) {
  constexpr const char* kOp = "sampling::InitSlot";
  if (slot < 0 || slot >= ws->num_slots) {
    return Fail(kOp, "slot " + std::to_string(slot) + " is not in [0, " +
                         std::to_string(ws->num_slots) + ")");
  }
  if (OpStatus st = cuda_internal::StartOp(kOp, TensorDevice::Cuda(ws->ordinal)); !st.ok()) {
    return st;
  }
  cudaStream_t stream = AsStream(ctx.stream);
  const size_t mask_bytes = ws->mask_words * sizeof(uint32_t);
  int32_t* counts = ws->d_counts + static_cast<size_t>(slot) * ws->vocab;
  uint32_t* mask = ws->d_masks + static_cast<size_t>(slot) * ws->mask_words;
  if (with_counts) {
    LLM_CUDA_OP_RETURN_IF_ERROR(kOp,
                                cudaMemcpyAsync(counts, ws->h_counts, ws->vocab * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream));
  } else {
    LLM_CUDA_OP_RETURN_IF_ERROR(kOp,
                                cudaMemsetAsync(counts, 0, ws->vocab * sizeof(int32_t), stream));
  }
  if (!with_prompt) {
    LLM_CUDA_OP_RETURN_IF_ERROR(kOp, cudaMemsetAsync(mask, 0, mask_bytes, stream));
  } else {
    LLM_CUDA_OP_RETURN_IF_ERROR(kOp, cudaMemcpyAsync(mask, PromptStaging(ws, slot), mask_bytes,
                                                     cudaMemcpyHostToDevice, stream));
  }
  return OpStatus::Ok();
}

OpStatus CopySlot(const OpContext& ctx, Workspace* ws, int from, int to) {
  constexpr const char* kOp = "sampling::CopySlot";
  for (int slot : {from, to}) {
    if (slot < 0 || slot >= ws->num_slots) {
      return Fail(kOp, "slot " + std::to_string(slot) + " is not in [0, " +
                           std::to_string(ws->num_slots) + ")");
    }
  }
  if (OpStatus st = cuda_internal::StartOp(kOp, TensorDevice::Cuda(ws->ordinal)); !st.ok()) {
    return st;
  }
  if (from == to) return OpStatus::Ok();
  cudaStream_t stream = AsStream(ctx.stream);
  LLM_CUDA_OP_RETURN_IF_ERROR(
      kOp, cudaMemcpyAsync(ws->d_counts + static_cast<size_t>(to) * ws->vocab,
                           ws->d_counts + static_cast<size_t>(from) * ws->vocab,
                           ws->vocab * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
  LLM_CUDA_OP_RETURN_IF_ERROR(
      kOp, cudaMemcpyAsync(ws->d_masks + static_cast<size_t>(to) * ws->mask_words,
                           ws->d_masks + static_cast<size_t>(from) * ws->mask_words,
                           ws->mask_words * sizeof(uint32_t), cudaMemcpyDeviceToDevice, stream));
  return OpStatus::Ok();
}

OpStatus Sample(const OpContext& ctx, Workspace* ws, const TensorView& logits, int rows) {
  constexpr const char* kOp = "sampling::Sample";
  if (rows < 0 || rows > ws->max_rows) {
    return Fail(kOp, "rows is " + std::to_string(rows) + "; must be in [0, " +
                         std::to_string(ws->max_rows) + "]");
  }
  const bool contiguous = logits.ndim == 2 && logits.strides[1] == 1 &&
                          (logits.shape[0] <= 1 || logits.strides[0] == logits.shape[1]);
  if (logits.dtype != DType::kF32 || logits.ndim != 2 || logits.shape[0] != rows ||
      logits.shape[1] != ws->vocab || !contiguous ||
      !(logits.device == TensorDevice::Cuda(ws->ordinal)) || (rows > 0 && logits.data == nullptr)) {
    std::string got = "rank " + std::to_string(logits.ndim) + " [";
    for (int d = 0; d < logits.ndim && d < kMaxDims; ++d) {
      got += (d > 0 ? ", " : "") + std::to_string(logits.shape[d]);
    }
    got += std::string("]") + (logits.dtype == DType::kF32 ? " f32" : " (not f32)") +
           (contiguous ? "" : " (not contiguous)") + " on " +
           (logits.device.is_cuda() ? "cuda:" + std::to_string(logits.device.ordinal) : "cpu");
    return Fail(kOp, "logits: expected f32 [" + std::to_string(rows) + ", " +
                         std::to_string(ws->vocab) +
                         "] contiguous on cuda:" + std::to_string(ws->ordinal) + ", got " + got);
  }
  int64_t bias_entries = 0;
  int constrained_rows = 0;  // one past the last constrained row
  for (int r = 0; r < rows; ++r) {
    const RowParams& p = ws->h_params[r];
    if (p.constrained != 0) constrained_rows = r + 1;
    if (p.num_logprobs > ws->max_logprobs) {
      return Fail(kOp, "row " + std::to_string(r) + ": num_logprobs is " +
                           std::to_string(p.num_logprobs) + "; the workspace holds at most " +
                           std::to_string(ws->max_logprobs));
    }
    if (p.slot >= ws->num_slots) {
      return Fail(kOp, "row " + std::to_string(r) + ": slot " + std::to_string(p.slot) +
                           " is not below num_slots " + std::to_string(ws->num_slots));
    }
    if (p.bias_count < 0 || p.bias_begin < 0 ||
        static_cast<int64_t>(p.bias_begin) + p.bias_count > ws->bias_capacity) {
      return Fail(kOp, "row " + std::to_string(r) + ": logit biases [" +
                           std::to_string(p.bias_begin) + ", +" + std::to_string(p.bias_count) +
                           ") are outside the " + std::to_string(ws->bias_capacity) +
                           " reserved (ReserveBias)");
    }
    bias_entries = std::max<int64_t>(bias_entries, int64_t{p.bias_begin} + p.bias_count);
    if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
      return Fail(kOp, "row " + std::to_string(r) + ": temperature " +
                           std::to_string(p.temperature) + " is not finite and >= 0");
    }
  }
  if (OpStatus st = cuda_internal::StartOp(kOp, logits.device); !st.ok()) return st;
  if (rows == 0) return OpStatus::Ok();
  cudaStream_t stream = AsStream(ctx.stream);
  LLM_CUDA_OP_RETURN_IF_ERROR(kOp,
                              cudaMemcpyAsync(ws->d_params, ws->h_params, rows * sizeof(RowParams),
                                              cudaMemcpyHostToDevice, stream));
  if (bias_entries > 0) {
    LLM_CUDA_OP_RETURN_IF_ERROR(
        kOp, cudaMemcpyAsync(ws->d_bias, ws->h_bias, bias_entries * sizeof(TokenBias),
                             cudaMemcpyHostToDevice, stream));
  }
  if (constrained_rows > 0) {
    LLM_CUDA_OP_RETURN_IF_ERROR(
        kOp, cudaMemcpyAsync(ws->d_allowed, ws->h_allowed,
                             constrained_rows * ws->mask_words * sizeof(uint32_t),
                             cudaMemcpyHostToDevice, stream));
  }
  // Results poisoned (token -1, NaN logprobs), so that a field the kernel fails to write shows.
  LLM_CUDA_OP_RETURN_IF_ERROR(
      kOp, cudaMemsetAsync(ws->d_results, 0xFF, rows * ws->result_stride, stream));
  const int threads =
      cuda_internal::RowThreads((ws->vocab + 7) / 8 < 64 ? 64 : (ws->vocab + 7) / 8);
  ::llm::cuda::Launch(SampleKernel, static_cast<unsigned>(rows), threads, 0, stream,
                      logits.data_as<const float>(), ws->d_params, ws->d_scaled, ws->d_counts,
                      ws->d_masks, ws->d_bias, ws->d_allowed, ws->d_results, ws->result_stride,
                      ws->vocab, ws->mask_words);
  LLM_CUDA_OP_CHECK_LAUNCH(kOp);
  LLM_CUDA_OP_RETURN_IF_ERROR(
      kOp, cudaMemcpyAsync(ws->h_results, ws->d_results, rows * ws->result_stride,
                           cudaMemcpyDeviceToHost, stream));
  LLM_CUDA_OP_RETURN_IF_ERROR(kOp, cudaStreamSynchronize(stream));
  return OpStatus::Ok();
}

const RowResult& Result(const Workspace* ws, int row) {
  return *reinterpret_cast<const RowResult*>(ws->h_results + row * ws->result_stride);
}

const int32_t* TopLogprobIds(const Workspace* ws, int row) {
  return reinterpret_cast<const int32_t*>(&Result(ws, row) + 1);
}

const float* TopLogprobValues(const Workspace* ws, int row) {
  return reinterpret_cast<const float*>(TopLogprobIds(ws, row) + ws->max_logprobs);
}

}  // namespace llm::ops::sampling
