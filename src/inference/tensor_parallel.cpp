#include "dschat/inference/tensor_parallel.h"

#include <string>
#include <unordered_set>

#include "dschat/core/error.h"
#include "dschat/nn/linear.h"

namespace dschat {
namespace inference {
namespace {

class CommunicatorGroup : public nn::TensorParallelGroup {
 public:
  explicit CommunicatorGroup(std::shared_ptr<dist::Communicator> communicator)
      : communicator_(std::move(communicator)) {}
  int64_t rank() const override { return communicator_->rank(); }
  int64_t size() const override { return communicator_->world_size(); }
  void all_reduce_sum(torch::Tensor& t) override { communicator_->all_reduce(t, dist::ReduceOp::Sum); }

 private:
  std::shared_ptr<dist::Communicator> communicator_;
};

// Which part of a full tensor a shard tensor is: `count` indices from `first` along `dim` of a
// full extent `full_extent`; dim -1 = the whole tensor (replicated).
struct Slice {
  int64_t dim = -1, first = 0, count = 0, full_extent = 0;
};

std::string last_component(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// What a decoder layer's Linear does, by its name in the layer ("self_attn.q_proj", "mlp.c_proj"):
// q, kv, attention_out, ffn_in, ffn_out; "" when unknown. Each family's names (models/gpt_block.h,
// OPT, LLaMA); GPT-2's c_proj is the attention output under attn and the MLP output under mlp.
std::string linear_role(const std::string& name) {
  const std::string leaf = last_component(name);
  if (leaf == "q_proj") return "q";
  if (leaf == "k_proj" || leaf == "v_proj") return "kv";
  if (leaf == "fc1" || leaf == "gate_proj" || leaf == "up_proj" || leaf == "fc_in" || leaf == "c_fc" ||
      leaf == "dense_h_to_4h") {
    return "ffn_in";
  }
  if (leaf == "fc2" || leaf == "down_proj" || leaf == "fc_out" || leaf == "dense_4h_to_h" ||
      (name.size() >= 10 && name.compare(name.size() - 10, 10, "mlp.c_proj") == 0)) {
    return "ffn_out";
  }
  if (leaf == "out_proj" || leaf == "o_proj" || leaf == "c_proj" || leaf == "dense") return "attention_out";
  return "";
}

void check_no_unfused_lora(const torch::nn::Module& module, const std::string& name) {
  const auto* linear = dynamic_cast<const nn::LinearImpl*>(&module);
  DSCHAT_CHECK(linear == nullptr || !linear->has_lora() || linear->lora_fused(), InvalidArgument,
               "tensor-parallel shard: '", name,
               "' has unfused LoRA adapters; fuse them first (nn::fuse_lora), the shard holds plain weights");
}

}  // namespace

std::shared_ptr<nn::TensorParallelGroup> make_tensor_parallel_group(std::shared_ptr<dist::Communicator> communicator) {
  DSCHAT_CHECK(communicator != nullptr, InvalidArgument, "make_tensor_parallel_group: communicator is null");
  return std::make_shared<CommunicatorGroup>(std::move(communicator));
}

TensorParallelLayout tensor_parallel_layout(const core::ModelConfig& config, int64_t tp, int64_t rank) {
  DSCHAT_CHECK(tp >= 1 && rank >= 0 && rank < tp, InvalidArgument, "tensor parallel: rank ", rank,
               " is out of range for tp = ", tp);
  const int64_t heads = config.num_attention_heads;
  const int64_t kv_heads = config.num_key_value_heads > 0 ? config.num_key_value_heads : heads;
  DSCHAT_CHECK(heads % tp == 0, InvalidArgument, "tensor parallel: num_attention_heads (", heads,
               ") is not divisible by tp (", tp, ")");
  DSCHAT_CHECK(kv_heads % tp == 0 || tp % kv_heads == 0, InvalidArgument, "tensor parallel: num_key_value_heads (",
               kv_heads, ") must be divisible by tp (", tp, "), or tp by it (key/value heads replicated)");
  DSCHAT_CHECK(config.intermediate_size % tp == 0, InvalidArgument, "tensor parallel: intermediate_size (",
               config.intermediate_size, ") is not divisible by tp (", tp, ")");
  TensorParallelLayout layout;
  layout.tp = tp;
  layout.rank = rank;
  layout.head_dim = config.head_dim > 0 ? config.head_dim : config.hidden_size / heads;
  layout.heads = heads / tp;
  layout.head_first = rank * layout.heads;
  if (kv_heads % tp == 0) {
    layout.kv_heads = kv_heads / tp;
    layout.kv_head_first = rank * layout.kv_heads;
  } else {
    // Fewer key/value heads than ranks: a rank's query heads all fall in one group (tp is a
    // multiple of kv_heads), whose key/value head it keeps a copy of.
    layout.kv_heads = 1;
    layout.kv_head_first = rank / (tp / kv_heads);
  }
  layout.ffn = config.intermediate_size / tp;
  layout.ffn_first = rank * layout.ffn;
  return layout;
}

core::ModelConfig tensor_parallel_shard_config(const core::ModelConfig& config, int64_t tp) {
  const TensorParallelLayout layout = tensor_parallel_layout(config, tp, 0);
  core::ModelConfig shard = config;
  shard.num_attention_heads = layout.heads;
  shard.num_key_value_heads = layout.kv_heads;
  shard.head_dim = layout.head_dim;  // the full model's: hidden / (heads / tp) would be wrong
  shard.intermediate_size = layout.ffn;
  // Generation only: no dropout anywhere, so every layer takes the inference path.
  shard.dropout = shard.attention_dropout = shard.activation_dropout = 0.0;
  return shard;
}

TensorParallelShard::TensorParallelShard(const core::ModelConfig& full_config,
                                         std::shared_ptr<nn::TensorParallelGroup> group, ShardStorage storage)
    : full_config_(full_config), storage_(storage) {
  DSCHAT_CHECK(group != nullptr, InvalidArgument, "tensor-parallel shard: group is null");
  layout_ = tensor_parallel_layout(full_config, group->size(), group->rank());
  model_ = models::CausalLM(tensor_parallel_shard_config(full_config, group->size()));
  model_->eval();
  for (auto& parameter : model_->parameters()) parameter.set_requires_grad(false);
  model_->backbone().set_tensor_parallel_group(std::move(group));
}

void TensorParallelShard::bind_all(models::CausalLM& full) {
  bind_replicated(full);
  bind_layers(full, 0, full_config_.num_hidden_layers);
}

void TensorParallelShard::bind_tensor(torch::Tensor& shard, const torch::Tensor& full_slice) {
  if (storage_ == ShardStorage::View) {
    shard.set_data(full_slice);  // the shard's parameter now aliases the full tensor's storage
  } else if (shard.sizes() == full_slice.sizes() && shard.dtype() == full_slice.dtype() &&
             shard.device() == full_slice.device() && shard.is_contiguous()) {
    shard.copy_(full_slice);  // rebinding reuses the shard's own buffer
  } else {
    shard.set_data(full_slice.clone(at::MemoryFormat::Contiguous));  // first bind, or a new dtype/device
  }
}

void TensorParallelShard::bind_replicated(models::CausalLM& full) {
  torch::NoGradGuard no_grad;
  DSCHAT_CHECK(full->config().num_hidden_layers == full_config_.num_hidden_layers &&
                   full->config().hidden_size == full_config_.hidden_size &&
                   full->config().vocab_size == full_config_.vocab_size,
               InvalidArgument, "tensor-parallel shard: the full model (layers ", full->config().num_hidden_layers,
               ", hidden ", full->config().hidden_size, ", vocab ", full->config().vocab_size,
               ") is not the model this shard was built for (layers ", full_config_.num_hidden_layers, ", hidden ",
               full_config_.hidden_size, ", vocab ", full_config_.vocab_size, ")");
  std::unordered_set<const torch::nn::Module*> in_layers;  // the shard's decoder layers and their submodules
  for (const auto& layer : model_->backbone().decoder_layers()) {
    for (const auto& module : layer->modules()) in_layers.insert(module.get());
  }
  const auto full_modules = full->named_modules();
  for (const auto& item : model_->named_modules()) {
    if (in_layers.count(item.value().get()) != 0) continue;
    const auto* full_module = full_modules.find(item.key());
    DSCHAT_CHECK(full_module != nullptr, InvalidArgument, "tensor-parallel shard: the full model has no module '",
                 item.key(), "'");
    check_no_unfused_lora(**full_module, item.key());
    const auto full_parameters = (*full_module)->named_parameters(/*recurse=*/false);
    for (auto& parameter : item.value()->named_parameters(/*recurse=*/false)) {
      const std::string name = item.key() + "." + parameter.key();
      const auto* source = full_parameters.find(parameter.key());
      DSCHAT_CHECK(source != nullptr && source->numel() > 0, InvalidArgument, "tensor-parallel shard: '", name,
                   "' is ", source == nullptr ? "missing from" : "not resident (0 elements) in", " the full model");
      DSCHAT_CHECK(source->sizes() == parameter.value().sizes(), InvalidArgument, "tensor-parallel shard: '", name,
                   "' is ", source->sizes(), " in the full model, expected ", parameter.value().sizes());
      bind_tensor(parameter.value(), *source);
    }
  }
}

void TensorParallelShard::bind_layers(models::CausalLM& full, int64_t first, int64_t count) {
  const int64_t layers = full_config_.num_hidden_layers;
  DSCHAT_CHECK(first >= 0 && count >= 0 && first + count <= layers, InvalidArgument,
               "tensor-parallel shard: layers [", first, ", ", first + count, ") are outside the model's ", layers,
               " layers");
  DSCHAT_CHECK(static_cast<int64_t>(full->backbone().decoder_layers().size()) == layers, InvalidArgument,
               "tensor-parallel shard: the full model has ", full->backbone().decoder_layers().size(),
               " layers, this shard was built for ", layers);
  torch::NoGradGuard no_grad;
  for (int64_t layer = first; layer < first + count; ++layer) bind_layer(full, layer);
}

void TensorParallelShard::bind_layer(models::CausalLM& full, int64_t layer) {
  const TensorParallelLayout& l = layout_;
  const int64_t d = l.head_dim;
  const int64_t full_heads = full_config_.num_attention_heads;
  const int64_t full_kv_heads = full_config_.num_key_value_heads > 0 ? full_config_.num_key_value_heads : full_heads;
  const Slice heads_slice{0, l.head_first * d, l.heads * d, full_heads * d};          // rows of q
  const Slice kv_slice{0, l.kv_head_first * d, l.kv_heads * d, full_kv_heads * d};     // rows of k, v
  const Slice ffn_slice{0, l.ffn_first, l.ffn, full_config_.intermediate_size};      // rows of fc1 / gate / up

  const auto shard_layer = model_->backbone().decoder_layers()[layer];
  const auto full_modules = full->backbone().decoder_layers()[layer]->named_modules();
  const std::string where = "decoder layer " + std::to_string(layer);
  for (const auto& item : shard_layer->named_modules()) {
    const auto* full_module = full_modules.find(item.key());
    DSCHAT_CHECK(full_module != nullptr, InvalidArgument, "tensor-parallel shard: ", where,
                 " of the full model has no '", item.key(), "'");
    check_no_unfused_lora(**full_module, where + " " + item.key());
    Slice weight_slice, bias_slice;  // replicated unless a Linear with a known role
    if (dynamic_cast<nn::LinearImpl*>(item.value().get()) != nullptr) {
      const std::string role = linear_role(item.key());
      if (role == "q") {
        weight_slice = bias_slice = heads_slice;
      } else if (role == "kv") {
        weight_slice = bias_slice = kv_slice;
      } else if (role == "ffn_in") {
        weight_slice = bias_slice = ffn_slice;
      } else if (role == "attention_out") {
        weight_slice = {1, heads_slice.first, heads_slice.count, heads_slice.full_extent};  // bias stays whole
      } else if (role == "ffn_out") {
        weight_slice = {1, ffn_slice.first, ffn_slice.count, ffn_slice.full_extent};
      } else {
        DSCHAT_THROW(InvalidArgument, "tensor-parallel shard: ", where, " has a Linear '", item.key(),
                     "' with no tensor-parallel layout");
      }
    }
    const auto full_parameters = (*full_module)->named_parameters(/*recurse=*/false);
    for (auto& parameter : item.value()->named_parameters(/*recurse=*/false)) {
      const std::string name = where + " " + item.key() + "." + parameter.key();
      const auto* source = full_parameters.find(parameter.key());
      DSCHAT_CHECK(source != nullptr && source->numel() > 0, InvalidArgument, "tensor-parallel shard: ", name, " is ",
                   source == nullptr ? "missing from" : "not resident (0 elements; gather the layer first) in",
                   " the full model");
      const Slice& slice = parameter.key() == "bias" ? bias_slice : weight_slice;
      torch::Tensor full_slice = *source;  // [full shape] -> narrowed below to the shard's shape
      if (slice.dim >= 0) {
        DSCHAT_CHECK(slice.dim < source->dim() && source->size(slice.dim) == slice.full_extent, InvalidArgument,
                     "tensor-parallel shard: ", name, " is ", source->sizes(), " in the full model, expected ",
                     slice.full_extent, " along dim ", slice.dim);
        full_slice = source->narrow(slice.dim, slice.first, slice.count);
      }
      DSCHAT_CHECK(full_slice.sizes() == parameter.value().sizes(), InvalidArgument, "tensor-parallel shard: ", name,
                   " is ", source->sizes(), " in the full model, which does not give this rank's ",
                   parameter.value().sizes());
      bind_tensor(parameter.value(), full_slice);
    }
  }
}

models::CausalLM make_tensor_parallel_shard(models::CausalLM& full, std::shared_ptr<nn::TensorParallelGroup> group,
                                            ShardStorage storage) {
  TensorParallelShard shard(full->config(), std::move(group), storage);
  shard.bind_all(full);
  return shard.model();
}

}  // namespace inference
}  // namespace dschat
