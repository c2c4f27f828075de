#include "dschat/engine/ds_config.h"

#include <fstream>
#include <sstream>

#include "core/json_object.h"
#include "dschat/core/error.h"

namespace dschat {
namespace engine {
namespace {

using core::JsonObject;

// Keys DeepSpeed defines that are parsed (so typos are still caught) but change nothing here.
void collect_unacted(JsonObject& object, const std::vector<std::string>& keys, const std::string& prefix,
                     std::vector<std::string>& out) {
  for (const auto& key : keys) {
    if (object.has(key)) out.push_back(prefix + key);
  }
  object.accept(keys);
}

OffloadConfig parse_offload(JsonObject object, bool optimizer, std::vector<std::string>& unacted) {
  OffloadConfig offload;
  offload.device = object.get<std::string>("device", offload.device);
  DSCHAT_CHECK(offload.device == "none" || offload.device == "cpu" || offload.device == "nvme", ConfigError,
               object.at("device"), ": '", offload.device, "' is not one of none, cpu, nvme");
  DSCHAT_CHECK(offload.device != "nvme", Unsupported, object.at("device"),
               ": NVMe offload is not supported by dschat; use \"cpu\"");
  offload.pin_memory = object.get<bool>("pin_memory", offload.pin_memory);
  if (optimizer) offload.ratio = object.get<double>("ratio", offload.ratio);
  DSCHAT_CHECK(offload.ratio > 0 && offload.ratio <= 1, ConfigError, object.at("ratio"), ": ", offload.ratio,
               " must be in (0, 1]");
  collect_unacted(object, {"nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pipeline_read",
                           "pipeline_write", "fast_init"},
                  object.where() + ".", unacted);
  object.finish();
  return offload;
}

ZeroConfig parse_zero(JsonObject object, std::vector<std::string>& unacted) {
  ZeroConfig zero;
  zero.stage = object.get<int>("stage", 0);
  DSCHAT_CHECK(zero.stage >= 0 && zero.stage <= 3, ConfigError, object.at("stage"), ": ", zero.stage,
               " is not a ZeRO stage (0, 1, 2 or 3)");
  zero.contiguous_gradients = object.get<bool>("contiguous_gradients", zero.contiguous_gradients);
  zero.reduce_scatter = object.get<bool>("reduce_scatter", zero.reduce_scatter);
  zero.reduce_bucket_size = object.get<int64_t>("reduce_bucket_size", zero.reduce_bucket_size);
  zero.allgather_partitions = object.get<bool>("allgather_partitions", zero.allgather_partitions);
  zero.allgather_bucket_size = object.get<int64_t>("allgather_bucket_size", zero.allgather_bucket_size);
  zero.overlap_comm = object.get<bool>("overlap_comm", zero.stage == 3);
  zero.round_robin_gradients = object.get<bool>("round_robin_gradients", zero.round_robin_gradients);
  zero.sub_group_size = object.get<int64_t>("sub_group_size", zero.sub_group_size);
  auto stage3 = [&](const char* key, const char* alias, int64_t& field) {
    if (alias && object.has(alias)) field = object.get<int64_t>(alias, field);
    field = object.get<int64_t>(key, field);
  };
  stage3("stage3_prefetch_bucket_size", "prefetch_bucket_size", zero.stage3_prefetch_bucket_size);
  stage3("stage3_param_persistence_threshold", "param_persistence_threshold", zero.stage3_param_persistence_threshold);
  stage3("stage3_model_persistence_threshold", "model_persistence_threshold", zero.stage3_model_persistence_threshold);
  stage3("stage3_max_live_parameters", "max_live_parameters", zero.stage3_max_live_parameters);
  stage3("stage3_max_reuse_distance", "max_reuse_distance", zero.stage3_max_reuse_distance);
  zero.stage3_gather_16bit_weights_on_model_save = object.get<bool>(
      "stage3_gather_16bit_weights_on_model_save",
      object.get<bool>("stage3_gather_fp16_weights_on_model_save", zero.stage3_gather_16bit_weights_on_model_save));
  DSCHAT_CHECK(zero.reduce_bucket_size > 0 && zero.allgather_bucket_size > 0, ConfigError, object.where(),
               ": bucket sizes must be positive");
  zero.zero_quantized_nontrainable_weights =
      object.get<bool>("zero_quantized_nontrainable_weights", zero.zero_quantized_nontrainable_weights);
  if (zero.zero_quantized_nontrainable_weights && zero.stage < 3) {
    unacted.push_back("zero_optimization.zero_quantized_nontrainable_weights (stage < 3: nothing is partitioned)");
  }
  if (auto offload = object.object("offload_param")) zero.offload_param = parse_offload(*offload, false, unacted);
  if (auto offload = object.object("offload_optimizer")) zero.offload_optimizer = parse_offload(*offload, true, unacted);
  // DeepSpeed ignores offload_param below stage 3, and DeepSpeed-Chat's --offload sets it at any
  // stage, so it is accepted there and reported as not acted on.
  if (zero.offload_param.enabled() && zero.stage < 3) unacted.push_back("zero_optimization.offload_param (stage < 3)");
  DSCHAT_CHECK(!zero.offload_optimizer.enabled() || zero.stage >= 1, ConfigError, object.where(),
               ": offload_optimizer needs stage 1, 2 or 3 (stage is 0)");
  DSCHAT_CHECK(zero.offload_optimizer.ratio == 1.0 || zero.stage == 3, ConfigError, object.where(),
               ": offload_optimizer.ratio < 1 needs stage 3");
  if (!zero.reduce_scatter) unacted.push_back("zero_optimization.reduce_scatter=false (dschat always reduce-scatters)");
  if (zero.offload_optimizer.ratio < 1.0) unacted.push_back("zero_optimization.offload_optimizer.ratio");
  for (const char* key : {"round_robin_gradients", "sub_group_size", "stage3_max_reuse_distance",
                          "stage3_model_persistence_threshold", "model_persistence_threshold", "max_reuse_distance"}) {
    if (object.has(key)) unacted.push_back(std::string("zero_optimization.") + key);
  }
  DSCHAT_CHECK(!object.has("legacy_stage1") || !object.get<bool>("legacy_stage1", false), Unsupported,
               object.at("legacy_stage1"), ": legacy_stage1 was removed from DeepSpeed");
  collect_unacted(object,
                  {"load_from_fp32_weights", "elastic_checkpoint", "use_multi_rank_bucket_allreduce",
                   "stage3_module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params",
                   "ignore_unused_parameters", "zero_hpz_partition_size", "zero_quantized_weights",
                   "zero_quantized_gradients", "mics_shard_size",
                   "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
                   "cpu_offload", "cpu_offload_params", "cpu_offload_use_pin_memory"},
                  "zero_optimization.", unacted);
  object.finish();
  return zero;
}

OptimizerConfig parse_optimizer(JsonObject object) {
  OptimizerConfig optimizer;
  optimizer.type = object.require<std::string>("type");
  DSCHAT_CHECK(optimizer.type == "Adam" || optimizer.type == "AdamW", Unsupported, object.at("type"), ": '",
               optimizer.type, "' is not supported (dschat implements Adam and AdamW)");
  if (auto params = object.object("params")) {
    optimizer.lr = params->get<double>("lr", optimizer.lr);
    if (params->has("betas")) {
      auto betas = params->get<nlohmann::json>("betas", nlohmann::json());
      DSCHAT_CHECK(betas.is_array() && betas.size() == 2 && betas[0].is_number() && betas[1].is_number(),
                   ConfigError, params->at("betas"), ": expects two numbers");
      optimizer.beta1 = betas[0].get<double>();
      optimizer.beta2 = betas[1].get<double>();
    }
    optimizer.eps = params->get<double>("eps", optimizer.eps);
    optimizer.weight_decay = params->get<double>("weight_decay", optimizer.weight_decay);
    optimizer.bias_correction = params->get<bool>("bias_correction", optimizer.bias_correction);
    optimizer.adam_w_mode = params->get<bool>("adam_w_mode", optimizer.adam_w_mode);
    DSCHAT_CHECK(!params->has("max_grad_norm"), ConfigError, params->at("max_grad_norm"),
                 ": not supported in optimizer params; use the top-level gradient_clipping");
    DSCHAT_CHECK(!params->get<bool>("amsgrad", false), Unsupported, params->at("amsgrad"),
                 ": amsgrad is not supported (neither is it by DeepSpeed's FusedAdam)");
    params->accept({"torch_adam", "fp32_optimizer_states"});
    params->finish();
  }
  object.finish();
  DSCHAT_CHECK(optimizer.lr >= 0 && optimizer.eps > 0 && optimizer.beta1 >= 0 && optimizer.beta1 < 1 &&
                   optimizer.beta2 >= 0 && optimizer.beta2 < 1,
               ConfigError, object.where(), ": lr >= 0, eps > 0 and betas in [0, 1) are required");
  return optimizer;
}

}  // namespace

void resolve_batch_sizes(int64_t& train, int64_t& micro, int64_t& accum, int64_t world, const std::string& where) {
  DSCHAT_CHECK(world >= 1, InvalidArgument, "world size ", world, " must be >= 1");
  if (train && micro && accum) {
  } else if (train && micro) {
    accum = train / micro / world;
  } else if (train && accum) {
    micro = train / world / accum;
  } else if (micro && accum) {
    train = micro * accum * world;
  } else if (train) {
    accum = 1;
    micro = train / world;
  } else if (micro) {
    accum = 1;
    train = micro * world;
  } else {
    DSCHAT_THROW(ConfigError, where, ": either train_batch_size or train_micro_batch_size_per_gpu must be given");
  }
  DSCHAT_CHECK(train > 0 && micro > 0 && accum > 0 && train == micro * accum * world, ConfigError, where,
               ": inconsistent batch sizes: train_batch_size ", train, " != train_micro_batch_size_per_gpu ", micro,
               " * gradient_accumulation_steps ", accum, " * world size ", world);
}

DeepSpeedConfig DeepSpeedConfig::parse(const nlohmann::json& json, int64_t world_size, const std::string& where) {
  JsonObject root(json, where);
  DeepSpeedConfig config;
  config.train_batch_size = root.get<int64_t>("train_batch_size", 0);
  config.train_micro_batch_size_per_gpu = root.get<int64_t>("train_micro_batch_size_per_gpu", 0);
  config.gradient_accumulation_steps = root.get<int64_t>("gradient_accumulation_steps", 0);
  resolve_batch_sizes(config.train_batch_size, config.train_micro_batch_size_per_gpu,
                      config.gradient_accumulation_steps, world_size, where);

  bool fp16 = false, bf16 = false;
  if (auto block = root.object("fp16")) {
    config.fp16_block = root.get<nlohmann::json>("fp16", nlohmann::json::object());
    fp16 = block->get<bool>("enabled", false);
    DSCHAT_CHECK(!block->get<bool>("auto_cast", false), Unsupported, block->at("auto_cast"),
                 ": fp16 auto_cast is not supported");
    block->accept({"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                   "min_loss_scale", "fp16_master_weights_and_grads", "auto_cast"});
    block->finish();
  }
  for (const char* name : {"bf16", "bfloat16"}) {
    if (auto block = root.object(name)) {
      bf16 = bf16 || block->get<bool>("enabled", false);
      block->accept({"immediate_grad_update", "check_grad_overflow"});
      block->finish();
    }
  }
  DSCHAT_CHECK(!(fp16 && bf16), ConfigError, where, ": fp16 and bf16 cannot both be enabled");
  config.precision = fp16 ? Precision::kFp16 : bf16 ? Precision::kBf16 : Precision::kFp32;

  config.gradient_clipping = root.get<double>("gradient_clipping", 0.0);
  DSCHAT_CHECK(config.gradient_clipping >= 0, ConfigError, root.at("gradient_clipping"), ": ",
               config.gradient_clipping, " must be >= 0");
  if (auto block = root.object("optimizer")) config.optimizer = parse_optimizer(*block);
  if (root.has("scheduler")) config.scheduler = root.get<nlohmann::json>("scheduler", nlohmann::json());
  if (auto block = root.object("zero_optimization")) config.zero = parse_zero(*block, config.not_acted_on);
  if (auto block = root.object("hybrid_engine")) {
    auto& he = config.hybrid_engine;
    he.enabled = block->get<bool>("enabled", he.enabled);
    he.max_out_tokens = block->get<int64_t>("max_out_tokens", he.max_out_tokens);
    he.inference_tp_size = block->get<int64_t>("inference_tp_size", he.inference_tp_size);
    he.release_inference_cache = block->get<bool>("release_inference_cache", he.release_inference_cache);
    he.pin_parameters = block->get<bool>("pin_parameters", he.pin_parameters);
    he.tp_gather_partition_size = block->get<int64_t>("tp_gather_partition_size", he.tp_gather_partition_size);
    he.enable_cuda_graph = block->get<bool>("enable_cuda_graph", he.enable_cuda_graph);
    he.continuous_batching = block->get<bool>("continuous_batching", he.continuous_batching);
    he.kv_cache_memory_mib = block->get<int64_t>("kv_cache_memory_mib", he.kv_cache_memory_mib);
    he.max_running_sequences = block->get<int64_t>("max_running_sequences", he.max_running_sequences);
    he.prefix_caching = block->get<bool>("prefix_caching", he.prefix_caching);
    DSCHAT_CHECK(he.max_out_tokens > 0 && he.inference_tp_size >= 1 && he.tp_gather_partition_size >= 1, ConfigError,
                 block->where(), ": max_out_tokens, inference_tp_size and tp_gather_partition_size must be positive");
    DSCHAT_CHECK(he.kv_cache_memory_mib >= 0 && he.max_running_sequences >= 1, ConfigError, block->where(),
                 ": kv_cache_memory_mib must be >= 0 and max_running_sequences >= 1, got ", he.kv_cache_memory_mib,
                 " and ", he.max_running_sequences);
    block->finish();
  }
  if (auto block = root.object("tensorboard")) {
    config.tensorboard.enabled = block->get<bool>("enabled", false);
    config.tensorboard.output_path = block->get<std::string>("output_path", "");
    config.tensorboard.job_name = block->get<std::string>("job_name", config.tensorboard.job_name);
    block->finish();
  }
  config.steps_per_print = root.get<int64_t>("steps_per_print", config.steps_per_print);
  config.wall_clock_breakdown = root.get<bool>("wall_clock_breakdown", false);
  config.prescale_gradients = root.get<bool>("prescale_gradients", false);
  config.gradient_predivide_factor = root.get<double>("gradient_predivide_factor", 1.0);
  config.on_nonfinite_loss = root.get<std::string>("on_nonfinite_loss", config.on_nonfinite_loss);
  DSCHAT_CHECK(config.on_nonfinite_loss == "skip" || config.on_nonfinite_loss == "error", ConfigError,
               root.at("on_nonfinite_loss"), ": '", config.on_nonfinite_loss, "' is not one of skip, error");
  collect_unacted(root,
                  {"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "communication_data_type",
                   "data_types", "flops_profiler", "comms_logger", "activation_checkpointing", "memory_breakdown",
                   "dump_state", "gradient_accumulation_dtype", "seq_parallel_communication_data_type"},
                  "", config.not_acted_on);
  root.finish();
  return config;
}

DeepSpeedConfig DeepSpeedConfig::load(const std::string& file, int64_t world_size) {
  std::ifstream in(file);
  DSCHAT_CHECK(in, IoError, file, ": cannot open DeepSpeed config");
  std::stringstream text;
  text << in.rdbuf();
  return parse(core::parse_json_text(text.str(), file), world_size, file);
}

}  // namespace engine
}  // namespace dschat
