#include "inference/paged_decode_graph.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "dschat/core/error.h"
#include "inference/graph_capture.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#endif

namespace dschat {
namespace inference {
namespace {

// The smallest power of two >= n (n >= 1).
int64_t power_of_two_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// The static buffers of one (Bp, Wp) bucket, and its graph once captured.
struct PagedGraphEntry {
  torch::Tensor ids;          // [Bp, 1] int64
  torch::Tensor write_slots;  // [Bp] int64
  torch::Tensor read_slots;   // [Bp * (Wp + 1)] int64
  torch::Tensor mask;         // [Bp, Wp + 1] int64
  std::vector<int64_t> lengths;  // [Bp] each row's cached + 1 (the CPU kernel's; a graph does not read it)
  torch::Tensor logits;       // [Bp, V] float32: the step's output
  bool capture_failed = false;
#ifdef DSCHAT_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

void run_paged_step(models::CausalLM& model, KvBlockPool& pool, PagedGraphEntry& e) {
  PagedKvCache cache(pool, e.write_slots, e.read_slots, e.mask, e.lengths);
  torch::Tensor hidden = model->hidden_states(e.ids, e.mask, &cache, nn::MaskLayout::kLeftPadded);  // [Bp, 1, E]
  e.logits = model->lm_logits(hidden.select(1, -1)).to(torch::kFloat32);                            // [Bp, V]
}

#ifdef DSCHAT_WITH_CUDA
// Captures the bucket's step (graph_capture.h) into `memory` (the first graph's pool, shared by
// all buckets: one step runs at a time and its logits are read before the next); false when it
// cannot be captured.
bool capture_paged_step(models::CausalLM& model, KvBlockPool& pool, PagedGraphEntry& e, c10::MempoolId_t memory) {
  e.graph = capture_decode_graph(e.ids.device(), [&] { run_paged_step(model, pool, e); }, "continuous engine", memory);
  return e.graph != nullptr;
}
#endif

}  // namespace

struct PagedDecodeGraphs::Impl {
  explicit Impl(KvBlockPool& p) : pool(p) {}
  KvBlockPool& pool;
  std::map<std::pair<int64_t, int64_t>, PagedGraphEntry> entries;  // by (Bp, Wp)
  int64_t replays = 0;
  int64_t captures = 0;
#ifdef DSCHAT_WITH_CUDA
  c10::MempoolId_t memory{0, 0};  // the graphs' shared memory pool, once the first is captured
#endif
};

PagedDecodeGraphs::PagedDecodeGraphs(KvBlockPool& pool) : impl_(std::make_unique<Impl>(pool)) {}

PagedDecodeGraphs::~PagedDecodeGraphs() = default;

bool PagedDecodeGraphs::compiled() {
#ifdef DSCHAT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void PagedDecodeGraphs::reset() {
  impl_->entries.clear();
#ifdef DSCHAT_WITH_CUDA
  impl_->memory = {0, 0};  // the pool goes with its last graph
#endif
}

torch::Tensor PagedDecodeGraphs::step(models::CausalLM& model, const std::vector<PagedKvCache::Row>& rows,
                                      const std::vector<int64_t>& ids, bool capture) {
  KvBlockPool& pool = impl_->pool;
  const int64_t batch = static_cast<int64_t>(rows.size()), block_size = pool.block_size();
  DSCHAT_INTERNAL_ASSERT(batch >= 1 && ids.size() == rows.size(), "paged decode graphs: ", batch, " rows, ",
                         ids.size(), " ids");
  // The scratch slot: the first of a block held for this step only (its slot index is data in the
  // static buffers, so any block serves), so the scheduler's count of free blocks is the same
  // between steps with and without graphs.
  const std::optional<int64_t> scratch_block = pool.allocate();
  if (!scratch_block) return torch::Tensor();  // the pool is full: this step decodes through the plain frame
  struct ReleaseAtExit {
    KvBlockPool& pool;
    int64_t block;
    ~ReleaseAtExit() { pool.release(block); }
  } release_at_exit{pool, *scratch_block};
  int64_t longest = 0;
  for (const PagedKvCache::Row& row : rows) longest = std::max(longest, row.cached);
  const int64_t padded_batch = power_of_two_at_least(batch);
  const int64_t longest_blocks = std::max<int64_t>(1, (longest + block_size - 1) / block_size);
  const int64_t width = power_of_two_at_least(longest_blocks) * block_size;
  PagedGraphEntry& e = impl_->entries[{padded_batch, width}];
  const torch::Device device = pool.storage().device();
  const bool replay = capture && device.is_cuda() && compiled();
  if (replay && e.capture_failed) return torch::Tensor();
  const int64_t frame = width + 1, scratch = *scratch_block * block_size;
  // The frame on the host: padding rows and the columns left of a row's tokens read the scratch slot.
  std::vector<int64_t> host_ids(padded_batch, 0), writes(padded_batch, scratch), reads(padded_batch * frame, scratch);
  std::vector<int64_t> mask(padded_batch * frame, 0);
  e.lengths.assign(padded_batch, 1);
  for (int64_t r = 0; r < padded_batch; ++r) mask[r * frame + width] = 1;  // every row's new token
  for (int64_t r = 0; r < batch; ++r) {
    const PagedKvCache::Row& row = rows[r];
    const std::vector<int64_t>& table = *row.blocks;
    auto slot = [&](int64_t token) { return table[token / block_size] * block_size + token % block_size; };
    for (int64_t t = 0; t < row.cached; ++t) {
      reads[r * frame + width - row.cached + t] = slot(t);
      mask[r * frame + width - row.cached + t] = 1;
    }
    reads[r * frame + width] = writes[r] = slot(row.cached);
    host_ids[r] = ids[r];
    e.lengths[r] = row.cached + 1;
  }
  auto host = [](std::vector<int64_t>& values) {
    return torch::from_blob(values.data(), {static_cast<int64_t>(values.size())}, torch::kInt64);
  };
  if (!e.ids.defined()) {
    auto options = torch::dtype(torch::kInt64).device(device);
    e.ids = torch::empty({padded_batch, 1}, options);
    e.write_slots = torch::empty({padded_batch}, options);
    e.read_slots = torch::empty({padded_batch * frame}, options);
    e.mask = torch::empty({padded_batch, frame}, options);
  }
  e.ids.copy_(host(host_ids).view({padded_batch, 1}));
  e.write_slots.copy_(host(writes));
  e.read_slots.copy_(host(reads));
  e.mask.copy_(host(mask).view({padded_batch, frame}));
#ifdef DSCHAT_WITH_CUDA
  if (replay) {
    if (!e.graph) {
      e.capture_failed = !capture_paged_step(model, pool, e, impl_->memory);
      if (!e.capture_failed) {
        ++impl_->captures;
        impl_->memory = e.graph->pool();
      }
    }
    if (!e.graph) return torch::Tensor();
    e.graph->replay();
    ++impl_->replays;
    return e.logits.narrow(0, 0, batch);
  }
#endif
  run_paged_step(model, pool, e);
  return e.logits.narrow(0, 0, batch);
}

int64_t PagedDecodeGraphs::replays() const { return impl_->replays; }
int64_t PagedDecodeGraphs::captures() const { return impl_->captures; }

}  // namespace inference
}  // namespace dschat
