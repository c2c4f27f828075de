#include "dschat/rlhf/setup/step_setup.h"

#include <algorithm>
#include <functional>

#include <unistd.h>

#include "core/log.h"
#include "dschat/core/device.h"
#include "dschat/core/dtype.h"
#include "dschat/core/error.h"
#include "dschat/data/chat_format.h"
#include "dschat/engine/checkpoint_export.h"
#include "dschat/models/load_save.h"
#include "dschat/io/model_source.h"
#include "dschat/nn/lora.h"
#include "io/atomic_file.h"
#include "dschat/rlhf/setup/output_gate.h"

namespace dschat {
namespace rlhf {
namespace fs = std::filesystem;

int64_t context_rank(const StepContext& context) {
  return context.communicator ? context.communicator->rank() : 0;
}

int64_t context_world(const StepContext& context) {
  return context.communicator ? context.communicator->world_size() : 1;
}

void resolve_step_devices(PipelineConfig& config, int64_t local_rank) {
  std::vector<const CommonStepConfig*> run;
  for (int step : config.steps) run.push_back(&config.common_of(step));
  for (auto& [name, common] : config.blocks()) {
    common->resolved_device.reset();
    try {
      common->resolved_device = core::resolve_device(common->device, name + ": key 'device'", local_rank);
    } catch (const core::ConfigError&) {
      // A block that does not run may name a device this machine lacks (it is never used here).
      if (std::find(run.begin(), run.end(), common) != run.end()) throw;
    }
  }
}

torch::Device step_device(const CommonStepConfig& common, const StepContext& context, const std::string& where) {
  const torch::Device device = common.resolved_device
                                   ? *common.resolved_device
                                   : core::resolve_device(common.device, where + ": key 'device'", context.local_rank);
  core::log_device_choice(device, common.device);
  return device;
}

torch::ScalarType step_dtype(const std::string& dtype, const std::string& where) {
  const std::optional<torch::ScalarType> parsed = core::dtype_from_name(dtype);
  DSCHAT_CHECK(parsed.has_value(), ConfigError, where, ": key 'dtype' must be fp16, bf16 or fp32, got '", dtype, "'");
  return *parsed;
}

engine::DeepSpeedConfig train_ds_config(const CommonStepConfig& common, int zero_stage, int64_t micro_batch,
                                        int64_t gradient_accumulation_steps, int64_t world_size,
                                        const std::string& where, const engine::HybridEngineConfig* hybrid) {
  const std::string device = common.offload ? "cpu" : "none";
  nlohmann::json ds = {
      {"train_batch_size", micro_batch * gradient_accumulation_steps * world_size},
      {"train_micro_batch_size_per_gpu", micro_batch},
      {"gradient_accumulation_steps", gradient_accumulation_steps},
      {"steps_per_print", 0},  // the trainers print their own lines
      {"zero_optimization",
       {{"stage", zero_stage},
        {"overlap_comm", true},
        {"offload_param", {{"device", zero_stage == 3 ? device : "none"}}},
        {"offload_optimizer", {{"device", device}}},
        {"stage3_param_persistence_threshold", 10000},
        {"stage3_max_live_parameters", 30000000},
        {"stage3_prefetch_bucket_size", 30000000}}},
      {"gradient_clipping", 1.0},
      {"prescale_gradients", false},
      {"wall_clock_breakdown", false}};
  DSCHAT_CHECK(common.dtype == torch::kHalf || common.dtype == torch::kBFloat16 || common.dtype == torch::kFloat32,
               ConfigError, where, ": key 'dtype' must be fp16, bf16 or fp32, got ", c10::toString(common.dtype));
  if (common.dtype == torch::kHalf) ds["fp16"] = {{"enabled", true}, {"loss_scale_window", 100}};
  if (common.dtype == torch::kBFloat16) ds["bf16"] = {{"enabled", true}};
  if (hybrid != nullptr) {
    ds["hybrid_engine"] = {{"enabled", hybrid->enabled},
                           {"max_out_tokens", hybrid->max_out_tokens},
                           {"inference_tp_size", hybrid->inference_tp_size},
                           {"release_inference_cache", hybrid->release_inference_cache},
                           {"pin_parameters", hybrid->pin_parameters},
                           {"tp_gather_partition_size", hybrid->tp_gather_partition_size},
                           {"enable_cuda_graph", hybrid->enable_cuda_graph},
                           {"continuous_batching", hybrid->continuous_batching},
                           {"kv_cache_memory_mib", hybrid->kv_cache_memory_mib},
                           {"max_running_sequences", hybrid->max_running_sequences},
                           {"prefix_caching", hybrid->prefix_caching}};
  }
  return engine::DeepSpeedConfig::parse(ds, world_size, where + " (DeepSpeed config)");
}

engine::TrainingEngineOptions training_engine_options(const CommonStepConfig& common, const ModelTrainingConfig& model,
                                                      engine::DeepSpeedConfig config, int64_t total_optimizer_steps,
                                                      const StepContext& context) {
  engine::TrainingEngineOptions options;
  options.config = std::move(config);
  options.optimizer.type = "AdamW";
  options.optimizer.lr = model.learning_rate;
  options.optimizer.beta1 = 0.9;
  options.optimizer.beta2 = 0.95;
  options.optimizer.weight_decay = model.weight_decay;
  engine::LrScheduleOptions schedule;
  schedule.type = common.lr_scheduler_type;
  schedule.num_warmup_steps = common.num_warmup_steps;
  schedule.num_training_steps = std::max<int64_t>(total_optimizer_steps, 1);
  schedule.initial_lr = model.learning_rate;
  options.lr_schedule = schedule;
  options.lora_learning_rate = model.lora_learning_rate;
  options.communicator = context.communicator;
  return options;
}

std::unique_ptr<engine::TrainingEngine> make_training_engine(std::shared_ptr<torch::nn::Module> module,
                                                             const CommonStepConfig& common,
                                                             const ModelTrainingConfig& model, int64_t micro_batch,
                                                             int64_t total_optimizer_steps, const StepContext& context,
                                                             const std::string& where) {
  return make_training_engine(std::move(module), common, model, micro_batch, total_optimizer_steps, context, where,
                              nullptr);
}

std::unique_ptr<engine::TrainingEngine> make_training_engine(std::shared_ptr<torch::nn::Module> module,
                                                             const CommonStepConfig& common,
                                                             const ModelTrainingConfig& model, int64_t micro_batch,
                                                             int64_t total_optimizer_steps, const StepContext& context,
                                                             const std::string& where,
                                                             std::shared_ptr<const models::DeferredParameters> deferred) {
  engine::DeepSpeedConfig ds = train_ds_config(common, model.zero_stage, micro_batch, common.gradient_accumulation_steps,
                                               context_world(context), where);
  engine::TrainingEngineOptions options =
      training_engine_options(common, model, std::move(ds), total_optimizer_steps, context);
  options.deferred = std::move(deferred);
  return std::make_unique<engine::TrainingEngine>(std::move(module), std::move(options));
}

models::LoadOptions step_load_options(const CommonStepConfig& common, const ModelTrainingConfig& model,
                                      const StepContext& context, const torch::Device& device) {
  models::LoadOptions load;
  load.device = device;
  load.dtype = common.dtype;
  load.random_init = context.random_init;
  load.dropout = model.dropout;
  return load;
}

std::shared_ptr<models::DeferredParameters> defer_load_at_stage3(models::LoadOptions& load, int zero_stage) {
  if (zero_stage != 3) return nullptr;
  auto deferred = std::make_shared<models::DeferredParameters>();
  load.deferred = deferred.get();
  return deferred;
}

engine::ZeroConfig eval_zero3_config(bool offload) {
  engine::ZeroConfig zero;
  zero.stage = 3;
  zero.stage3_param_persistence_threshold = 10000;
  if (offload) zero.offload_param.device = "cpu";
  return zero;
}

int64_t optimizer_steps_for(int64_t epochs, int64_t batches_per_epoch, int64_t gas) {
  return epochs * ((batches_per_epoch + gas - 1) / gas);
}

monitor::MetricsLogOptions metrics_log_options(const CommonStepConfig& common, const StepContext& context) {
  monitor::MetricsLogOptions options;
  options.tensorboard = common.enable_tensorboard;
  options.tensorboard_dir = common.tensorboard_path;
  options.rank0 = context_rank(context) == 0;
  return options;
}

void apply_lora(torch::nn::Module& module, const ModelTrainingConfig& model, bool only_optimize_lora,
                const std::vector<std::string>& force) {
  if (model.lora_dim <= 0) return;
  nn::LoraOptions lora;
  lora.lora_dim = model.lora_dim;
  lora.module_name_filter = model.lora_module_name;
  nn::convert_linear_layers_to_lora(module, lora);
  if (only_optimize_lora) nn::only_optimize_lora_parameters(module, force);
}

tokenizer::Tokenizer load_step_tokenizer(const StepContext& context, const std::string& model_name_or_path) {
  if (!context.tokenizer_dir.empty()) return tokenizer::Tokenizer::load(context.tokenizer_dir);
  // A missing model is reported as such (where it looked, how to put it there), not as a tokenizer.
  const std::filesystem::path dir = io::resolve_model_dir(model_name_or_path);
  try {
    return tokenizer::Tokenizer::load(dir);
  } catch (const core::NotFound& e) {
    DSCHAT_THROW(NotFound, "no tokenizer for '", model_name_or_path, "' (", e.what(),
                 "); pass a tokenizer directory (\"tokenizer\" in the config, --tokenizer on the command line)");
  }
}

int64_t pad_token_of(const tokenizer::Tokenizer& tokenizer) {
  if (auto pad = tokenizer.pad_token_id()) return *pad;
  if (auto eos = tokenizer.eos_token_id()) return *eos;
  DSCHAT_THROW(ConfigError, tokenizer.directory().string(), ": the tokenizer has neither a pad nor an eos token");
}

std::string eos_text_of(const tokenizer::Tokenizer& tokenizer) {
  auto eos = tokenizer.eos_token_id();
  DSCHAT_CHECK(eos.has_value(), ConfigError, tokenizer.directory().string(), ": the tokenizer has no eos token");
  return tokenizer.id_to_token(*eos).value_or("");
}

int64_t padding_at_beginning(const tokenizer::Tokenizer& tokenizer) {
  const std::vector<int64_t> ids = tokenizer.encode("a", /*add_special_tokens=*/true);
  const auto bos = tokenizer.bos_token_id();
  return (!ids.empty() && bos && ids.front() == *bos && *bos == pad_token_of(tokenizer)) ? 1 : 0;
}

data::PromptDataOptions prompt_data_options(const DataConfig& data, int phase, uint32_t seed, int64_t max_seq_len,
                                            const std::string& end_of_conversation_token) {
  data::PromptDataOptions options;
  options.data_path.clear();
  for (const std::string& name : data.data_path) options.data_path.push_back(data::DatasetSpec{name, std::nullopt});
  for (const std::string& name : data.sft_only_data_path) {
    options.sft_only_data_path.push_back(data::DatasetSpec{name, std::nullopt});
  }
  options.data_split = data.data_split;
  options.phase = phase;
  options.seed = seed;
  options.max_seq_len = max_seq_len;
  options.end_of_conversation_token = end_of_conversation_token;
  options.cache_dir = data.data_output_path;
  options.local_jsonfile_dir = data.local_jsonfile_dir;
  return options;
}

void check_vocab(int64_t model_vocab, const tokenizer::Tokenizer& tokenizer, const std::string& model) {
  DSCHAT_CHECK(tokenizer.vocab_size() <= model_vocab, ConfigError, model, ": the model's vocabulary has ",
               model_vocab, " rows but the tokenizer in ", tokenizer.directory().string(), " has ",
               tokenizer.vocab_size(), " ids; use the model's own tokenizer");
}

void check_sequence_length(const core::ModelConfig& config, int64_t tokens, const std::string& keys,
                           const std::string& model) {
  const int64_t positions = config.max_position_embeddings;
  if (tokens <= positions) return;
  const bool learned = config.architecture == core::Architecture::Opt ||
                       config.architecture == core::Architecture::Gpt2 ||
                       config.architecture == core::Architecture::GptNeo;
  DSCHAT_CHECK(!learned, ConfigError, keys, " is ", tokens, " tokens, but ", model, " has a learned position table of ",
               positions, " positions (max_position_embeddings); lower it to at most ", positions);
  core::log_warn(keys, " is ", tokens, " tokens, beyond ", model, "'s max_position_embeddings ", positions,
                 ": its positions past that were not trained");
}

std::map<std::string, torch::Tensor> trained_parameters(engine::TrainingEngine& engine, const StepContext& context) {
  std::map<std::string, torch::Tensor> params = engine.consolidated_parameters();  // collective
  engine.release_gathered_parameters();
  if (context_rank(context) != 0) return {};
  engine::fuse_lora_adapters(params, engine::lora_scales(engine.module()), "trained model");
  for (auto& [name, tensor] : params) tensor = tensor.detach().to(torch::kCPU).contiguous();
  return params;
}

std::map<std::string, torch::Tensor> module_parameters(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : module.named_parameters()) params[item.key()] = item.value().detach().to(torch::kCPU);
  engine::fuse_lora_adapters(params, engine::lora_scales(module), "model");
  for (auto& [name, tensor] : params) tensor = tensor.contiguous();
  return params;
}

void write_model_dir(const std::map<std::string, torch::Tensor>& params, const core::ModelConfig& config,
                     const tokenizer::Tokenizer& tokenizer, const fs::path& dir, io::WeightsFormat format) {
  models::save_model_tensors(params, config, dir, int64_t{5} << 30, format);
  std::error_code ec;
  // The tokenizer's files, and the conversation format the model it came with was trained in
  // (step 3's actor keeps its SFT model's).
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "added_tokens.json", "tokenizer.model", data::kChatFormatFile}) {
    const fs::path source = tokenizer.directory() / file;
    if (!fs::exists(source)) continue;
    fs::copy_file(source, dir / file, fs::copy_options::overwrite_existing, ec);
    DSCHAT_CHECK(!ec, IoError, source.string(), ": cannot copy to ", dir.string(), " (", ec.message(), ")");
  }
}

fs::path staging_dir_for(const fs::path& dir) {
  fs::path clean = dir.lexically_normal();
  if (clean.filename().empty()) clean = clean.parent_path();
  return clean.parent_path() / (clean.filename().string() + ".saving." + std::to_string(::getpid()));
}

void write_staged(const fs::path& staging, const std::function<void()>& write) {
  io::remove_directory_tree(staging);
  try {
    write();
  } catch (...) {
    // A full disk or a failed copy: the half-written staging directory goes, the old output stays.
    try {
      io::remove_directory_tree(staging);
    } catch (const std::exception& e) {
      core::log_warn(staging.string(), ": could not remove the partly written output: ", e.what());
    }
    throw;
  }
}

void commit_step_output(const fs::path& staging, const fs::path& dir, const nlohmann::json& summary,
                        const StepContext& context) {
  nlohmann::json written = summary;
  if (!context.run_overview.is_null()) written["run_overview"] = context.run_overview;
  io::write_file_atomically(staging / "training_summary.json", written.dump(2) + "\n");
  io::remove_directory_tree(dir);
  std::error_code ec;
  fs::rename(staging, dir, ec);
  DSCHAT_CHECK(!ec, IoError, staging.string(), ": cannot rename to ", dir.string(), " (", ec.message(), ")");
  core::log_info("saved ", dir.string());
}

void save_trained_model(engine::TrainingEngine& engine, const core::ModelConfig& config,
                        const tokenizer::Tokenizer& tokenizer, const fs::path& dir, const nlohmann::json& summary,
                        const StepContext& context, const nlohmann::json& chat_format, io::WeightsFormat format) {
  std::map<std::string, torch::Tensor> params = trained_parameters(engine, context);
  check_step_output(params, engine.global_steps() - engine.skipped_steps(), dir, context);
  if (context_rank(context) == 0) {
    const fs::path staging = staging_dir_for(dir);
    write_staged(staging, [&] {
      write_model_dir(params, config, tokenizer, staging, format);
      if (!chat_format.is_null()) {
        io::write_file_atomically(staging / data::kChatFormatFile, chat_format.dump(2) + "\n");
      }
      commit_step_output(staging, dir, summary, context);
    });
  }
  if (context.communicator) context.communicator->barrier();
}

nlohmann::json sft_chat_format(const data::TokenizedDataset& train, const tokenizer::Tokenizer& tokenizer) {
  if (train.size() == 0) return nullptr;
  const data::TokenSpan sample = train.sequence(0);
  const std::vector<int64_t> ids(sample.begin(), sample.end());
  const std::optional<nlohmann::json> format = data::infer_chat_format(tokenizer.decode(ids, /*skip_special_tokens=*/true));
  return format ? *format : nlohmann::json(nullptr);
}

double all_reduce_mean(const StepContext& context, double value) {
  if (!context.communicator || context.communicator->world_size() == 1) return value;
  torch::Tensor t = torch::tensor({value}, torch::kFloat64);
  context.communicator->all_reduce(t, dist::ReduceOp::Avg);
  return t.item<double>();
}

}  // namespace rlhf
}  // namespace dschat
