// HostBlockCache (include/dschat/core/host_memory.h): large CPU blocks mapped with mmap and kept
// by size class; small ones from c10's default allocator.
#include "dschat/core/host_memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <sys/mman.h>

#include <algorithm>
#include <iterator>
#include <mutex>
#include <unordered_map>

#include "dschat/core/error.h"

namespace dschat {
namespace core {
namespace {

constexpr size_t kPageBytes = 4096;

// Every mapped large block by address, of every cache: the deleter is a plain function of the
// data pointer (as LibTorch's raw allocation API requires) and finds the block, and its cache,
// here. Its mutex also serialises the caches, whose large requests are few next to the work done
// on them.
struct Registry {
  std::mutex mutex;
  std::unordered_map<void*, void*> blocks;  // data -> HostBlockCache::Block (private to the class)
};
Registry& registry() {
  static Registry* instance = new Registry();  // leaked: blocks may be freed during shutdown
  return *instance;
}

HostBlockCache* installed = nullptr;

}  // namespace

HostBlockCache::HostBlockCache(size_t min_block_bytes) : min_block_bytes_(min_block_bytes) {}

HostBlockCache::~HostBlockCache() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  for (Block* block : free_order_) unmap(block);
}

void HostBlockCache::unmap(Block* block) {
  ::munmap(block->data, block->bytes);
  registry().blocks.erase(block->data);
  stats_.mapped_bytes -= static_cast<int64_t>(block->bytes);
  delete block;
}

size_t HostBlockCache::class_bytes(size_t bytes) {
  size_t power = 1;
  while (power * 2 <= bytes) power *= 2;
  const size_t step = std::max(power / 16, kPageBytes);
  return (bytes + step - 1) / step * step;
}

c10::DataPtr HostBlockCache::allocate(size_t bytes) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (bytes < min_block_bytes_) {
    void* data = c10::alloc_cpu(bytes);
    return {data, data, &HostBlockCache::release_any, cpu};
  }
  const size_t want = class_bytes(bytes);
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto found = free_by_class_.find(want);
  if (found != free_by_class_.end()) {
    Block* block = found->second;
    free_by_class_.erase(found);
    free_order_.erase(block->free_position);
    stats_.free_bytes -= static_cast<int64_t>(block->bytes);
    ++stats_.hits;
    return {block->data, block->data, &HostBlockCache::release_any, cpu};
  }
  evict_for(want);
  void* data = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  DSCHAT_CHECK(data != MAP_FAILED, OutOfMemory, "host memory: cannot map ", want, " bytes for a tensor of ", bytes,
               " bytes (", stats_.mapped_bytes, " bytes mapped by the block cache)");
  auto* block = new Block{this, data, want, {}};
  registry().blocks.emplace(data, block);
  ++stats_.misses;
  stats_.mapped_bytes += static_cast<int64_t>(want);
  stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, stats_.mapped_bytes);
  return {data, data, &HostBlockCache::release_any, cpu};
}

// Before `bytes` more are mapped: unmaps free blocks, oldest first, while the mapped total would
// exceed the largest live total (this request included) by more than the slack. A training loop's
// phases (forward, backward, generation) use blocks of different classes; a slack of an eighth
// lets each keep its own instead of unmapping the other's every iteration.
void HostBlockCache::evict_for(size_t bytes) {
  const int64_t live_after = stats_.mapped_bytes - stats_.free_bytes + static_cast<int64_t>(bytes);
  peak_live_bytes_ = std::max(peak_live_bytes_, live_after);
  const int64_t allowed = peak_live_bytes_ + peak_live_bytes_ / kSlackDivisor;
  while (stats_.mapped_bytes + static_cast<int64_t>(bytes) > allowed && !free_order_.empty()) {
    Block* block = free_order_.front();
    free_order_.pop_front();
    auto [first, last] = free_by_class_.equal_range(block->bytes);
    free_by_class_.erase(std::find_if(first, last, [block](const auto& entry) { return entry.second == block; }));
    stats_.free_bytes -= static_cast<int64_t>(block->bytes);
    ++stats_.evicted_blocks;
    unmap(block);
  }
}

void HostBlockCache::release(Block* block) {
  free_order_.push_back(block);
  block->free_position = std::prev(free_order_.end());
  free_by_class_.emplace(block->bytes, block);
  stats_.free_bytes += static_cast<int64_t>(block->bytes);
}

void HostBlockCache::release_any(void* data) {
  if (data == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto found = registry().blocks.find(data);
    if (found != registry().blocks.end()) {
      auto* block = static_cast<Block*>(found->second);
      block->owner->release(block);
      return;
    }
  }
  c10::free_cpu(data);  // a small block
}

c10::DeleterFnPtr HostBlockCache::raw_deleter() const { return &HostBlockCache::release_any; }

void HostBlockCache::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

HostBlockCacheStats HostBlockCache::stats() const {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return stats_;
}

bool retain_freed_host_memory() {
  static const bool done = [] {
    // glibc keeps its defaults for what stays below the cache's blocks: those small chunks do
    // not fragment its heap the way large ones did.
    installed = new HostBlockCache();  // leaked on purpose: tensors may be freed during shutdown
    c10::SetCPUAllocator(installed, /*priority=*/1);
    return true;
  }();
  return done;
}

HostBlockCacheStats host_block_cache_stats() { return installed ? installed->stats() : HostBlockCacheStats{}; }

}  // namespace core
}  // namespace dschat
