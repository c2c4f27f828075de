#include "dschat/engine/zero_inference_engine.h"

#include "dschat/core/error.h"
#include "engine/zero_optimizer.h"

namespace dschat {
namespace engine {

ZeroInferenceEngine::ZeroInferenceEngine(std::shared_ptr<torch::nn::Module> module, ZeroInferenceOptions options)
    : module_(std::move(module)), communicator_(std::move(options.communicator)) {
  DSCHAT_CHECK(module_ != nullptr, InvalidArgument, "ZeroInferenceEngine: no module");
  DSCHAT_CHECK(options.zero.stage == 3, ConfigError, "ZeroInferenceEngine: zero_optimization.stage must be 3, got ",
               options.zero.stage, " (below stage 3 an inference model is simply replicated)");
  for (const auto& item : module_->named_parameters()) {
    DSCHAT_CHECK(!item.value().requires_grad(), InvalidArgument, "ZeroInferenceEngine: parameter '", item.key(),
                 "' requires grad; an inference engine holds a frozen model (freeze it first)");
  }
  const models::DeferredParameters* deferred = options.deferred.get();
  ZeroContext context;
  context.communicator = communicator_.get();
  context.rank = communicator_ ? communicator_->rank() : 0;
  context.world_size = communicator_ ? communicator_->world_size() : 1;
  context.stage = 3;
  for (const auto& param : module_->parameters()) {
    context.model_device = param.device();
    break;
  }
  if (deferred != nullptr) context.model_device = deferred->device;
  context.state_device = context.model_device;  // no optimizer state
  const bool offload = options.zero.offload_param.enabled();
  context.param_store_device = offload ? torch::Device(torch::kCPU) : context.model_device;
  context.pin_memory = offload && options.zero.offload_param.pin_memory;
  context.reduce_bucket_elements = options.zero.reduce_bucket_size;
  context.allgather_bucket_elements = options.zero.allgather_bucket_size;
  // Nothing is trainable, so the optimizer has no pieces: only the groups and the hooks act.
  zero_ = std::make_unique<ZeroOptimizer>(*module_, context, options.zero, OptimizerConfig{}, 0.0, deferred);
}

ZeroInferenceEngine::~ZeroInferenceEngine() = default;

void ZeroInferenceEngine::release_gathered_parameters() { zero_->release_gathered(); }

MemoryFootprint ZeroInferenceEngine::memory_footprint() const { return zero_->footprint(); }

}  // namespace engine
}  // namespace dschat
