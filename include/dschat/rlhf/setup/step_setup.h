#pragma once
// What the three trainers share: DeepSpeed-Chat's DeepSpeed configs (ds_utils.get_train_ds_config),
// the engine options (AdamW with betas (0.9, 0.95), three parameter groups, the HF LR schedule),
// LoRA conversion, the tokenizer and pad conventions, the phase data, and saving a trained model
// as a Hugging Face directory with its tokenizer files.
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dschat/core/model_config.h"
#include "dschat/data/prompt_dataset.h"
#include "dschat/dist/process_group.h"
#include "dschat/engine/training_engine.h"
#include "dschat/models/load_save.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace rlhf {

int64_t context_rank(const StepContext& context);
int64_t context_world(const StepContext& context);

/// Resolves every step block's `device` for this rank once (core::resolve_device) into its
/// `resolved_device`. A block the pipeline runs that asks for a GPU that is not there throws
/// ConfigError naming "<block>: key 'device'"; a block it does not run is left unresolved then.
void resolve_step_devices(PipelineConfig& config, int64_t local_rank);

/// The step's device: common.resolved_device, or common.device resolved for this rank when the
/// caller did not resolve it (ConfigError naming `where` when it asks for a GPU that is not
/// there); logged once.
torch::Device step_device(const CommonStepConfig& common, const StepContext& context, const std::string& where);

/// fp16 | bf16 | fp32 -> dtype (ConfigError naming `where` otherwise).
torch::ScalarType step_dtype(const std::string& dtype, const std::string& where);

/// get_train_ds_config: micro batch, GAS, train_batch_size = micro * GAS * world, ZeRO stage with
/// overlap_comm, offload of optimizer and parameters, fp16 (loss_scale_window 100) / bf16,
/// gradient_clipping 1.0, and the hybrid_engine block when given.
engine::DeepSpeedConfig train_ds_config(const CommonStepConfig& common, int zero_stage, int64_t micro_batch,
                                        int64_t gradient_accumulation_steps, int64_t world_size,
                                        const std::string& where,
                                        const engine::HybridEngineConfig* hybrid = nullptr);

/// The engine's optimizer (AdamW, betas 0.9/0.95, model.learning_rate, model.weight_decay,
/// LoRA lr) and schedule (common.lr_scheduler_type over `total_optimizer_steps`).
engine::TrainingEngineOptions training_engine_options(const CommonStepConfig& common, const ModelTrainingConfig& model,
                                                      engine::DeepSpeedConfig config, int64_t total_optimizer_steps,
                                                      const StepContext& context);

/// A step's TrainingEngine over `module` (collective): train_ds_config for `micro_batch` and
/// common.gradient_accumulation_steps, training_engine_options over `total_optimizer_steps`.
std::unique_ptr<engine::TrainingEngine> make_training_engine(std::shared_ptr<torch::nn::Module> module,
                                                             const CommonStepConfig& common,
                                                             const ModelTrainingConfig& model, int64_t micro_batch,
                                                             int64_t total_optimizer_steps, const StepContext& context,
                                                             const std::string& where);

/// A step's TrainingEngine over a module loaded with `deferred` (nullptr: an eager load).
std::unique_ptr<engine::TrainingEngine> make_training_engine(std::shared_ptr<torch::nn::Module> module,
                                                             const CommonStepConfig& common,
                                                             const ModelTrainingConfig& model, int64_t micro_batch,
                                                             int64_t total_optimizer_steps, const StepContext& context,
                                                             const std::string& where,
                                                             std::shared_ptr<const models::DeferredParameters> deferred);

/// How steps 1, 2 and DPO load their trained model: onto `device` in the step's dtype, random
/// weights when the context says so, the configured dropout.
models::LoadOptions step_load_options(const CommonStepConfig& common, const ModelTrainingConfig& model,
                                      const StepContext& context, const torch::Device& device);

/// ZeRO stage 3 loads partitioned (DeepSpeed's zero.Init, which DeepSpeed-Chat enters for every
/// model of a stage-3 step): sets load.deferred and returns the values to hand to the model's
/// engine; other stages load eagerly (nullptr, load unchanged).
std::shared_ptr<models::DeferredParameters> defer_load_at_stage3(models::LoadOptions& load, int zero_stage);

/// The ZeRO block of DeepSpeed-Chat's get_eval_ds_config at stage 3 (the reference and reward
/// models of a stage-3 step 3): stage3_param_persistence_threshold 1e4, offload_param cpu when
/// `offload` (offload_reference_model / offload_reward_model), DeepSpeed's defaults otherwise.
engine::ZeroConfig eval_zero3_config(bool offload);

/// Optimizer steps of `epochs` epochs of `batches_per_epoch` micro-batches, one step per `gas`.
int64_t optimizer_steps_for(int64_t epochs, int64_t batches_per_epoch, int64_t gas);

/// The options of a step's metrics log: TensorBoard as configured, only rank 0 writes.
monitor::MetricsLogOptions metrics_log_options(const CommonStepConfig& common, const StepContext& context);

/// LoRA adapters on the Linear layers whose name contains model.lora_module_name (when
/// lora_dim > 0); with only_optimize_lora every other parameter except `force` is frozen.
void apply_lora(torch::nn::Module& module, const ModelTrainingConfig& model, bool only_optimize_lora,
                const std::vector<std::string>& force = {});

/// The tokenizer of a step: the context's, else the model directory's. Throws core::NotFound
/// naming both when neither has tokenizer files.
tokenizer::Tokenizer load_step_tokenizer(const StepContext& context, const std::string& model_name_or_path);

/// DeepSpeed-Chat pads with eos where the tokenizer has no pad token (GPT-2/OPT).
int64_t pad_token_of(const tokenizer::Tokenizer& tokenizer);
/// The text the SFT data appends (step 1: the eos token's text).
std::string eos_text_of(const tokenizer::Tokenizer& tokenizer);
/// 1 when the tokenizer prepends a BOS equal to its pad token (OPT), else 0: DS-Chat's
/// num_padding_at_beginning derived instead of assumed.
int64_t padding_at_beginning(const tokenizer::Tokenizer& tokenizer);

/// The phase's data options from the config's data block.
data::PromptDataOptions prompt_data_options(const DataConfig& data, int phase, uint32_t seed, int64_t max_seq_len,
                                            const std::string& end_of_conversation_token);

/// Checks that the model's embedding has a row for every token id (ConfigError naming both).
void check_vocab(int64_t model_vocab, const tokenizer::Tokenizer& tokenizer, const std::string& model);

/// Checks that sequences of `tokens` fit the model's positions: a learned position table (OPT,
/// GPT-2, GPT-Neo) has max_position_embeddings rows, so a longer sequence is a ConfigError naming
/// `keys` ("step 1 (SFT): key 'max_seq_len'"), the value and the limit; rotary and ALiBi models
/// can run longer and get a warning.
void check_sequence_length(const core::ModelConfig& config, int64_t tokens, const std::string& keys,
                           const std::string& model);

/// Collective: the module's full parameters (ZeRO-3 partitions gathered) with LoRA fused, on the
/// CPU, by Hugging Face name. Ranks other than 0 get an empty map.
std::map<std::string, torch::Tensor> trained_parameters(engine::TrainingEngine& engine, const StepContext& context);

/// A plain module's parameters with LoRA fused, on the CPU (the EMA actor, frozen models).
std::map<std::string, torch::Tensor> module_parameters(torch::nn::Module& module);

/// Writes a Hugging Face model directory: `params` with `config` (weights in `format`), and the
/// tokenizer files.
void write_model_dir(const std::map<std::string, torch::Tensor>& params, const core::ModelConfig& config,
                     const tokenizer::Tokenizer& tokenizer, const std::filesystem::path& dir,
                     io::WeightsFormat format = io::WeightsFormat::kSafetensors);

/// "<dir>.saving.<pid>": where a step's output is assembled before commit_step_output.
std::filesystem::path staging_dir_for(const std::filesystem::path& dir);

/// Clears `staging`, runs `write` (which fills it and commits it); if `write` throws (a full disk),
/// removes what it left in `staging` and rethrows, so no "<dir>.saving.<pid>" stays behind.
void write_staged(const std::filesystem::path& staging, const std::function<void()>& write);

/// Writes `summary` (with the context's run_overview, when it has one) as
/// <staging>/training_summary.json, then replaces `dir` with `staging` (a crash leaves the old
/// directory or none, never a half-written one).
void commit_step_output(const std::filesystem::path& staging, const std::filesystem::path& dir,
                        const nlohmann::json& summary, const StepContext& context);

/// Collective: trained_parameters, the output gate (rlhf/setup/output_gate.h: a diverged or untrained
/// model throws StepFailed on every rank), write_model_dir + commit_step_output by rank 0 (one
/// model per step directory, as steps 1 and 2 save), then a barrier. `chat_format` (not null):
/// written as data::kChatFormatFile, the conversation format the model was trained in.
void save_trained_model(engine::TrainingEngine& engine, const core::ModelConfig& config,
                        const tokenizer::Tokenizer& tokenizer, const std::filesystem::path& dir,
                        const nlohmann::json& summary, const StepContext& context,
                        const nlohmann::json& chat_format = nullptr,
                        io::WeightsFormat format = io::WeightsFormat::kSafetensors);

/// The conversation format of an SFT phase's data (data::infer_chat_format on its first train
/// sample, decoded), or null when its text has no "Human: ... Assistant:" turn.
nlohmann::json sft_chat_format(const data::TokenizedDataset& train, const tokenizer::Tokenizer& tokenizer);

/// Mean of `value` over the ranks (the value itself in a world of one).
double all_reduce_mean(const StepContext& context, double value);

}  // namespace rlhf
}  // namespace dschat
