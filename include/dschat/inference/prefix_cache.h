#pragma once
// Prefix caching across requests (vLLM's automatic prefix caching; SGLang's radix cache at block
// granularity): full KV blocks stay in the pool after the sequence that wrote them ends, indexed by
// the tokens they hold and the block before them, so a later prompt that starts with the same
// tokens (a system prompt, a chat's earlier turns, a preempted sequence's own tokens) takes those
// blocks by reference instead of prefilling them again.
//
// The index is a tree of blocks: (parent block, the block_size tokens of this block) -> block, the
// first block's parent -1, so a block stands for its whole prefix and lookups walk from the first
// block. A block is cached at most once and never written while cached: only full blocks enter,
// and a sequence writes only past its full blocks. The cache holds one pool reference per cached
// block; a block no sequence holds (reference count 1) is evictable, the least recently used leaf
// first, so a parent always outlives its cached children and the tree stays connected.
//
// Keys and values depend on the weights: clear() when the model changes (ContinuousEngine::set_model).

#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dschat/inference/kv_block_pool.h"

namespace dschat {
namespace inference {

class PrefixCache {
 public:
  explicit PrefixCache(KvBlockPool& pool) : pool_(&pool) {}
  ~PrefixCache() { clear(); }  // the owner destroys it before the pool
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  /// The cached blocks holding the first full blocks of `tokens`, in order, at most `max_blocks`
  /// (the longest cached prefix); each one retained once for the caller, who releases it.
  std::vector<int64_t> match(const std::vector<int64_t>& tokens, int64_t max_blocks);
  /// Caches blocks[i] as the keys/values of tokens [i * block_size, (i + 1) * block_size) for
  /// i < full_blocks. Where a prefix is cached already in the same block the walk goes on; where
  /// another block holds it (two sequences prefilled the same tokens at once) the cached one stays
  /// and the walk stops, so whoever holds a cached block holds its ancestors too.
  void insert(const std::vector<int64_t>& tokens, const std::vector<int64_t>& blocks, int64_t full_blocks);
  /// Frees the least recently used cached block that no sequence holds and that has no cached
  /// child; false when there is none.
  bool evict_one();
  /// Cached blocks only the cache holds (what eviction can free).
  int64_t evictable_blocks() const;
  /// Releases every cached block (the model changed; the engine ends).
  void clear();

  int64_t cached_blocks() const { return static_cast<int64_t>(nodes_.size()); }
  int64_t evictions() const { return evictions_; }

 private:
  struct Node {
    int64_t parent = -1;          // the block holding the previous block_size tokens, -1 for the first
    std::vector<int64_t> tokens;  // [block_size] the tokens whose keys/values the block holds
    int64_t children = 0;         // cached blocks whose parent this is
    int64_t last_used = 0;        // tick of its last match or insert
  };
  KvBlockPool* pool_;
  std::map<std::pair<int64_t, std::vector<int64_t>>, int64_t> index_;  // (parent, tokens) -> block
  std::unordered_map<int64_t, Node> nodes_;                            // cached block -> its node
  int64_t tick_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace inference
}  // namespace dschat
