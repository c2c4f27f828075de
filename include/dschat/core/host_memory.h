#pragma once
// How freed host memory is reused. A CPU training loop allocates the same large tensors
// (activations, logits, gradients) every step; glibc's defaults hand large blocks back to the
// kernel when they are freed, so the next step faults in and zeroes fresh pages for each of them
// (step 3 of the CPU benchmark was 10-17% slower for it, docs/benchmarks.md). Keeping them in
// glibc's heap instead fragments it: on the CPU the peak resident size of a training run was then
// 1.3-2.5x its live peak, and differed by 20% between the ranks of one run (docs/plan.md).
//
// HostBlockCache keeps large blocks by size class instead: a freed block waits for the next
// request of its class (no page faults); a request that finds none maps a new block, after
// unmapping free blocks of other classes (oldest first) for as long as the mapped total would
// otherwise exceed the largest live total seen by more than an eighth. So the mapped bytes stay
// within 1/8 of the live peak (in class-rounded bytes; a class is at most 1/16 above the
// request), and a loop whose sizes repeat runs without faults.
//
// dschat's CLI and benchmarks call retain_freed_host_memory() at start, which makes it LibTorch's
// CPU allocator. A program that links libdschat decides for itself: the library never changes
// the process's allocator on its own.
#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>

namespace dschat {
namespace core {

struct HostBlockCacheStats {
  int64_t mapped_bytes = 0;       // large blocks mapped now (in use + free)
  int64_t free_bytes = 0;         // of which free, waiting for reuse
  int64_t peak_mapped_bytes = 0;
  int64_t hits = 0;               // large requests served from a free block
  int64_t misses = 0;             // large requests that mapped a new block
  int64_t evicted_blocks = 0;     // free blocks unmapped to make room
};

class HostBlockCache final : public c10::Allocator {
 public:
  /// Requests below `min_block_bytes` go to the C library (c10::alloc_cpu). 64 KiB: below it
  /// glibc's heap serves them without fragmenting (docs/plan.md, "Measured against planned").
  explicit HostBlockCache(size_t min_block_bytes = size_t{64} << 10);
  /// Unmaps the free blocks. Blocks still in use must not outlive the cache (the installed one
  /// is never destroyed).
  ~HostBlockCache() override;
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  /// The bytes a request of `bytes` maps: a multiple of 1/16 of its power of two (at least a page).
  static size_t class_bytes(size_t bytes);
  HostBlockCacheStats stats() const;

  /// Free blocks are kept while the mapped total is within 1/kSlackDivisor above the live peak.
  static constexpr int64_t kSlackDivisor = 8;

 private:
  struct Block {
    HostBlockCache* owner = nullptr;
    void* data = nullptr;
    size_t bytes = 0;
    std::list<Block*>::iterator free_position;  // in free_order_ while free
  };
  // With the registry's mutex held (every cache shares it: the deleter finds blocks there).
  void release(Block* block);
  void unmap(Block* block);
  void evict_for(size_t bytes);
  static void release_any(void* data);  // the deleter: finds the block of `data`, if a large one

  size_t min_block_bytes_;
  int64_t peak_live_bytes_ = 0;
  std::multimap<size_t, Block*> free_by_class_;  // free blocks, by class bytes
  std::list<Block*> free_order_;                 // free blocks, oldest first
  HostBlockCacheStats stats_;
};

/// Makes a process-lifetime HostBlockCache LibTorch's CPU allocator (once; later calls do
/// nothing) and returns true.
bool retain_freed_host_memory();

/// The installed cache's figures (all zero when retain_freed_host_memory was not called).
HostBlockCacheStats host_block_cache_stats();

}  // namespace core
}  // namespace dschat
