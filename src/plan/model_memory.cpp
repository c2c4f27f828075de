#include "dschat/plan/model_memory.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include "dschat/core/error.h"
#include "dschat/models/causal_lm.h"
#include "dschat/models/value_head.h"
#include "dschat/nn/linear.h"
#include "dschat/rlhf/setup/step_setup.h"

namespace dschat {
namespace plan {
namespace {

int64_t element_bytes_of(torch::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

// Specs of a module built on the meta device: every parameter once (tied weights once), in
// registration order, with its decoder layer.
template <typename Holder>
std::vector<engine::ParameterSpec> specs_of(Holder& model, models::Backbone& backbone) {
  std::unordered_map<const c10::TensorImpl*, int64_t> layer_of;
  const auto layers = backbone.decoder_layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const auto& param : layers[i]->parameters()) layer_of[param.unsafeGetTensorImpl()] = static_cast<int64_t>(i);
  }
  std::vector<engine::ParameterSpec> specs;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    auto it = layer_of.find(p.unsafeGetTensorImpl());
    specs.push_back({item.key(), p.numel(), p.scalar_type(), p.requires_grad(), it == layer_of.end() ? -1 : it->second});
  }
  return specs;
}

// Saved activations of one decoder layer per token, in elements of the model dtype: the norm
// inputs and outputs, q/k/v and the attention output (and its contiguous copy for out_proj), the
// MLP's hidden activations (docs/plan.md; calibrated against measured peaks on the CPU).
int64_t layer_activation_elements(const core::ModelConfig& c) {
  const int64_t h = c.hidden_size, f = c.intermediate_size;
  const int64_t kv = c.num_key_value_heads * c.head_dim;
  if (c.architecture == core::Architecture::Llama) return 8 * h + 3 * kv + 4 * f;  // rotary q/k, gate, up, silu, product
  return 7 * h + 2 * kv + f;  // OPT: LN1 in/out, q k v, attention out + copy, LN2 in/out, fc2 input
}

// Bytes of dropout masks per token and layer (residual and activation dropouts) in train mode.
int64_t dropout_mask_bytes(const core::ModelConfig& c) {
  int64_t bytes = 0;
  if (c.dropout > 0) bytes += 2 * c.hidden_size;
  if (c.activation_dropout > 0) bytes += c.intermediate_size;
  return bytes;
}

int64_t vocab_of(const ModelSetup& s) { return s.value_head ? 0 : s.config.vocab_size; }

// Bytes of the parameters outside the decoder layers (embeddings, final norm, head).
int64_t outer_bytes(const std::vector<engine::ParameterSpec>& specs) {
  int64_t bytes = 0;
  for (const auto& p : specs) {
    if (p.layer < 0) bytes += p.numel * element_bytes_of(p.dtype);
  }
  return bytes;
}

// The trainable bytes of the largest gradient group: a decoder layer's, or the parameters outside
// the layers (a LoRA base's frozen weights get no gradients, so they do not count).
int64_t largest_trainable_group_bytes(const std::vector<engine::ParameterSpec>& specs) {
  std::unordered_map<int64_t, int64_t> per_group;  // layer index; -1: outside the layers
  int64_t largest = 0;
  for (const auto& p : specs) {
    if (p.trainable) largest = std::max(largest, per_group[p.layer] += p.numel * element_bytes_of(p.dtype));
  }
  return largest;
}

int64_t trainable_bytes(const std::vector<engine::ParameterSpec>& specs, int64_t element_bytes) {
  return trainable_parameters(specs) * element_bytes;
}

}  // namespace

std::vector<engine::ParameterSpec> parameter_specs(const ModelSetup& setup) {
  rlhf::ModelTrainingConfig lora;
  lora.lora_dim = setup.lora_dim;
  lora.lora_module_name = setup.lora_module_name;
  const bool freeze_others = setup.trained && setup.only_optimize_lora;
  auto finish = [&](std::vector<engine::ParameterSpec> specs) {
    if (!setup.trained) {
      for (auto& p : specs) p.trainable = false;
    }
    return specs;
  };
  nn::ParameterPlacementScope placement(torch::kMeta, setup.dtype, /*shapes_only=*/true);
  if (setup.value_head) {
    models::ValueHeadModel model(setup.config);
    if (setup.trained) rlhf::apply_lora(*model, lora, freeze_others, {"v_head.weight"});
    return finish(specs_of(model, model->backbone()));
  }
  models::CausalLM model(setup.config);
  // A frozen model with a LoRA size is the actor's EMA copy, which has the actor's LoRA modules.
  if (setup.trained || setup.lora_dim > 0) rlhf::apply_lora(*model, lora, freeze_others);
  return finish(specs_of(model, model->backbone()));
}

engine::MemoryFootprint zero_footprint(const ModelSetup& setup, const std::vector<engine::ParameterSpec>& specs,
                                       int64_t world, int64_t rank) {
  const engine::ZeroGrouping grouping = engine::group_parameters(specs, setup.zero_stage, setup.persistence_threshold);
  return engine::footprint_at_step(specs, grouping, {setup.zero_stage, world, rank, setup.quantize_frozen});
}

int64_t model_bytes(const std::vector<engine::ParameterSpec>& specs) {
  int64_t bytes = 0;
  for (const auto& p : specs) bytes += p.numel * element_bytes_of(p.dtype);
  return bytes;
}

int64_t lora_wrapped_bytes(const std::vector<engine::ParameterSpec>& specs) {
  std::set<std::string> wrapped;  // "<module>." of every lora_right_weight
  for (const auto& p : specs) {
    const auto at = p.name.find("lora_right_weight");
    if (at != std::string::npos) wrapped.insert(p.name.substr(0, at));
  }
  int64_t bytes = 0;
  for (const auto& p : specs) {
    if (p.name.size() > 6 && p.name.compare(p.name.size() - 6, 6, "weight") == 0 &&
        wrapped.count(p.name.substr(0, p.name.size() - 6))) {
      bytes += p.numel * element_bytes_of(p.dtype);
    }
  }
  return bytes;
}

int64_t layer_bytes(const std::vector<engine::ParameterSpec>& specs) {
  std::unordered_map<int64_t, int64_t> per_layer;
  int64_t largest = 0;
  for (const auto& p : specs) {
    if (p.layer >= 0) largest = std::max(largest, per_layer[p.layer] += p.numel * element_bytes_of(p.dtype));
  }
  return largest;
}

int64_t trainable_parameters(const std::vector<engine::ParameterSpec>& specs) {
  int64_t n = 0;
  for (const auto& p : specs) n += p.trainable ? p.numel : 0;
  return n;
}

int64_t total_parameters(const std::vector<engine::ParameterSpec>& specs) {
  int64_t n = 0;
  for (const auto& p : specs) n += p.numel;
  return n;
}

std::vector<MemoryItem> resident_state(const ModelSetup& setup, const std::vector<engine::ParameterSpec>& specs,
                                       int64_t world, int64_t rank) {
  const int stage = setup.zero_stage;
  const engine::ZeroGrouping grouping = engine::group_parameters(specs, stage, setup.persistence_threshold);
  const engine::MemoryFootprint bytes =
      engine::footprint_at_step(specs, grouping, {stage, world, rank, setup.quantize_frozen});
  std::vector<MemoryItem> items;
  const std::string& m = setup.role;
  // Stage-3 offload keeps the partitions on the host, the persistent (replicated) groups on the device.
  int64_t persistent_bytes = 0;
  for (size_t i : grouping.ungrouped) persistent_bytes += specs[i].numel * element_bytes_of(specs[i].dtype);
  for (const auto& g : grouping.groups) {
    if (!g.partitioned) persistent_bytes += engine::group_layout(specs, g, {stage, world, rank}).padded_numel * element_bytes_of(g.dtype);
  }
  const bool params_on_host = setup.offload && stage == 3;
  const int64_t host_params = params_on_host ? bytes.parameter_bytes - persistent_bytes : 0;
  items.push_back({m, "parameters", "", bytes.parameter_bytes - host_params, host_params});
  if (!setup.trained) return items;
  if (setup.offload) {
    // Stage 1 keeps its flat fp32 buffer on the device; every partition lives on the host.
    const int64_t device_grads = stage == 1 && world > 1 ? trainable_bytes(specs, 4) : 0;
    items.push_back({m, "gradients (fp32)", "", device_grads, bytes.gradient_bytes - device_grads});
    items.push_back({m, "optimizer (Adam moments, fp32 masters)", "", 0, bytes.optimizer_bytes});
    if (!setup.cpu_ranks) {
      // Pinned staging, kept by the caching host allocator once used: the fp32 gradient partition
      // on its way down, the updated owned values (model dtype) on their way up.
      const int64_t host_gradients = bytes.gradient_bytes - device_grads;
      items.push_back({m, "pinned staging (gradients down, updated values up)", "", 0,
                       host_gradients + host_gradients / 4 * element_bytes_of(setup.dtype)});
    }
  } else {
    items.push_back({m, "gradients (fp32)", "", bytes.gradient_bytes, 0});
    items.push_back({m, "optimizer (Adam moments, fp32 masters)", "", bytes.optimizer_bytes, 0});
  }
  return items;
}

std::vector<MemoryItem> training_pass(const ModelSetup& setup, const std::vector<engine::ParameterSpec>& specs,
                                      const PassShape& shape, int64_t world, int64_t gradient_accumulation_steps,
                                      const std::string& phase) {
  const core::ModelConfig& c = setup.config;
  const int64_t s = element_bytes_of(setup.dtype);
  const int64_t tokens = shape.batch * shape.tokens;
  const int64_t layers = c.num_hidden_layers;
  const int64_t per_layer = tokens * (layer_activation_elements(c) * s + dropout_mask_bytes(c));
  const int64_t layer_input = tokens * c.hidden_size * s;
  // Stage 3 checkpoints every layer (its gathers live only around the layer), as do the flag's runs.
  const bool checkpointed = setup.gradient_checkpointing || setup.zero_stage == 3;
  const int64_t outside_layers = tokens * 3 * c.hidden_size * s                // embeddings, final norm in/out
                                 + shape.batch * shape.tokens * shape.tokens * s;  // the attention bias [B, 1, T, T]
  const int64_t activations =
      checkpointed ? layers * layer_input + per_layer + outside_layers : layers * per_layer + outside_layers;
  std::vector<MemoryItem> items;
  const std::string& m = setup.role;
  items.push_back({m, checkpointed ? "activations (checkpointed layers + one recomputed)" : "activations", phase,
                   activations, 0});
  const int64_t vocab = vocab_of(setup);
  if (vocab > 0) {
    // logits [B, T, V] (model dtype), their fp32 copy unless fp32, the log-softmax, its gradient
    // and the logits' gradient (fp32).
    const int64_t per_logit = s + (s == 4 ? 0 : 4) + 12;
    items.push_back({m, "logits and loss [B, T, V]", phase, tokens * vocab * per_logit, 0});
  }
  // Gradients on their way into the flat buffers: autograd's model-dtype .grad of every trainable
  // parameter where a backward does not reduce as it goes (stages 0-1 between boundaries), else one
  // layer's worth. Stage 2 on several ranks has no flat buffer: two fp32 buckets of staging (one
  // filling, one reducing; one when a single bucket holds everything) and the all-to-all's receive buffer of the bucket in flight, world
  // times its part in this rank's partition (DS-Chat's 5e8-element buckets).
  const int64_t trainable = trainable_parameters(specs);
  int64_t in_flight = 0;
  if (setup.zero_stage < 2 && gradient_accumulation_steps > 1) {
    in_flight = trainable * s;
  } else {
    in_flight = std::min(trainable * s, largest_trainable_group_bytes(specs));
  }
  if (setup.zero_stage == 2 && world > 1) {
    constexpr int64_t kReduceBucketElements = 500000000;
    const int64_t bucket = std::min(trainable, kReduceBucketElements);
    const int64_t owned_part = std::min(bucket, (trainable + world - 1) / world);
    const int64_t staged_buckets = trainable > bucket ? 2 : 1;  // a single bucket has no successor filling
    in_flight += staged_buckets * bucket * 4 + world * owned_part * 4;
  }
  if (setup.zero_stage == 3 && trainable > 0) {
    // Each group is reduced as its backward ends: its fp32 flat gradient buffer next to its
    // model-dtype gradients (or, on gloo, the receive buffer of its reduce-scatter).
    in_flight += largest_trainable_group_bytes(specs) * 4 / s;
  }
  items.push_back({m, "gradients in flight", phase, in_flight, 0});
  if (setup.zero_stage == 3) {
    items.push_back({m, "gathered layers (current + prefetched) and embeddings", phase,
                     2 * layer_bytes(specs) + outer_bytes(specs), 0});
  }
  return items;
}

std::vector<MemoryItem> inference_pass(const ModelSetup& setup, const std::vector<engine::ParameterSpec>& specs,
                                       const PassShape& shape, const std::string& phase) {
  const core::ModelConfig& c = setup.config;
  const int64_t s = element_bytes_of(setup.dtype);
  const int64_t tokens = shape.batch * shape.tokens;
  std::vector<MemoryItem> items;
  const std::string& m = setup.role;
  // One layer at a time: its input, q/k/v, attention output and MLP hidden state, plus the bias.
  const int64_t temporaries = tokens * (6 * c.hidden_size + c.intermediate_size) * s +
                              shape.batch * shape.tokens * shape.tokens * s;
  items.push_back({m, "forward temporaries (no grad)", phase, temporaries, 0});
  const int64_t vocab = vocab_of(setup);
  if (vocab > 0) items.push_back({m, "logits and log-probs [B, T, V]", phase, tokens * vocab * (s + 4 + (s == 4 ? 0 : 4)), 0});
  if (setup.zero_stage == 3) {
    items.push_back({m, "gathered layers and embeddings", phase, 2 * layer_bytes(specs) + outer_bytes(specs), 0});
  }
  return items;
}

int64_t kv_workspace_bytes(const core::ModelConfig& config, torch::ScalarType dtype, int64_t rows,
                           int64_t max_out_tokens) {
  return config.num_hidden_layers * 2 * rows * config.num_key_value_heads * max_out_tokens * config.head_dim *
         element_bytes_of(dtype);
}

}  // namespace plan
}  // namespace dschat
