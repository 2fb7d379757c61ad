// Chained hashes of full KV-cache blocks for prefix caching.
//
// A block's hash covers its parent's hash and its own token ids, so equal hashes mean (up to
// a 64-bit collision, which lookups then rule out by comparing tokens and prefix ids, see
// kv_cache_block.h) equal prefixes, not just equal blocks:
//
//   h0 = HashBlockTokens(RootHash(cache_salt), tokens[0:B])
//   h1 = HashBlockTokens(h0, tokens[B:2B])  ...
//
// Extra keys (a per-request cache salt) enter through the root, so requests with different
// salts never share a block. XXH3-64, seeded with the parent hash.
#ifndef LLM_SCHEDULER_SERVICE_CORE_BLOCK_HASH_H_
#define LLM_SCHEDULER_SERVICE_CORE_BLOCK_HASH_H_

#include <cstdint>
#include <span>
#include <string_view>

#include "common/types.h"

namespace llm {

// The parent hash of a request's first block.
uint64_t RootHash(std::string_view cache_salt);

// The hash of one full block given its parent's hash.
uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const TokenId> tokens);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_BLOCK_HASH_H_
