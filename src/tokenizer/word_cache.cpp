#include "tokenizer/word_cache.h"

namespace dschat {
namespace tokenizer {

WordCache::WordCache(size_t entries_per_shard, size_t max_word_bytes)
    : entries_per_shard_(entries_per_shard), max_word_bytes_(max_word_bytes) {}

void WordCache::put(std::string_view word, const std::vector<int32_t>& ids) {
  if (word.size() >= max_word_bytes_ || entries_per_shard_ == 0) return;
  uint64_t key = hash(word);
  Shard& shard = shards_[key % kShards];
  std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.map.size() >= entries_per_shard_) shard.map.clear();
  Entry& entry = shard.map[key];
  entry.word.assign(word);
  entry.ids = ids;
}

}  // namespace tokenizer
}  // namespace dschat
