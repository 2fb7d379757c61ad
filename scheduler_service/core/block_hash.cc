#include "scheduler_service/core/block_hash.h"

#define XXH_INLINE_ALL
#include "xxhash.h"

namespace llm {
namespace {
// Distinguishes the root of a chain from any block hash used as a seed.
constexpr uint64_t kRootSeed = 0x9e3779b97f4a7c15ULL;
}  // namespace

uint64_t RootHash(std::string_view cache_salt) {
  return XXH3_64bits_withSeed(cache_salt.data(), cache_salt.size(), kRootSeed);
}

uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const TokenId> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent_hash);
}

}  // namespace llm
