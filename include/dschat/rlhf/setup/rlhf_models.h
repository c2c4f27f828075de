#pragma once
// The four (five with EMA) models of step 3, as DeepSpeed-Chat's DeepSpeedRLHFEngine builds them:
//   actor   step-1 model, trained, inside a HybridEngine (train <-> generate), LoRA optional
//   ref     step-1 model, frozen (eval mode, no grad)
//   critic  step-2 model (value head), trained by its own TrainingEngine, LoRA optional
//   reward  step-2 model, frozen
//   ema     step-1 model updated only by the moving average of the actor (enable_ema)
// Critic and reward start as identical copies of the reward model, v_head included.
// Placement (rlhf_placement): everything on the step's device in the step's dtype. As in DS-Chat,
// the reference is partitioned by a ZeRO-3 inference engine when the actor's stage is 3, and the
// reward model when the critic's is (engine/zero_inference_engine.h); offload_reference_model
// (offload_reward_model) then keeps its partitions in host memory (offload_param), gathered onto
// the device layer by layer. Below stage 3 an offloaded reference (reward model) stays whole on
// the CPU and computes there (DeepSpeed ignores offload_param below stage 3, so DS-Chat would
// keep it on the GPU), and experience generation moves its inputs and outputs (experience.h).
// Every model of a stage-3 engine is loaded partitioned (DeepSpeed's zero.Init): no rank ever
// holds more than its partitions of it on the device.
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "dschat/engine/async_checkpoint_writer.h"
#include "dschat/engine/training_engine.h"
#include "dschat/engine/zero_inference_engine.h"
#include "dschat/engine/partitioned_ema.h"
#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/models/causal_lm.h"
#include "dschat/models/value_head.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace rlhf {

/// Where a model of step 3 lives and in which dtype.
struct ModelPlacement {
  torch::Device device = torch::kCPU;  // where it computes
  torch::ScalarType dtype = torch::kFloat32;
  bool zero3 = false;          // frozen models: partitioned by a ZeRO-3 inference engine
  bool offload_param = false;  // zero3: the partitions live in host memory
};

struct RlhfPlacement {
  ModelPlacement trained;    // actor, critic and the EMA: the step's device and dtype
  ModelPlacement reference;  // the CPU with offload_reference_model, else as trained
  ModelPlacement reward;     // the CPU with offload_reward_model, else as trained
};

/// The placement of step 3's models for a step running on `step_device` in `step_dtype`. An
/// offloaded model keeps the step's dtype: offloading is about memory, and the scores it gives
/// are compared with the actor's, which are in that dtype. The EMA is neither offloaded nor
/// partitioned (DS-Chat does both as for the reference): it is updated every micro-step.
RlhfPlacement rlhf_placement(const PpoConfig& config, const torch::Device& step_device, torch::ScalarType step_dtype);
/// The policy side's placement (any policy step): the reward as trained (the critic-free step's
/// reward models score where the actor trains).
RlhfPlacement policy_placement(const PolicyStepConfig& config, const torch::Device& step_device,
                               torch::ScalarType step_dtype);

/// A frozen causal LM from `path` (the reference of step 3 and of DPO) where `at` places it,
/// requires_grad off and in eval mode: replicated, or loaded partitioned and held by a ZeRO-3
/// inference engine that `engine` receives (at.zero3). `load` gives the rest (dropout, random_init).
models::CausalLM load_frozen_causal_lm(const std::string& path, const ModelPlacement& at,
                                       const models::LoadOptions& load, const StepContext& context,
                                       std::unique_ptr<engine::ZeroInferenceEngine>& engine);

/// The device of a module's parameters (the first one's; the CPU for a module without any).
torch::Device parameter_device(const torch::nn::Module& module);

struct RlhfModels {
  RlhfPlacement placement;  // where build_rlhf_models put each model
  std::unique_ptr<hybrid::HybridEngine> actor;
  models::CausalLM ref{nullptr};
  std::unique_ptr<engine::ZeroInferenceEngine> ref_engine;  // placement.reference.zero3
  models::ValueHeadModel critic{nullptr};
  std::unique_ptr<engine::TrainingEngine> critic_engine;
  models::ValueHeadModel reward{nullptr};
  std::unique_ptr<engine::ZeroInferenceEngine> reward_engine;  // placement.reward.zero3
  models::CausalLM ema{nullptr};  // enable_ema with the actor at ZeRO 0-2: a replicated copy
  std::unique_ptr<engine::PartitionedEma> ema_partitions;  // enable_ema with the actor at ZeRO-3
                                                           // (host partitions with offload_reference_model)
  bool has_ema() const { return !ema.is_empty() || ema_partitions != nullptr; }
};

/// Collective. `total_iters` is DS-Chat's num_total_iters (the LR schedules' length);
/// `actor_gas` the actor's gradient accumulation (doubled with mixture training). The models
/// are placed by rlhf_placement on the step's device (step_device of config.common).
RlhfModels build_rlhf_models(const PpoConfig& config, int64_t total_iters, int64_t actor_gas,
                             const StepContext& context);

/// The policy side only: the actor's HybridEngine, the reference (with_reference) and the EMA
/// (enable_ema), as build_rlhf_models builds them; critic and reward stay null. What the
/// critic-free step trains (it reads config's actor, hybrid-engine, reference and EMA keys).
/// `quantize_frozen_actor`: PPO's enable_mixed_precision_lora (zero_quantized_nontrainable_weights
/// in the actor's ZeRO config).
RlhfModels build_policy_models(const PolicyStepConfig& config, int64_t total_iters, int64_t actor_gas,
                               const StepContext& context, bool with_reference, const std::string& where,
                               bool quantize_frozen_actor = false);

/// A frozen value-head model (a reward model) at `at`, as load_frozen_causal_lm.
models::ValueHeadModel load_frozen_value_model(const std::string& path, const ModelPlacement& at,
                                               const models::LoadOptions& load, const StepContext& context,
                                               std::unique_ptr<engine::ZeroInferenceEngine>& engine);

/// The EMA weights of checkpoint `tag`: <ema_dir>/<tag>/, staged as .tmp-<tag> and renamed, so a
/// tag directory is complete or absent. Given the writer, written from host copies on its thread.
void save_ema_checkpoint(const std::filesystem::path& ema_dir, const std::string& tag,
                         const std::map<std::string, torch::Tensor>& ema, engine::AsyncCheckpointWriter* background);

/// Restores the EMA weights of checkpoint `tag` (save_ema_checkpoint's); nothing without an EMA.
void load_ema_checkpoint(RlhfModels& models, const std::filesystem::path& ema_dir, const std::string& tag);

/// Collective: the trained models as Hugging Face directories <output_dir>/actor (and critic and
/// actor_ema where they exist), assembled beside it and renamed into place with `summary`. The
/// actor and its EMA keep the conversation format their initial model recorded
/// (`actor_init`/data::kChatFormatFile, the SFT output's), so `dschat chat` prompts them as trained.
/// `format`: the weights files (the step's save_format).
void save_rl_outputs(RlhfModels& models, const tokenizer::Tokenizer& tokenizer, const std::filesystem::path& output_dir,
                     const nlohmann::json& summary, const StepContext& context, const std::string& actor_init,
                     io::WeightsFormat format);

/// ema <- lerp(actor, ema, beta) for every parameter (at ZeRO-3 partition by partition: nothing
/// is gathered).
void update_ema(RlhfModels& models, double beta);

/// Collective: the EMA's parameters by name (gathered from every rank's partitions at ZeRO-3);
/// empty without an EMA.
std::map<std::string, torch::Tensor> ema_parameters(RlhfModels& models);

}  // namespace rlhf
}  // namespace dschat
