#include "dschat/models/load_save.h"

#include <fstream>

#include "core/log.h"
#include "core/tensor_util.h"
#include "dschat/core/error.h"
#include "dschat/io/model_source.h"
#include "dschat/io/state_dict.h"
#include "dschat/models/hf_layout.h"
#include "dschat/nn/embedding.h"
#include "dschat/nn/linear.h"
#include "dschat/nn/rms_norm.h"

namespace dschat {
namespace models {
namespace fs = std::filesystem;

namespace {

struct Source {
  core::ModelConfig config;
  fs::path dir;  // empty for a preset
};

Source find_source(const std::string& name_or_path, bool random_init) {
  if (random_init) {
    if (auto preset = core::model_preset(name_or_path)) return {*preset, {}};
  }
  fs::path dir = io::resolve_model_dir(name_or_path);
  return {core::load_model_config(dir.string()), dir};
}

// transformers' initialisation (normal(0, 0.02) weights, zero biases, unit norms), so random
// models have realistic activation scales for benchmarks. Norms are found by their module type,
// whatever a family calls them (ln_1, input_layernorm, q_norm, ...).
void init_like_transformers(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    if (p.dim() >= 2) {
      p.normal_(0.0, 0.02);
    } else {
      p.zero_();
    }
  }
  for (const auto& item : module.modules()) {
    if (auto* layer_norm = dynamic_cast<nn::LayerNormImpl*>(item.get())) {
      if (layer_norm->weight.defined()) layer_norm->weight.fill_(1.0);
    } else if (auto* rms_norm = dynamic_cast<nn::RmsNormImpl*>(item.get())) {
      rms_norm->weight.fill_(1.0);
    }
  }
}

template <typename ModelHolder>
ModelHolder finish(ModelHolder& model, const Source& source, const std::string& name_or_path) {
  model->eval();
  core::log_debug("loaded ", source.config.model_type, " model from ",
                  source.dir.empty() ? name_or_path + " (preset)" : source.dir.string());
  return model;
}

torch::Tensor meta_like(const torch::Tensor& param, torch::ScalarType dtype) {
  return torch::empty(param.sizes(), torch::dtype(dtype).device(torch::kMeta));
}

// A deferred load's parameters the checkpoint lacks (a fresh v_head): their layer's own
// initialisation, run on the host, becomes their value; the parameters go back to the meta device.
void initialise_missing_on_host(torch::nn::Module& model, DeferredParameters& deferred) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_modules()) {
    auto* linear = dynamic_cast<nn::LinearImpl*>(item.value().get());
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    if (linear == nullptr || deferred.values.count(prefix + "weight")) continue;
    std::vector<std::pair<std::string, torch::Tensor*>> params = {{prefix + "weight", &linear->weight}};
    if (linear->bias.defined()) params.emplace_back(prefix + "bias", &linear->bias);
    for (auto& [name, param] : params) core::rebind_parameter_data(*param, torch::empty(param->sizes(), torch::kFloat32));
    linear->reset_parameters();
    for (auto& [name, param] : params) {
      deferred.values[name] = param->detach().to(deferred.dtype);
      core::rebind_parameter_data(*param, meta_like(*param, deferred.dtype));
    }
  }
  for (const auto& item : model.named_parameters()) {
    DSCHAT_CHECK(deferred.values.count(item.key()), Unsupported, "deferred load: parameter '", item.key(),
                 "' is not in the checkpoint and is not a Linear layer's, so it has no initial value");
  }
}

// The deferred load (LoadOptions::deferred): shapes on the meta device, values recorded.
template <typename ModelHolder, typename Load>
ModelHolder build_deferred(const Source& source, const std::string& name_or_path, const LoadOptions& options,
                           Load load) {
  DeferredParameters& deferred = *options.deferred;
  deferred = DeferredParameters{options.device, options.dtype, {}};
  if (options.random_init) {
    ModelHolder model(source.config);  // the same host initialisation as an eager random load
    init_like_transformers(*model);
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      deferred.values[item.key()] = item.value().detach().to(options.dtype);
      core::rebind_parameter_data(item.value(), meta_like(item.value(), options.dtype));
    }
    return finish(model, source, name_or_path);
  }
  ModelHolder model = [&] {
    nn::ParameterPlacementScope placement(torch::kMeta, options.dtype);
    return ModelHolder(source.config);
  }();
  for (auto& param : model->parameters()) {  // a module that allocated outside the scope
    if (!param.is_meta()) core::rebind_parameter_data(param, meta_like(param, options.dtype));
  }
  load(model, io::load_state_dict(source.dir), source.dir.string(), &deferred.values);
  initialise_missing_on_host(*model, deferred);
  return finish(model, source, name_or_path);
}

template <typename ModelHolder, typename Load>
ModelHolder build(const std::string& name_or_path, const LoadOptions& options, Load load) {
  Source source = find_source(name_or_path, options.random_init);
  if (options.dropout) {
    DSCHAT_CHECK(*options.dropout >= 0.0 && *options.dropout < 1.0, InvalidArgument, name_or_path,
                 ": dropout must be in [0, 1), got ", *options.dropout);
    source.config.dropout = source.config.attention_dropout = source.config.activation_dropout = *options.dropout;
  }
  if (options.deferred != nullptr) return build_deferred<ModelHolder>(source, name_or_path, options, load);
  if (options.random_init) {
    ModelHolder model(source.config);
    init_like_transformers(*model);  // on the CPU's generator: the same weights on every device
    model->to(options.device, options.dtype);
    return finish(model, source, name_or_path);
  }
  // Every parameter is allocated on its device in its dtype (dschat's layers follow the placement
  // scope); then the checkpoint's memory-mapped tensors are copied into them one by one, so no
  // host copy of the model is made on the way to the device.
  ModelHolder model = [&] {
    nn::ParameterPlacementScope placement(options.device, options.dtype);
    return ModelHolder(source.config);
  }();
  model->to(options.device, options.dtype);
  load(model, io::load_state_dict(source.dir), source.dir.string(), nullptr);
  return finish(model, source, name_or_path);
}


void write_config(const core::ModelConfig& config, const fs::path& dir, torch::ScalarType dtype) {
  core::ModelConfig out = config;
  out.torch_dtype = dtype == torch::kBFloat16 ? "bfloat16" : dtype == torch::kFloat16 ? "float16" : "float32";
  fs::create_directories(dir);
  fs::path tmp = dir / "config.json.tmp";
  {
    std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
    file << core::model_config_to_json(out);
    DSCHAT_CHECK(file.good(), IoError, tmp.string(), ": write failed");
  }
  fs::rename(tmp, dir / "config.json");
}

}  // namespace

// Weights first, config last: a directory with a config.json always has complete weights.
void save_model_tensors(const NamedTensors& state, const core::ModelConfig& config, const fs::path& dir,
                int64_t max_shard_bytes, io::WeightsFormat format) {
  io::TensorMap weights;
  for (const auto& [name, tensor] : to_hf_layout(config, state)) weights.emplace(name, tensor.detach().to(torch::kCPU));
  io::save_state_dict(dir, weights, format, max_shard_bytes);  // safetensors get "format": "pt"
  write_config(config, dir, weights.begin()->second.scalar_type());
}

CausalLM load_causal_lm(const std::string& name_or_path, const LoadOptions& options) {
  return build<CausalLM>(name_or_path, options,
                         [](CausalLM& m, const io::TensorMap& w, const std::string& where, NamedTensors* deferred) {
                           m->load_weights(w, where, deferred);
                         });
}

ValueHeadModel load_value_model(const std::string& name_or_path, const LoadOptions& options,
                                        bool allow_missing_head) {
  return build<ValueHeadModel>(
      name_or_path, options,
      [&](ValueHeadModel& m, const io::TensorMap& w, const std::string& where, NamedTensors* deferred) {
        m->load_weights(w, where, allow_missing_head, deferred);
      });
}

void save_causal_lm(CausalLM& model, const fs::path& dir, int64_t max_shard_bytes) {
  save_model_tensors(named_weights(*model), model->config(), dir, max_shard_bytes);
}

void save_value_model(ValueHeadModel& model, const fs::path& dir, int64_t max_shard_bytes) {
  save_model_tensors(named_weights(*model), model->config(), dir, max_shard_bytes);
}


}  // namespace models
}  // namespace dschat
