#include "inference/decode_graph.h"

#include <map>

#include "dschat/core/error.h"
#include "dschat/nn/kv_cache.h"
#include "inference/graph_capture.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#endif

namespace dschat {
namespace inference {
namespace {

// The full-capacity view of the workspace's first B rows (layout in decode_graph.h).
class FullCapacityKvCache : public nn::KvCache {
 public:
  FullCapacityKvCache(const KvWorkspace& workspace, int64_t batch, torch::Tensor slot)
      : workspace_(workspace), batch_(batch), slot_(std::move(slot)) {}

  int64_t cached_length() const override { return workspace_.max_tokens() - 1; }

  std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v) override {
    const int64_t scratch = workspace_.max_tokens() - 1;
    torch::Tensor keys = workspace_.keys(layer, batch_);      // [B, H_kv, M, D]
    torch::Tensor values = workspace_.values(layer, batch_);  // [B, H_kv, M, D]
    keys.index_copy_(2, slot_, k);  // kept for the later steps
    values.index_copy_(2, slot_, v);
    keys.narrow(2, scratch, 1).copy_(k);  // what this step's query reads
    values.narrow(2, scratch, 1).copy_(v);
    return {keys, values};
  }

  void commit(int64_t /*new_tokens*/) override {}  // the slot buffer, not a count, says where

 private:
  const KvWorkspace& workspace_;
  int64_t batch_;
  torch::Tensor slot_;  // [1] int64, on the workspace's device
};

// The static buffers of one batch size (and its graph, once captured).
struct Entry {
  torch::Tensor ids;     // [B, 1] int64
  torch::Tensor slot;    // [1] int64
  torch::Tensor mask;    // [B, M] int64
  torch::Tensor logits;  // [B, V] float32: the step's output
  bool capture_failed = false;
#ifdef DSCHAT_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

void run_step(models::CausalLM& model, const KvWorkspace& workspace, Entry& e) {
  FullCapacityKvCache cache(workspace, e.ids.size(0), e.slot);
  // The full-capacity mask always has zero columns (slot p is masked in its own step): the
  // explicit mask, stated so that no step reads it on the host (which a capture forbids).
  torch::Tensor logits = model->forward(e.ids, e.mask, &cache, nn::MaskLayout::kLeftPadded);  // [B, 1, V]
  e.logits = logits.select(1, 0).to(torch::kFloat32);                                             // [B, V]
}

#ifdef DSCHAT_WITH_CUDA
// Captures this batch size's step (graph_capture.h); false when it cannot be captured.
bool capture_step(models::CausalLM& model, const KvWorkspace& workspace, Entry& e) {
  e.graph = capture_decode_graph(e.ids.device(), [&] { run_step(model, workspace, e); }, "inference engine");
  return e.graph != nullptr;
}
#endif

}  // namespace

struct DecodeGraphs::Impl {
  std::map<int64_t, Entry> entries;  // by batch size
  const void* workspace_data = nullptr;
  int64_t max_tokens = 0;
  int64_t replays = 0;
  int64_t captures = 0;
};

DecodeGraphs::DecodeGraphs() : impl_(std::make_unique<Impl>()) {}
DecodeGraphs::~DecodeGraphs() = default;

bool DecodeGraphs::compiled() {
#ifdef DSCHAT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void DecodeGraphs::reset() {
  impl_->entries.clear();
  impl_->workspace_data = nullptr;
  impl_->max_tokens = 0;
}

torch::Tensor DecodeGraphs::step(models::CausalLM& model, const KvWorkspace& workspace,
                                 const torch::Tensor& step_input, const torch::Tensor& mask, bool capture) {
  const int64_t batch = step_input.size(0), max_tokens = workspace.max_tokens();
  const int64_t slot = mask.size(1) - 1;  // the current token's sequence index p
  DSCHAT_INTERNAL_ASSERT(slot <= max_tokens - 2, "decode slot ", slot, " with max_out_tokens ", max_tokens);
  if (impl_->workspace_data != workspace.data() || impl_->max_tokens != max_tokens) {
    reset();  // graphs point into the old allocation
    impl_->workspace_data = workspace.data();
    impl_->max_tokens = max_tokens;
  }
  Entry& e = impl_->entries[batch];
  const bool replay = capture && step_input.is_cuda() && compiled();
  if (replay && e.capture_failed) return torch::Tensor();
  if (!e.ids.defined()) {
    auto options = torch::dtype(torch::kInt64).device(step_input.device());
    e.ids = torch::zeros({batch, 1}, options);
    e.slot = torch::zeros({1}, options);
    e.mask = torch::zeros({batch, max_tokens}, options);
  }
  e.ids.copy_(step_input);
  e.slot.fill_(slot);
  e.mask.zero_();
  e.mask.narrow(1, 0, slot).copy_(mask.narrow(1, 0, slot));
  e.mask.select(1, max_tokens - 1).copy_(mask.select(1, slot));
#ifdef DSCHAT_WITH_CUDA
  if (replay) {
    if (!e.graph) {
      e.capture_failed = !capture_step(model, workspace, e);
      impl_->captures += e.capture_failed ? 0 : 1;
    }
    if (!e.graph) return torch::Tensor();
    e.graph->replay();
    ++impl_->replays;
    return e.logits;
  }
#endif
  run_step(model, workspace, e);
  return e.logits;
}

int64_t DecodeGraphs::replays() const { return impl_->replays; }
int64_t DecodeGraphs::captures() const { return impl_->captures; }

}  // namespace inference
}  // namespace dschat
