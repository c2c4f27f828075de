// HostBlockCache: large blocks are reused by size class without new mappings, a request that
// finds no free block of its class unmaps free blocks first, so the mapped total never exceeds
// the largest live total by more than an eighth; small requests and LibTorch's raw allocation
// API work through it.
#include <gtest/gtest.h>

#include <random>

#include "dschat/core/host_memory.h"

namespace dschat {
namespace core {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(HostBlockCache, ClassesAreAtMostASixteenthAboveTheRequest) {
  EXPECT_EQ(HostBlockCache::class_bytes(kMiB), kMiB);
  EXPECT_EQ(HostBlockCache::class_bytes(kMiB + 1), kMiB + kMiB / 16);
  EXPECT_EQ(HostBlockCache::class_bytes(3 * kMiB), 3 * kMiB);
  for (size_t bytes = kMiB; bytes < 300 * kMiB; bytes = bytes * 9 / 8 + 4093) {
    const size_t c = HostBlockCache::class_bytes(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(c, bytes + bytes / 16) << bytes;
    EXPECT_EQ(c % 4096, 0u) << bytes;
  }
}

TEST(HostBlockCache, AFreedBlockServesTheNextRequestOfItsClass) {
  HostBlockCache cache;
  void* first = nullptr;
  {
    c10::DataPtr block = cache.allocate(3 * kMiB);
    first = block.get();
    static_cast<char*>(first)[3 * kMiB - 1] = 7;  // writable to its end
  }
  EXPECT_EQ(cache.stats().free_bytes, static_cast<int64_t>(3 * kMiB));
  c10::DataPtr again = cache.allocate(3 * kMiB - 100);  // the same class
  EXPECT_EQ(again.get(), first);
  const HostBlockCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.free_bytes, 0);
  EXPECT_EQ(s.mapped_bytes, static_cast<int64_t>(3 * kMiB));
}

TEST(HostBlockCache, AMissUnmapsFreeBlocksOldestFirstBeyondTheSlack) {
  HostBlockCache cache;
  { c10::DataPtr a = cache.allocate(8 * kMiB), b = cache.allocate(8 * kMiB); }
  EXPECT_EQ(cache.stats().mapped_bytes, static_cast<int64_t>(16 * kMiB));
  // Another class: live 12 MiB after it, live peak 16 MiB, so at most 18 MiB may be mapped: the
  // older free block goes (20 MiB would stay), then the newer one.
  c10::DataPtr c = cache.allocate(12 * kMiB);
  HostBlockCacheStats s = cache.stats();
  EXPECT_EQ(s.evicted_blocks, 2);
  EXPECT_EQ(s.mapped_bytes, static_cast<int64_t>(12 * kMiB));
  EXPECT_EQ(s.peak_mapped_bytes, static_cast<int64_t>(16 * kMiB));
  // Within the slack a free block of another class stays: 12 + 2 = 14 <= 18.
  { c10::DataPtr d = cache.allocate(2 * kMiB); }
  c10::DataPtr e = cache.allocate(3 * kMiB);
  s = cache.stats();
  EXPECT_EQ(s.evicted_blocks, 2);
  EXPECT_EQ(s.mapped_bytes, static_cast<int64_t>(17 * kMiB));
}

TEST(HostBlockCache, MappedBytesNeverExceedTheLargestLiveTotal) {
  HostBlockCache cache;
  std::mt19937 rng(11);
  std::uniform_int_distribution<size_t> size(kMiB, 40 * kMiB);
  std::vector<std::pair<c10::DataPtr, int64_t>> live;  // each block and its class bytes
  int64_t live_bytes = 0, peak_live = 0;
  for (int i = 0; i < 2000; ++i) {
    if (!live.empty() && (rng() % 2 == 0 || live.size() > 12)) {
      const size_t at = rng() % live.size();
      live_bytes -= live[at].second;
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
    } else {
      // A few recurring sizes, as a training loop's, and some new ones.
      const size_t bytes = rng() % 4 == 0 ? size(rng) : (rng() % 5 + 1) * 3 * kMiB;
      live.emplace_back(cache.allocate(bytes), static_cast<int64_t>(HostBlockCache::class_bytes(bytes)));
      live_bytes += live.back().second;
    }
    peak_live = std::max(peak_live, live_bytes);
    const HostBlockCacheStats s = cache.stats();
    ASSERT_EQ(s.mapped_bytes - s.free_bytes, live_bytes) << "after operation " << i;
    ASSERT_LE(s.mapped_bytes, peak_live + peak_live / 8) << "after operation " << i;
  }
  EXPECT_GT(cache.stats().hits, 100);  // the recurring sizes were served without new mappings
}

TEST(HostBlockCache, SmallRequestsAndTheRawApiGoThroughTheSameDeleter) {
  HostBlockCache cache;
  c10::DataPtr small = cache.allocate(100);
  ASSERT_NE(small.get(), nullptr);
  EXPECT_EQ(small.get_deleter(), cache.raw_deleter());
  EXPECT_EQ(cache.stats().mapped_bytes, 0);  // not a large block
  c10::DataPtr none = cache.allocate(0);
  void* raw = cache.raw_allocate(2 * kMiB);  // LibTorch's raw API: context == data
  cache.raw_deallocate(raw);
  EXPECT_EQ(cache.stats().free_bytes, static_cast<int64_t>(2 * kMiB));
  void* raw_small = cache.raw_allocate(64);
  cache.raw_deallocate(raw_small);
}

}  // namespace
}  // namespace core
}  // namespace dschat
