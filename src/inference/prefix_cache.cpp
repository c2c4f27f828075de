#include "dschat/inference/prefix_cache.h"

#include <algorithm>

#include "dschat/core/error.h"

namespace dschat {
namespace inference {

namespace {

std::vector<int64_t> block_tokens(const std::vector<int64_t>& tokens, int64_t block, int64_t block_size) {
  return std::vector<int64_t>(tokens.begin() + block * block_size, tokens.begin() + (block + 1) * block_size);
}

}  // namespace

std::vector<int64_t> PrefixCache::match(const std::vector<int64_t>& tokens, int64_t max_blocks) {
  const int64_t block_size = pool_->block_size();
  const int64_t full = std::min(max_blocks, static_cast<int64_t>(tokens.size()) / block_size);
  std::vector<int64_t> matched;
  int64_t parent = -1;
  ++tick_;
  for (int64_t b = 0; b < full; ++b) {
    auto found = index_.find({parent, block_tokens(tokens, b, block_size)});
    if (found == index_.end()) break;
    parent = found->second;
    nodes_.at(parent).last_used = tick_;
    pool_->retain(parent);
    matched.push_back(parent);
  }
  return matched;
}

void PrefixCache::insert(const std::vector<int64_t>& tokens, const std::vector<int64_t>& blocks, int64_t full_blocks) {
  const int64_t block_size = pool_->block_size();
  DSCHAT_CHECK(full_blocks <= static_cast<int64_t>(blocks.size()) &&
                   full_blocks * block_size <= static_cast<int64_t>(tokens.size()),
               InvalidArgument, "prefix cache: ", full_blocks, " full blocks of ", block_size, " tokens from ",
               blocks.size(), " blocks holding ", tokens.size(), " tokens");
  int64_t parent = -1;
  ++tick_;
  for (int64_t b = 0; b < full_blocks; ++b) {
    auto key = std::make_pair(parent, block_tokens(tokens, b, block_size));
    auto found = index_.find(key);
    if (found != index_.end()) {
      nodes_.at(found->second).last_used = tick_;
      // Another block holds the same tokens (two sequences prefilled them before either was
      // cached): stop, so a cached block's ancestors are always in the table of whoever holds it
      // (then a block only the cache holds has no held descendant, and all of them are evictable).
      if (found->second != blocks[b]) break;
      parent = found->second;
      continue;
    }
    const int64_t block = blocks[b];
    if (nodes_.count(block) != 0) break;  // the block stands for another prefix: stop here
    pool_->retain(block);
    Node& node = nodes_[block];
    node.parent = parent;
    node.tokens = std::move(key.second);
    node.last_used = tick_;
    if (parent >= 0) ++nodes_.at(parent).children;
    index_.emplace(std::make_pair(parent, node.tokens), block);
    parent = block;
  }
}

bool PrefixCache::evict_one() {
  int64_t victim = -1, oldest = 0;
  for (const auto& [block, node] : nodes_) {
    if (node.children != 0 || pool_->reference_count(block) != 1) continue;
    if (victim < 0 || node.last_used < oldest || (node.last_used == oldest && block < victim)) {
      victim = block;
      oldest = node.last_used;
    }
  }
  if (victim < 0) return false;
  Node& node = nodes_.at(victim);
  index_.erase({node.parent, node.tokens});
  if (node.parent >= 0) --nodes_.at(node.parent).children;
  nodes_.erase(victim);
  pool_->release(victim);
  ++evictions_;
  return true;
}

int64_t PrefixCache::evictable_blocks() const {
  return std::count_if(nodes_.begin(), nodes_.end(),
                       [&](const auto& entry) { return pool_->reference_count(entry.first) == 1; });
}

void PrefixCache::clear() {
  for (const auto& entry : nodes_) pool_->release(entry.first);
  nodes_.clear();
  index_.clear();
}

}  // namespace inference
}  // namespace dschat
