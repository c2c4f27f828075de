#pragma once
// The typed configuration of `dschat train` and of each step (`dschat sft|rm|ppo`). Every key is
// named as DeepSpeed-Chat's command-line argument of the same meaning (snake_case, without the
// dashes), and every default is DeepSpeed-Chat's (deepspeed-chat-app.md §2-§4), except where
// docs/config.md says why we differ. A config file is JSON:
//
//   {
//     "actor_model": "facebook/opt-1.3b", "reward_model": "facebook/opt-350m",
//     "deployment": "single_gpu", "output_dir": "./output", "init": "pretrained",
//     "data": { "data_path": ["Dahoas/rm-static"], "data_split": "2,4,4", ... },
//     "step1": { "per_device_train_batch_size": 16, "learning_rate": 1e-3, "lora_dim": 128, ... },
//     "step2": { ... }, "step3": { "actor_learning_rate": 9.65e-6, ... }
//   }
//
// Presets (configs/<deployment>/step<N>/<model size>.json, compiled into the binary) give the
// values of DeepSpeed-Chat's training scripts; a user's --config is merged over the preset (JSON
// merge-patch: objects merge key by key, anything else replaces), then parsed. Unknown keys are
// errors that name the file and suggest the nearest known key.
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/hybrid/lora_fuse_backup.h"
#include "dschat/io/state_dict.h"
#include "dschat/monitor/guardian.h"
#include "dschat/rlhf/math/critic_free.h"
#include "dschat/rlhf/math/ppo_math.h"
#include "dschat/rlhf/config/reward_source_config.h"

namespace dschat {
namespace rlhf {

/// Where the phases' data comes from (shared by the three steps, as DS-Chat's scripts pass the
/// same --data_path/--data_split/--data_output_path to each).
struct DataConfig {
  std::vector<std::string> data_path = {"Dahoas/rm-static"};
  std::string data_split = "2,4,4";
  std::vector<std::string> sft_only_data_path;     // step 1 only
  std::string data_output_path = "/tmp/data_files";  // tokenised cache; "" disables it
  std::string local_jsonfile_dir = "data";         // what "local/jsonfile" reads: <dir>/{train,eval}.json
  /// Mixture training (step 3): unsupervised text files/dirs/hub ids; empty = off. DS-Chat's
  /// --unsupervised_dataset_name + _config_name pair become one path here.
  std::vector<std::string> unsupervised_dataset_name;
  double unsup_coef = 27.8;
};

/// How one trained model is optimised and laid out (the per-model flags of DS-Chat's mains).
struct ModelTrainingConfig {
  double learning_rate = 1e-3;
  double weight_decay = 0.0;
  int zero_stage = 0;
  bool gradient_checkpointing = false;
  std::optional<double> dropout;  // nullopt: keep the checkpoint's config
  int64_t lora_dim = 0;            // 0: LoRA off
  std::string lora_module_name = "decoder.layers.";
  double lora_learning_rate = 5e-4;
};

/// Settings every step shares.
struct CommonStepConfig {
  /// Ours: auto | cpu | cuda | cuda:N (core::resolve_device); the pipeline's top-level "device"
  /// is the default of every step block.
  std::string device = "auto";
  /// `device` resolved for this rank, once per run (resolve_step_devices in step_setup.h: the
  /// app layer does it right after parsing). Unset: step_device resolves `device` itself.
  std::optional<torch::Device> resolved_device;
  /// "dtype": fp16 | bf16 | fp32 (step_dtype_name); on the CPU a preset's fp16/bf16 runs as fp32.
  torch::ScalarType dtype = torch::kHalf;
  bool offload = false;
  uint32_t seed = 1234;
  int64_t num_train_epochs = 1;
  int64_t gradient_accumulation_steps = 1;
  std::string lr_scheduler_type = "cosine";
  int64_t num_warmup_steps = 0;
  bool only_optimize_lora = false;
  bool compute_fp32_loss = false;
  bool add_eot_token = false;
  bool enable_tensorboard = false;
  std::string tensorboard_path;  // "" : <output_dir>/tensorboard
  /// Ours: optimizer steps between resumable checkpoints (0: only at the end of each epoch).
  int64_t checkpoint_interval = 0;
  /// Ours: how many checkpoint tags to keep, newest first (0: all). Older ones are deleted after
  /// a newer one is complete; the one `latest` names is never deleted.
  int64_t keep_checkpoints = 2;
  /// Ours: a finished step keeps its newest checkpoint tag (the one `latest` names), so `dschat
  /// ckpt` and `export-hf` work after a run and training can go on from it; false deletes it too.
  /// Tags a resume found damaged (<tag>.corrupt) stay either way.
  bool keep_last_checkpoint = true;
  /// Ours: the saved model's weights file: "safetensors" (model.safetensors) or "bin"
  /// (pytorch_model.bin, what DeepSpeed-Chat's steps load). A top-level "save_format" is every
  /// step's default.
  io::WeightsFormat save_format = io::WeightsFormat::kSafetensors;
  /// Ours: write checkpoints on a background thread from a host snapshot while training goes on
  /// (false: training waits for each write).
  bool async_checkpoint = true;
  /// Ours: print a progress line every this many optimizer steps (DS-Chat: every step).
  int64_t print_interval = 1;
  /// Ours: the training-health guardian's signals and actions (the "guardian" block,
  /// docs/guardian.md).
  monitor::GuardianConfig guardian;
  /// Ours: a resume whose global batch (rows x GAS x ranks) differs from its checkpoint's:
  /// "exact" refuses it, "allow" goes on from the same sample (another world size with the same
  /// global batch always continues exactly).
  bool elastic_resume_allowed = false;  // the JSON key "elastic_resume": "exact" (false) | "allow" (true)
  /// Ours: write the training-set indices of every trained micro-batch, per rank, to
  /// <dir>_logs/samples.rank<r>.jsonl (kept after the step; src/rlhf/setup/sample_log.h).
  bool log_sample_ids = false;
};

struct SftConfig {
  std::string model_name_or_path;  // required
  DataConfig data;
  CommonStepConfig common;
  ModelTrainingConfig model;  // learning_rate 1e-3
  int64_t per_device_train_batch_size = 16;
  int64_t per_device_eval_batch_size = 16;
  int64_t max_seq_len = 512;
  std::string eot_token = "<|endoftext|>";
  bool print_loss = false;
  /// Ours: the loss counts only the answer tokens (DS-Chat counts prompt and answer).
  bool answer_only_loss = false;
  std::string output_dir;  // "" : nothing saved
};

struct RewardConfig {
  std::string model_name_or_path;  // required (the SFT output in `dschat train`, or a base model)
  DataConfig data;
  CommonStepConfig common;
  ModelTrainingConfig model;  // learning_rate 5e-5
  int64_t per_device_train_batch_size = 16;
  int64_t per_device_eval_batch_size = 16;
  int64_t max_seq_len = 512;
  /// DS-Chat's --num_padding_at_beginning (1 for OPT). nullopt: computed from the tokenizer
  /// (1 when it prepends a BOS that equals its pad token, else 0).
  std::optional<int64_t> num_padding_at_beginning;
  int64_t eval_interval = 0;  // > 0: evaluate every N optimizer steps
  int64_t eval_iters = 100;   // at most this many eval batches per evaluation
  std::string output_dir;
};

/// DeepSpeed-Chat's step2_dpo_finetuning: the SFT model trained on the phase-2 pairs against a
/// frozen copy of itself (dpo_trainer.h). Defaults as its main.py's flags.
struct DpoConfig {
  std::string model_name_or_path;  // required (the SFT output in `dschat train --pipeline sft-dpo`)
  DataConfig data;
  CommonStepConfig common;
  ModelTrainingConfig model;  // learning_rate 1e-3 (main.py's default)
  int64_t per_device_train_batch_size = 16;
  int64_t per_device_eval_batch_size = 16;
  int64_t max_seq_len = 512;
  double beta = 0.1;             // --beta: the temperature of the implicit reward
  double label_smoothing = 0.0;  // --label_smoothing: conservative DPO's ε, in [0, 0.5]
  bool offload_reference_model = false;
  int64_t eval_interval = 0;  // > 0: evaluate every N optimizer steps (ours)
  int64_t eval_iters = 100;   // at most this many eval batches per evaluation (ours)
  std::string output_dir;
};

/// How experience answers are decoded. DS-Chat passes no sampling arguments, so an OPT actor
/// decodes greedily; these are ours and default to that.
struct ExperienceSampling {
  bool do_sample = false;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
};

/// Step 3's check of the reward model before PPO starts (reward_gate.h): the diagnostics of
/// reward_diagnostics.h on step 2's eval split, against these limits ("reward_gate": {...}).
/// What the reward gate does with a failing reward model: refuse (core::ConfigError), warn (log
/// and train) or off (not run).
enum class GateAction { kRefuse, kWarn, kOff };
/// The JSON name: refuse | warn | off.
const char* gate_action_name(GateAction action);

struct RewardGateConfig {
  GateAction action = GateAction::kRefuse;
  double min_accuracy = 0.55;         // accuracy below this fails
  double max_length_bias = 0.5;       // Pearson r(score, answer tokens) above this fails
  double max_padding_win_rate = 0.5;  // share of pairs that filler padding scores higher, above this fails
  int64_t max_pairs = 0;              // pairs evaluated (the split's first ones); 0: all
};

/// What every policy-optimisation step shares (PPO and the critic-free step, under the same keys):
/// the actor and its training, the prompts, the batch sizes and passes, the sequence lengths, the
/// actor's hybrid engine, the reference's offload, the EMA, sampling and answer printing. The
/// model builders (rlhf_models.h) and the experience sampler read only these.
struct PolicyStepConfig {
  std::string actor_model_name_or_path;  // required (step 1's output)
  DataConfig data;                       // the prompts: phase 3 of the data split
  CommonStepConfig common;
  ModelTrainingConfig actor;
  int64_t per_device_generation_batch_size = 16;  // prompts per rank and prompt batch
  int64_t per_device_training_batch_size = 16;    // rows per training micro-batch
  int64_t ppo_epochs = 1;  // passes over each step's experience (TRL's num_iterations)
  int64_t max_prompt_seq_len = 256;
  int64_t max_answer_seq_len = 256;
  // hybrid_engine block of the actor's DeepSpeed config
  bool enable_hybrid_engine = false;
  bool unpin_actor_parameters = false;
  bool release_inference_cache = false;
  int64_t inference_tp_size = 1;
  int64_t tp_gather_partition_size = 8;
  /// Ours: the hybrid engine's decode step as a CUDA graph (engine::HybridEngineConfig); off
  /// until measured on a GPU for this step (docs/config.md).
  bool enable_cuda_graph = false;
  /// Ours: generate experience through the ContinuousEngine (paged KV cache, iteration-level
  /// batching) with this pool and rows per step (engine::HybridEngineConfig).
  bool continuous_batching = false;
  int64_t kv_cache_memory_mib = 0;
  int64_t max_running_sequences = 8;
  bool prefix_caching = false;
  bool offload_reference_model = false;
  bool enable_ema = false;
  /// Ours: where fusing LoRA for generation keeps the unfused weights: auto | device | host
  /// (hybrid::HybridEngineOptions::lora_fuse_backup).
  hybrid::LoraFuseBackup lora_fuse_backup = hybrid::LoraFuseBackup::kAuto;
  ExperienceSampling sampling;  // "experience_sampling": {...}
  bool print_answers = false;
  int64_t print_answers_interval = 1;
  std::string output_dir;
};

/// Step 3 (ppo_trainer.h): the policy keys (actor learning_rate 9.65e-6, common
/// num_warmup_steps 100) and the critic's, the reward model's and PPO's own.
struct PpoConfig : PolicyStepConfig {
  std::string critic_model_name_or_path;  // required (step-2 output)
  ModelTrainingConfig critic;  // learning_rate 5e-6
  int64_t num_padding_at_beginning = 1;  // accepted for compatibility; step 3 does not use it
  int64_t generation_batches = 1;
  bool offload_reward_model = false;
  // ZeRO++ zero_quantized_nontrainable_weights on the actor: its frozen base weights under LoRA
  // stored as int8 ZeRO-3 partitions (needs actor_lora_dim > 0 and actor_zero_stage 3).
  bool enable_mixed_precision_lora = false;
  bool align_overflow = false;
  bool enable_test_mode = false;
  int64_t test_stop_step = 0;
  /// Ours: answers with fewer non-pad tokens are dropped (DS-Chat: 2, i.e. `valid_len <= 1`
  /// dropped; the demo's one-token answers need 1).
  int64_t min_answer_tokens = kMinAnswerTokens;
  PpoConstants constants;      // "kl_ctl", "clip_reward_value", "cliprange", "cliprange_value", "gamma", "lam"
  RewardGateConfig reward_gate;  // "reward_gate": {...}
};

/// The critic-free step's advantage estimator (its JSON names: grpo | rloo | reinforce_pp |
/// reinforce_pp_baseline; REINFORCE++ is OpenRLHF's "reinforce").
enum class AdvantageEstimator { kGrpo, kRloo, kReinforcePp, kReinforcePpBaseline };
/// Where the KL to the reference enters: a per-token loss term ("loss") or a reward penalty ("reward").
enum class KlMode { kLoss, kReward };
/// How a policy loss averages over answer tokens: "token-mean" or "sequence-mean".
enum class LossAggregation { kTokenMean, kSequenceMean };

/// The JSON name of each mode (the inverse of the parser's reading): "grpo", "k3", "token-mean"...
const char* mode_name(AdvantageEstimator mode);
const char* mode_name(KlMode mode);
const char* mode_name(LossAggregation mode);
const char* mode_name(RewardScaling mode);
const char* mode_name(KlEstimator mode);
/// The estimator a JSON name denotes; throws core::ConfigError naming `where` for another name.
AdvantageEstimator advantage_estimator_named(const std::string& name, const std::string& where);

/// The critic-free step (critic_free_trainer.h): GRPO, RLOO or REINFORCE++ over
/// n_samples_per_prompt answers per prompt, scored by `rewards`. Defaults follow the reference
/// implementation of the chosen estimator (TRL's GRPOConfig / RLOOConfig, OpenRLHF's REINFORCE++)
/// where a key is left unset; parse_grpo_config fills them in. The policy keys as PPO's (actor
/// learning_rate 1e-6, TRL's default; answers sampled at temperature 1).
struct GrpoConfig : PolicyStepConfig {
  GrpoConfig() { sampling = ExperienceSampling{true, 1.0, 0, 1.0}; }
  AdvantageEstimator advantage_estimator = AdvantageEstimator::kGrpo;
  int64_t n_samples_per_prompt = 8;              // >= 2: the group every estimator needs
  RewardScaling scale_rewards = RewardScaling::kGroup;  // grpo: none | group | batch (Dr. GRPO: none)
  bool normalize_advantages = false;    // rloo: normalise over the batch (TRL's flag)
  double kl_coef = 0.0;                 // the reference's weight; 0 loads no reference
  KlMode kl_mode = KlMode::kLoss;
  KlEstimator kl_estimator = KlEstimator::kK3;  // k1 | k2 | k3
  double clip_low = 0.2, clip_high = 0.2;  // ratio clip [1 - clip_low, 1 + clip_high] (DAPO: 0.2, 0.28)
  /// token-mean (every answer token of an optimizer step weighs the same, on all ranks) |
  /// sequence-mean (each answer's token mean, then the mean over answers). rloo's loss is per
  /// sequence by definition and takes sequence-mean only.
  LossAggregation loss_aggregation = LossAggregation::kTokenMean;
  /// DAPO's dynamic sampling: groups whose rewards are all equal (no learning signal) are dropped
  /// and more prompt batches are drawn, up to dynamic_sampling_max_batches per step.
  bool dynamic_sampling = false;
  int64_t dynamic_sampling_max_batches = 4;
  std::vector<RewardSourceConfig> rewards;          // required, at least one
};

/// What a pipeline step runs.
enum class StepKind {
  kSft,          // step 1: supervised fine-tuning (SftConfig)
  kRewardModel,  // step 2 of sft-rm-ppo: the reward model (RewardConfig)
  kPpo,          // step 3: PPO (PpoConfig)
  kDpo,          // step 2 of sft-dpo (DpoConfig)
  kCriticFree,   // step 2 of sft-grpo | sft-rloo | sft-reinforce_pp (GrpoConfig)
};
/// Its short name in plans and messages: sft | rm | ppo | dpo | grpo.
const char* step_kind_name(StepKind kind);
/// The step's config block: "step1", "step2", "step3", "step2_dpo" or "step2_grpo".
std::string step_block_name(StepKind kind);

/// `dschat train`: the three steps and where their outputs go (<output_dir>/actor, /reward,
/// /step3/{actor,critic,actor_ema}).
struct PipelineConfig {
  std::string actor_model = "facebook/opt-1.3b";
  std::string reward_model = "facebook/opt-350m";
  std::string deployment = "single_gpu";  // single_gpu | single_node | multi_node
  /// auto | cpu | cuda | cuda:N: the default of every step block's "device".
  std::string device = "auto";
  std::string output_dir = "./output";
  std::string init = "pretrained";  // pretrained | random (build the named shapes, random weights)
  std::string tokenizer;            // "" : the actor model's directory
  /// "sft-rm-ppo" (DeepSpeed-Chat's three steps), "sft-dpo" (step 1, then DPO as step 2), or
  /// "sft-grpo" | "sft-rloo" | "sft-reinforce_pp" (step 1, then the critic-free step as step 2
  /// with that advantage_estimator).
  std::string pipeline = "sft-rm-ppo";
  /// What step 2 runs, parsed from `pipeline` with it (kRewardModel, kDpo or kCriticFree).
  StepKind step2_kind = StepKind::kRewardModel;
  std::vector<int> steps = {1, 2, 3};
  /// End `dschat train` with the demo's held-out table (demo_report.h); configs/demo.json sets it.
  bool demo_report = false;
  /// Seconds a collective (or the rendezvous) may wait for the other ranks before every rank
  /// fails naming the rank that stopped answering (dist::Communicator). DeepSpeed's default is
  /// 30 minutes; a training job wants to learn of a hung rank sooner.
  int64_t collective_timeout_seconds = 300;
  SftConfig step1;
  RewardConfig step2;
  PpoConfig step3;
  DpoConfig step2_dpo;  // step 2 of the sft-dpo pipeline
  GrpoConfig step2_grpo;  // step 2 of the critic-free pipelines

  bool dpo() const { return step2_kind == StepKind::kDpo; }
  bool critic_free() const { return step2_kind == StepKind::kCriticFree; }
  /// What step `step` of this pipeline runs.
  StepKind kind_of(int step) const;
  /// The common keys of step 1, 2 or 3 of this pipeline (step 2 of sft-dpo: step2_dpo's).
  const CommonStepConfig& common_of(int step) const;
  CommonStepConfig& common_of(int step);
  /// Every step block's common keys by block name (step_block_names' order), run or not.
  std::vector<std::pair<std::string, CommonStepConfig*>> blocks();
  /// The model step `step` starts from (step 3: "<actor> + <critic>") and its output directory.
  std::string model_of(int step) const;
  const std::string& output_of(int step) const;
};

/// RFC 7386 merge patch: objects merge key by key (recursively), null deletes, anything else
/// replaces. How --config applies over a preset.
nlohmann::json merge_config(nlohmann::json base, const nlohmann::json& patch);

/// Parses one step's block. `where` names the source in errors ("my.json: step1"). `data` is
/// the already parsed shared data block (a step's own "data" keys merge over it). Throws
/// core::ConfigError for unknown keys (nearest known key suggested), wrong types and values out
/// of range, naming the key.
SftConfig parse_sft_config(const nlohmann::json& json, const std::string& where, const DataConfig& data = {});
RewardConfig parse_reward_config(const nlohmann::json& json, const std::string& where, const DataConfig& data = {});
PpoConfig parse_ppo_config(const nlohmann::json& json, const std::string& where, const DataConfig& data = {});
DpoConfig parse_dpo_config(const nlohmann::json& json, const std::string& where, const DataConfig& data = {});
/// `estimator` (grpo | rloo | reinforce_pp | reinforce_pp_baseline; "" : the block's
/// "advantage_estimator" or grpo) picks the defaults of the keys the block leaves unset.
GrpoConfig parse_grpo_config(const nlohmann::json& json, const std::string& where, const DataConfig& data = {},
                             const std::string& estimator = "");
DataConfig parse_data_config(const nlohmann::json& json, const std::string& where);

/// The step blocks a pipeline file may hold, in order.
/// The name a step's dtype has in a config file: fp16 | bf16 | fp32.
const char* step_dtype_name(torch::ScalarType dtype);

const std::vector<std::string>& step_block_names();  // step1, step2, step3, step2_dpo, step2_grpo

/// The whole file: top-level keys, "data", "step1", "step2", "step3", "step2_dpo", "step2_grpo". Fills the model paths
/// the steps chain through (step1.model <- actor_model, step2.model <- reward_model,
/// step3.actor <- <out>/actor, step3.critic <- <out>/reward, output dirs under output_dir) where
/// the file leaves them empty; step2_dpo starts from step 1's output and writes <out>/dpo.
/// "pipeline": "sft-dpo" runs steps 1 and 2 (step 2 being DPO); step 3 is refused there. The
/// critic-free pipelines likewise, step 2 being step2_grpo (from <out>/actor, writing <out>/grpo).
PipelineConfig parse_pipeline_config(const nlohmann::json& json, const std::string& where);

/// The preset for (deployment, actor size, reward size) as JSON: DS-Chat's e2e_rlhf.py choice of
/// scripts (step 1 and 3 by actor size, step 2 by reward size). Sizes are given as model names
/// ("opt-1.3b", "facebook/opt-13b"). A model without a script of its own (another family, another
/// size) borrows the script of the nearest size within 4x, sized from its --init random preset or
/// its directory's config.json, with LoRA pointed at its family's layers; the description says so.
/// Throws core::ConfigError listing the combinations that exist when nothing fits.
nlohmann::json preset_config(const std::string& deployment, const std::string& actor_model,
                             const std::string& reward_model);

/// The embedded default of `dschat train` with no arguments (configs/demo.json).
nlohmann::json demo_config();

/// The names of every compiled-in preset file ("single_gpu/step1/opt-1.3b.json", ...).
std::vector<std::string> preset_names();

}  // namespace rlhf
}  // namespace dschat
