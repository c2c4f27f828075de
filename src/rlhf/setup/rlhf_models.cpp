#include "dschat/rlhf/setup/rlhf_models.h"

#include "core/log.h"
#include "dschat/data/chat_format.h"
#include "dschat/io/state_dict.h"
#include "io/atomic_file.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/setup/output_gate.h"
#include "dschat/rlhf/math/ppo_math.h"
#include "dschat/rlhf/setup/step_setup.h"

namespace dschat {
namespace rlhf {
namespace {

void freeze(torch::nn::Module& module) {
  for (auto& p : module.parameters()) p.set_requires_grad(false);
  module.eval();
}

// A frozen model of step 3 where `at` places it: replicated, or partitioned by a ZeRO-3
// inference engine (loaded partitioned) that `engine` receives.
template <typename Model, typename Load>
Model load_frozen(const ModelPlacement& at, models::LoadOptions load, const StepContext& context, Load load_model,
                  std::unique_ptr<engine::ZeroInferenceEngine>& engine) {
  load.device = at.device;
  load.dtype = at.dtype;
  std::shared_ptr<models::DeferredParameters> deferred = defer_load_at_stage3(load, at.zero3 ? 3 : 0);
  Model model = load_model(load);
  freeze(*model);
  if (at.zero3) {
    engine::ZeroInferenceOptions options;
    options.zero = eval_zero3_config(at.offload_param);
    options.communicator = context.communicator;
    options.deferred = std::move(deferred);
    engine = std::make_unique<engine::ZeroInferenceEngine>(model.ptr(), std::move(options));
  }
  return model;
}

}  // namespace

namespace {

// A frozen model's place: partitioned when its trained twin is at ZeRO-3, else replicated on the
// step's device or, offloaded, on the CPU.
ModelPlacement frozen_placement(const ModelPlacement& trained, bool zero3, bool offload) {
  if (zero3) return ModelPlacement{trained.device, trained.dtype, true, offload};
  return offload ? ModelPlacement{torch::kCPU, trained.dtype} : trained;
}

}  // namespace

RlhfPlacement policy_placement(const PolicyStepConfig& config, const torch::Device& step_device,
                               torch::ScalarType step_dtype) {
  RlhfPlacement placement;
  placement.trained = ModelPlacement{step_device, step_dtype};
  placement.reference = frozen_placement(placement.trained, config.actor.zero_stage == 3, config.offload_reference_model);
  placement.reward = placement.trained;
  return placement;
}

RlhfPlacement rlhf_placement(const PpoConfig& config, const torch::Device& step_device, torch::ScalarType step_dtype) {
  RlhfPlacement placement = policy_placement(config, step_device, step_dtype);
  placement.reward = frozen_placement(placement.trained, config.critic.zero_stage == 3, config.offload_reward_model);
  return placement;
}

models::CausalLM load_frozen_causal_lm(const std::string& path, const ModelPlacement& at,
                                       const models::LoadOptions& load, const StepContext& context,
                                       std::unique_ptr<engine::ZeroInferenceEngine>& engine) {
  auto load_copy = [&](const models::LoadOptions& options) { return models::load_causal_lm(path, options); };
  return load_frozen<models::CausalLM>(at, load, context, load_copy, engine);
}

models::ValueHeadModel load_frozen_value_model(const std::string& path, const ModelPlacement& at,
                                               const models::LoadOptions& load, const StepContext& context,
                                               std::unique_ptr<engine::ZeroInferenceEngine>& engine) {
  auto load_copy = [&](const models::LoadOptions& options) { return models::load_value_model(path, options); };
  return load_frozen<models::ValueHeadModel>(at, load, context, load_copy, engine);
}

torch::Device parameter_device(const torch::nn::Module& module) {
  for (const torch::Tensor& p : module.parameters()) return p.device();
  return torch::kCPU;
}

RlhfModels build_policy_models(const PolicyStepConfig& config, int64_t total_iters, int64_t actor_gas,
                               const StepContext& context, bool with_reference, const std::string& where,
                               bool quantize_frozen_actor) {
  const int64_t world = context_world(context);
  RlhfModels models;
  models.placement = policy_placement(config, step_device(config.common, context, where),
                                    config.common.dtype);
  models::LoadOptions load;
  load.device = models.placement.trained.device;
  load.dtype = models.placement.trained.dtype;
  load.random_init = context.random_init;

  // Every copy of a randomly initialised model must start equal: reseed before each load.
  torch::manual_seed(config.common.seed);
  models::LoadOptions actor_load = load;
  actor_load.dropout = config.actor.dropout;
  std::shared_ptr<models::DeferredParameters> actor_deferred = defer_load_at_stage3(actor_load, config.actor.zero_stage);
  models::CausalLM actor = models::load_causal_lm(config.actor_model_name_or_path, actor_load);
  actor->backbone().set_gradient_checkpointing(config.actor.gradient_checkpointing);
  torch::manual_seed(config.common.seed + 1);  // the adapters' initial values
  apply_lora(*actor, config.actor, config.common.only_optimize_lora);
  actor->train();

  engine::HybridEngineConfig hybrid;
  hybrid.enabled = config.enable_hybrid_engine;
  hybrid.max_out_tokens = config.max_prompt_seq_len + config.max_answer_seq_len;
  hybrid.inference_tp_size = config.inference_tp_size;
  hybrid.release_inference_cache = config.release_inference_cache;
  hybrid.pin_parameters = !config.unpin_actor_parameters;
  hybrid.tp_gather_partition_size = config.tp_gather_partition_size;
  hybrid.enable_cuda_graph = config.enable_cuda_graph;
  hybrid.continuous_batching = config.continuous_batching;
  hybrid.kv_cache_memory_mib = config.kv_cache_memory_mib;
  hybrid.max_running_sequences = config.max_running_sequences;
  hybrid.prefix_caching = config.prefix_caching;
  hybrid::HybridEngineOptions actor_options;
  actor_options.lora_fuse_backup = config.lora_fuse_backup;
  engine::DeepSpeedConfig actor_ds = train_ds_config(config.common, config.actor.zero_stage,
                                                     config.per_device_training_batch_size, actor_gas, world,
                                                     where + ": actor", &hybrid);
  // DeepSpeed-Chat adds zero_quantized_nontrainable_weights to the actor's config alone.
  actor_ds.zero.zero_quantized_nontrainable_weights = quantize_frozen_actor;
  actor_options.training = training_engine_options(config.common, config.actor, std::move(actor_ds), total_iters,
                                                   context);
  actor_options.training.deferred = std::move(actor_deferred);
  models.actor = std::make_unique<hybrid::HybridEngine>(actor, std::move(actor_options));

  auto load_actor_copy = [&](const models::LoadOptions& options) {
    return models::load_causal_lm(config.actor_model_name_or_path, options);
  };
  torch::manual_seed(config.common.seed);
  if (with_reference) {
    models.ref = load_frozen<models::CausalLM>(models.placement.reference, load, context, load_actor_copy,
                                               models.ref_engine);
  }

  if (config.enable_ema && config.actor.zero_stage == 3) {
    // Partitioned like the actor, starting from its values (the same checkpoint and adapters the
    // replicated copy below loads), on the host when the reference is offloaded.
    const torch::Device device = config.offload_reference_model ? torch::Device(torch::kCPU) : load.device;
    models.ema_partitions = std::make_unique<engine::PartitionedEma>(models.actor->training_engine(), device);
  } else if (config.enable_ema) {
    torch::manual_seed(config.common.seed);
    models.ema = models::load_causal_lm(config.actor_model_name_or_path, load);
    // Same adapters as the actor's (DS-Chat gives the EMA fresh ones: only their effect, a zero
    // delta, matches); names must match for the average.
    torch::manual_seed(config.common.seed + 1);
    apply_lora(*models.ema, config.actor, false);
    freeze(*models.ema);
  }
  return models;
}

RlhfModels build_rlhf_models(const PpoConfig& config, int64_t total_iters, int64_t actor_gas,
                             const StepContext& context) {
  const std::string where = "step 3 (PPO)";
  RlhfModels models = build_policy_models(config, total_iters, actor_gas, context, /*with_reference=*/true, where,
                                          config.enable_mixed_precision_lora);
  models.placement = rlhf_placement(config, models.placement.trained.device, models.placement.trained.dtype);
  models::LoadOptions load;
  load.device = models.placement.trained.device;
  load.dtype = models.placement.trained.dtype;
  load.random_init = context.random_init;
  auto load_reward_copy = [&](const models::LoadOptions& options) {
    return models::load_value_model(config.critic_model_name_or_path, options);
  };

  models::LoadOptions critic_load = load;
  critic_load.dropout = config.critic.dropout;
  std::shared_ptr<models::DeferredParameters> critic_deferred =
      defer_load_at_stage3(critic_load, config.critic.zero_stage);
  torch::manual_seed(config.common.seed + 2);
  models.critic = models::load_value_model(config.critic_model_name_or_path, critic_load);
  models.critic->backbone().set_gradient_checkpointing(config.critic.gradient_checkpointing);
  torch::manual_seed(config.common.seed + 3);
  apply_lora(*models.critic, config.critic, config.common.only_optimize_lora, {"v_head.weight"});
  models.critic->train();
  models.critic_engine = make_training_engine(models.critic.ptr(), config.common, config.critic,
                                              config.per_device_training_batch_size, total_iters, context,
                                              where + ": critic", std::move(critic_deferred));

  torch::manual_seed(config.common.seed + 2);
  models.reward = load_frozen<models::ValueHeadModel>(models.placement.reward, load, context, load_reward_copy,
                                                      models.reward_engine);
  return models;
}

void save_ema_checkpoint(const std::filesystem::path& ema_dir, const std::string& tag, const std::map<std::string, torch::Tensor>& ema,
                         engine::AsyncCheckpointWriter* background) {
  auto weights = std::make_shared<io::TensorMap>();
  for (const auto& [name, value] : ema) {
    (*weights)[name] = background ? value.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true) : value;
  }
  auto write = [ema_dir, tag, weights](const std::atomic<bool>& /*cancelled*/) {
    const std::filesystem::path staging = ema_dir / (".tmp-" + tag), final_dir = ema_dir / tag;
    io::remove_directory_tree(staging);
    io::save_state_dict(staging, *weights);
    io::remove_directory_tree(final_dir);
    std::filesystem::rename(staging, final_dir);
  };
  if (background) {
    background->submit(std::move(write));
  } else {
    write(std::atomic<bool>{false});
  }
}

void load_ema_checkpoint(RlhfModels& models, const std::filesystem::path& ema_dir, const std::string& tag) {
  if (!models.has_ema()) return;
  io::TensorMap ema = io::load_state_dict(ema_dir / tag);
  if (models.ema_partitions) {
    models.ema_partitions->load(std::map<std::string, torch::Tensor>(ema.begin(), ema.end()));
    return;
  }
  torch::NoGradGuard no_grad;
  for (auto& item : models.ema->named_parameters()) item.value().copy_(ema.at(item.key()));
}

std::map<std::string, torch::Tensor> ema_parameters(RlhfModels& models) {
  if (models.ema_partitions) return models.ema_partitions->consolidated();
  if (models.ema) return module_parameters(*models.ema);
  return {};
}

void save_rl_outputs(RlhfModels& models, const tokenizer::Tokenizer& tokenizer, const std::filesystem::path& output_dir,
                     const nlohmann::json& summary, const StepContext& context, const std::string& actor_init,
                     io::WeightsFormat format) {
  auto actor_params = trained_parameters(models.actor->training_engine(), context);
  std::map<std::string, torch::Tensor> critic_params;
  if (models.critic_engine) critic_params = trained_parameters(*models.critic_engine, context);
  const auto updates = [](const engine::TrainingEngine& e) { return e.global_steps() - e.skipped_steps(); };
  check_step_output(actor_params, updates(models.actor->training_engine()), output_dir, context);
  if (models.critic_engine) check_step_output(critic_params, updates(*models.critic_engine), output_dir, context);
  const std::map<std::string, torch::Tensor> ema_params = ema_parameters(models);  // collective
  if (context_rank(context) == 0) {
    const std::filesystem::path staging = staging_dir_for(output_dir);
    write_staged(staging, [&] {
      write_model_dir(actor_params, models.actor->actor()->config(), tokenizer, staging / "actor", format);
      if (models.critic) {
        write_model_dir(critic_params, models.critic->config(), tokenizer, staging / "critic", format);
      }
      if (models.has_ema()) {
        write_model_dir(ema_params, models.actor->actor()->config(), tokenizer, staging / "actor_ema", format);
      }
      const std::filesystem::path format = std::filesystem::path(actor_init) / data::kChatFormatFile;
      if (std::filesystem::is_regular_file(format)) {
        for (const char* dir : {"actor", "actor_ema"}) {
          if (std::filesystem::is_directory(staging / dir)) {
            std::filesystem::copy_file(format, staging / dir / data::kChatFormatFile,
                                       std::filesystem::copy_options::overwrite_existing);
          }
        }
      }
      commit_step_output(staging, output_dir, summary, context);
    });
  }
  if (context.communicator) context.communicator->barrier();
}

void update_ema(RlhfModels& models, double beta) {
  if (models.ema_partitions) {  // ZeRO-3: this rank's ranges, nothing gathered
    models.ema_partitions->update(beta);
    return;
  }
  if (!models.ema) return;
  ema_update(*models.actor->actor(), *models.ema, beta);  // ZeRO 0-2: every parameter is resident
}

}  // namespace rlhf
}  // namespace dschat
