#pragma once
// A thread-safe cache from pre-token to BPE ids, so repeated words skip the merge loop.
// 64 independently locked shards keep concurrent encode() calls from contending on one mutex;
// a full shard is cleared rather than tracked as LRU, which keeps hits cheap (the working set of
// natural text refills it at once). Entries are keyed by a 64-bit hash and keep their word, so a
// hash collision is a miss, never a wrong answer.

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dschat {
namespace tokenizer {

class WordCache {
 public:
  /// Words of `max_word_bytes` or more are not cached (as in `tokenizers`: long words are rare).
  explicit WordCache(size_t entries_per_shard = 2048, size_t max_word_bytes = 256);

  /// Appends the cached ids of `word` to `out` and returns true, or returns false on a miss.
  template <typename Id>
  bool get(std::string_view word, std::vector<Id>& out) const {
    if (word.size() >= max_word_bytes_) return false;
    uint64_t key = hash(word);
    const Shard& shard = shards_[key % kShards];
    std::lock_guard<std::mutex> lock(shard.mutex);
    auto it = shard.map.find(key);
    if (it == shard.map.end() || it->second.word != word) return false;
    out.insert(out.end(), it->second.ids.begin(), it->second.ids.end());
    return true;
  }

  void put(std::string_view word, const std::vector<int32_t>& ids);

 private:
  static constexpr size_t kShards = 64;
  struct Entry {
    std::string word;
    std::vector<int32_t> ids;
  };
  struct alignas(64) Shard {  // one cache line apart, so threads on different shards do not contend
    mutable std::mutex mutex;
    std::unordered_map<uint64_t, Entry> map;
  };
  static uint64_t hash(std::string_view word) { return std::hash<std::string_view>{}(word); }

  size_t entries_per_shard_;
  size_t max_word_bytes_;
  std::array<Shard, kShards> shards_;
};

}  // namespace tokenizer
}  // namespace dschat
