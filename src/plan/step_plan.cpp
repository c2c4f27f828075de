// plan_step / plan_pipeline: which models each step holds and in which phases (docs/plan.md).
#include "dschat/plan/step_plan.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <sstream>

#include "dschat/core/error.h"
#include "dschat/core/host_memory.h"
#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/tensor_parallel.h"
#include "dschat/io/model_source.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "plan/dataset_rows.h"
#include "plan/step_time.h"

namespace dschat {
namespace plan {
namespace {

constexpr double kPlanGiB = 1024.0 * 1024.0 * 1024.0;

// The shape of the first of `names` that resolves (config.json of a directory or cached HF id,
// else a preset): a step's input that an earlier step writes falls back to what that step starts
// from.
// `source` receives the name that resolved.
core::ModelConfig shape_of(const std::vector<std::string>& names, const std::string& where,
                           std::string* source = nullptr) {
  for (const std::string& name : names) {
    if (name.empty()) continue;
    if (source) *source = name;
    try {
      return core::load_model_config(io::resolve_model_dir(name).string());
    } catch (const core::NotFound&) {
    }
    if (auto preset = core::model_preset(name)) return *preset;
  }
  std::string presets, tried;
  for (const std::string& p : core::model_preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  for (const std::string& n : names) tried += (tried.empty() ? "'" : ", '") + n + "'";
  DSCHAT_THROW(NotFound, where, ": no shape for model ", tried,
               ": not a directory with config.json, not in the Hugging Face cache, and not a preset (", presets, ")");
}

ModelSetup trained_setup(const std::string& role, const std::string& source, const core::ModelConfig& shape,
                         bool value_head, const rlhf::CommonStepConfig& common, const rlhf::ModelTrainingConfig& model) {
  ModelSetup s;
  s.role = role;
  s.source = source;
  s.config = shape;
  s.value_head = value_head;
  s.dtype = common.dtype;
  s.trained = true;
  s.zero_stage = model.zero_stage;
  s.offload = common.offload;
  s.lora_dim = model.lora_dim;
  s.lora_module_name = model.lora_module_name;
  s.only_optimize_lora = common.only_optimize_lora;
  s.gradient_checkpointing = model.gradient_checkpointing;
  if (model.dropout) s.config.dropout = s.config.attention_dropout = s.config.activation_dropout = *model.dropout;
  return s;
}

// A frozen model of a step whose trained model is at `trained_stage`: ZeRO-3 (DS-Chat's eval
// config) when it is 3, else replicated.
ModelSetup frozen_setup(const std::string& role, const std::string& source, const core::ModelConfig& shape,
                        bool value_head, torch::ScalarType dtype, int trained_stage, bool offload) {
  ModelSetup s;
  s.role = role;
  s.source = source;
  s.config = shape;
  s.value_head = value_head;
  s.dtype = dtype;
  s.zero_stage = trained_stage == 3 ? 3 : 0;
  s.offload = offload && s.zero_stage == 3;
  return s;
}

struct PlannedModel {
  ModelSetup setup;
  std::vector<engine::ParameterSpec> specs;
};

class StepBuilder {
 public:
  StepBuilder(StepPlan& plan, const PlanOptions& options) : plan_(plan), options_(options) {}

  const PlannedModel& add(ModelSetup setup) {
    PlannedModel m{std::move(setup), {}};
    m.setup.cpu_ranks = options_.hardware.cpu;
    m.specs = parameter_specs(m.setup);
    const core::ModelConfig& c = m.setup.config;
    ModelSummary summary;
    summary.role = m.setup.role;
    summary.shape = std::to_string(c.num_hidden_layers) + " layers, hidden " + std::to_string(c.hidden_size) +
                    ", vocab " + std::to_string(c.vocab_size);
    summary.parameters = total_parameters(m.specs);
    summary.trainable = trainable_parameters(m.specs);
    summary.zero_stage = m.setup.zero_stage;
    summary.source = m.setup.source;
    summary.dtype = m.setup.dtype;
    summary.trained = m.setup.trained;
    summary.offload = m.setup.offload;
    summary.lora_dim = m.setup.lora_dim;
    summary.gradient_checkpointing = m.setup.gradient_checkpointing;
    plan_.models.push_back(std::move(summary));
    append(resident_state(m.setup, m.specs, world(), 0));
    if (m.setup.trained && m.setup.offload && !options_.hardware.cpu) {
      // ZeRO-Offload's step: Adam over the owned fp32 state on the host (~16 bytes read and
      // written per parameter at ~20 GB/s) and the gradients down, the values up over PCIe.
      const double owned = static_cast<double>(trainable_parameters(m.specs)) / static_cast<double>(world());
      const double element = static_cast<double>(c10::elementSize(m.setup.dtype));
      offload_seconds_ += owned * (32.0 / 20e9 + 2.0 * element / 25e9);
    }
    models_.push_back(std::move(m));
    return models_.back();
  }
  void append(const std::vector<MemoryItem>& items) { plan_.items.insert(plan_.items.end(), items.begin(), items.end()); }
  void add_item(MemoryItem item) { plan_.items.push_back(std::move(item)); }
  int64_t world() const { return options_.hardware.world_size(); }
  TimeContext time() const {
    return {options_.hardware, options_.efficiency ? *options_.efficiency : default_efficiency(options_.hardware.cpu)};
  }

 private:
  StepPlan& plan_;
  const PlanOptions& options_;
  std::deque<PlannedModel> models_;  // references handed out stay valid
  double offload_seconds_ = 0;

 public:
  double offload_seconds_per_step() const { return offload_seconds_; }
};

// Generation with the hybrid engine (or the plain actor): KV workspace (or the continuous
// engine's block pool), ZeRO-3's gathered model, the TP shard copy, the LoRA fuse backup.
void add_generation(StepBuilder& b, const PlannedModel& actor, int64_t rows, int64_t max_out_tokens,
                    const rlhf::PolicyStepConfig& policy) {
  const ModelSetup& s = actor.setup;
  const int64_t tp = policy.inference_tp_size, tp_group_layers = policy.tp_gather_partition_size;
  const bool hybrid_engine = policy.enable_hybrid_engine, pin = !policy.unpin_actor_parameters;
  const char* when = policy.release_inference_cache ? "generate" : "";
  int64_t decode_rows = rows * std::max<int64_t>(tp, 1);
  if (policy.continuous_batching) {
    // HybridEngine::generate_continuous's pool, sized by the same rule over the rank's shard (its
    // key/value heads) when tp > 1; the static workspace is never taken. A TP group decodes its
    // joint batch, at most max_running_sequences rows at a time.
    inference::ContinuousEngineOptions pool;
    pool.size_pool(policy.kv_cache_memory_mib << 20, policy.max_running_sequences, max_out_tokens);
    const core::ModelConfig shard = tp > 1 ? inference::tensor_parallel_shard_config(s.config, tp) : s.config;
    const int64_t bytes = pool.pool_blocks(shard, s.dtype) *
                          inference::KvBlockPool::bytes_per_block(shard, pool.block_size, s.dtype);
    b.add_item({s.role, "KV block pool [L, 2, N, 16, H_kv, D] (continuous_batching)", when, bytes, 0});
    decode_rows = std::min(decode_rows, policy.max_running_sequences);
  } else {
    const int64_t kv = kv_workspace_bytes(s.config, s.dtype, decode_rows, max_out_tokens);
    b.add_item({s.role, "KV workspace [L, 2, B, H_kv, max_out_tokens, D]", when, kv, 0});
  }
  const int64_t full = model_bytes(actor.specs);
  if (s.zero_stage == 3) {
    if (tp > 1) {
      b.add_item({s.role, "TP shard copy (1/tp of the model)", "generate", full / tp, 0});
      b.add_item({s.role, "gathered layer group (tp_gather_partition_size layers)", "generate",
                  std::min<int64_t>(tp_group_layers, s.config.num_hidden_layers) * layer_bytes(actor.specs), 0});
    } else if (hybrid_engine && pin) {
      b.add_item({s.role, "the whole model gathered for generation (pin_parameters)", "generate", full, 0});
    } else {
      b.add_item({s.role, "gathered layers during decode", "generate", 2 * layer_bytes(actor.specs), 0});
    }
  } else if (tp > 1) {
    b.add_item({s.role, "TP shard (views at ZeRO 0-2)", "generate", 0, 0});
  }
  if (s.lora_dim > 0) {
    const int64_t backup = lora_wrapped_bytes(actor.specs) / (s.zero_stage == 3 ? std::max<int64_t>(s.config.num_hidden_layers, 1) : 1);
    const bool host = policy.lora_fuse_backup == hybrid::LoraFuseBackup::kHost;
    MemoryItem item{s.role, "LoRA fuse backup of the wrapped weights", "generate", host ? 0 : backup, host ? backup : 0};
    item.host_when_short = policy.lora_fuse_backup == hybrid::LoraFuseBackup::kAuto && s.zero_stage != 3;
    b.add_item(item);
  }
  // Decode logits [rows, V] fp32 and the sampling buffers.
  b.add_item({s.role, "decode logits [B, V]", "generate", decode_rows * s.config.vocab_size * 12, 0});
}

// The hybrid engine generates in tensor-parallel groups of inference_tp_size consecutive ranks.
void check_tp(StepPlan& plan, int64_t tp, int64_t world) {
  if (tp >= 1 && world % tp == 0) return;
  plan.config_problem = "inference_tp_size " + std::to_string(tp) + " does not divide the world size " +
                        std::to_string(world) + " (the hybrid engine refuses it)";
}

// The max_seq_len of a step that pads its rows to the batch's longest (0: one that does not).
int64_t supervised_max_seq_len(const rlhf::PipelineConfig& c, int step) {
  switch (c.kind_of(step)) {
    case rlhf::StepKind::kSft: return c.step1.max_seq_len;
    case rlhf::StepKind::kRewardModel: return c.step2.max_seq_len;
    case rlhf::StepKind::kDpo: return c.step2_dpo.max_seq_len;
    default: return 0;
  }
}

// The tokens a supervised pass is padded to: the longest row when the data was read.
int64_t padded_tokens(StepPlan& plan, int64_t max_seq_len, int64_t longest_row) {
  if (longest_row <= 0 || longest_row >= max_seq_len) return max_seq_len;
  plan.steps_note += "; rows padded to at most " + std::to_string(longest_row) + " tokens (the data's longest; max_seq_len " +
                     std::to_string(max_seq_len) + ")";
  return longest_row;
}

void plan_supervised(StepBuilder& b, StepPlan& plan, const rlhf::PipelineConfig& c, int step, int64_t rows,
                     int64_t longest_row) {
  const bool sft = plan.kind == rlhf::StepKind::kSft;
  const rlhf::CommonStepConfig& common = c.common_of(step);
  const auto& model = sft ? c.step1.model : c.step2.model;
  std::string source;
  const core::ModelConfig shape =
      sft ? shape_of({c.step1.model_name_or_path}, "step1", &source)
          : shape_of({c.step2.model_name_or_path, c.step1.model_name_or_path}, "step2", &source);
  const int64_t batch = sft ? c.step1.per_device_train_batch_size : c.step2.per_device_train_batch_size;
  const int64_t eval_batch = sft ? c.step1.per_device_eval_batch_size : c.step2.per_device_eval_batch_size;
  const int64_t seq = padded_tokens(plan, sft ? c.step1.max_seq_len : c.step2.max_seq_len, longest_row);
  const int64_t rows_per_pass = sft ? 1 : 2;  // the reward model scores chosen and rejected together
  const PlannedModel& m = b.add(trained_setup(sft ? "model" : "reward model", source, shape, !sft, common, model));
  b.append(training_pass(m.setup, m.specs, {batch * rows_per_pass, seq}, b.world(), common.gradient_accumulation_steps,
                         "train"));
  b.append(inference_pass(m.setup, m.specs, {eval_batch * rows_per_pass, seq}, "evaluate"));
  apply_time(plan, supervised_time(m.setup, {batch * rows_per_pass, seq}, common, rows, batch, 0.0, b.time()));
}

void plan_dpo(StepBuilder& b, StepPlan& plan, const rlhf::PipelineConfig& c, int64_t rows, int64_t longest_row) {
  const rlhf::DpoConfig& d = c.step2_dpo;
  std::string source;
  const core::ModelConfig shape = shape_of({d.model_name_or_path, c.step1.model_name_or_path}, "step2_dpo", &source);
  const PlannedModel& policy = b.add(trained_setup("policy", source, shape, false, d.common, d.model));
  const PlannedModel& reference = b.add(frozen_setup("reference", source, shape, false, policy.setup.dtype,
                                                     d.model.zero_stage, d.offload_reference_model));
  const PassShape pass{2 * d.per_device_train_batch_size, padded_tokens(plan, d.max_seq_len, longest_row)};
  b.append(inference_pass(reference.setup, reference.specs, pass, "reference log-probs"));
  b.append(training_pass(policy.setup, policy.specs, pass, b.world(), d.common.gradient_accumulation_steps, "train"));
  apply_time(plan, supervised_time(policy.setup, pass, d.common, rows, d.per_device_train_batch_size,
                                   forward_flops(reference.setup, pass), b.time()));
}

void plan_ppo(StepBuilder& b, StepPlan& plan, const rlhf::PipelineConfig& c, int64_t rows) {
  const rlhf::PpoConfig& p = c.step3;
  std::string actor_source, critic_source;
  const core::ModelConfig actor_shape =
      shape_of({p.actor_model_name_or_path, c.step1.model_name_or_path}, "step3", &actor_source);
  const core::ModelConfig critic_shape = shape_of(
      {p.critic_model_name_or_path, c.step2.model_name_or_path, c.reward_model, c.step1.model_name_or_path}, "step3",
      &critic_source);
  ModelSetup actor_setup = trained_setup("actor", actor_source, actor_shape, false, p.common, p.actor);
  actor_setup.quantize_frozen = p.enable_mixed_precision_lora && p.actor.zero_stage == 3;
  const PlannedModel& actor = b.add(actor_setup);
  const torch::ScalarType dtype = actor.setup.dtype;
  const PlannedModel& reference =
      b.add(frozen_setup("reference", actor_source, actor_shape, false, dtype, p.actor.zero_stage,
                         p.offload_reference_model));
  if (p.enable_ema) {  // resident only (updated after each step, never run); partitioned at ZeRO-3
    ModelSetup e = frozen_setup("ema", actor_source, actor_shape, false, dtype, p.actor.zero_stage,
                                p.offload_reference_model);
    e.lora_dim = p.actor.lora_dim;
    e.lora_module_name = p.actor.lora_module_name;
    b.add(e);
  }
  const PlannedModel& critic = b.add(trained_setup("critic", critic_source, critic_shape, true, p.common, p.critic));
  const PlannedModel& reward = b.add(
      frozen_setup("reward", critic_source, critic_shape, true, dtype, p.critic.zero_stage, p.offload_reward_model));
  const int64_t rows_per_batch = p.per_device_generation_batch_size;
  check_tp(plan, p.inference_tp_size, b.world());
  const int64_t max_out = p.max_prompt_seq_len + p.max_answer_seq_len;
  add_generation(b, actor, rows_per_batch, max_out, p);
  const PassShape full{rows_per_batch, max_out};
  b.append(inference_pass(actor.setup, actor.specs, full, "experience: actor"));
  b.append(inference_pass(reference.setup, reference.specs, full, "experience: reference"));
  b.append(inference_pass(critic.setup, critic.specs, full, "experience: critic"));
  b.append(inference_pass(reward.setup, reward.specs, full, "experience: reward"));
  const PassShape train{p.per_device_training_batch_size, max_out};
  const int64_t gas = p.common.gradient_accumulation_steps;
  b.append(training_pass(actor.setup, actor.specs, train, b.world(), gas, "train actor"));
  b.append(training_pass(critic.setup, critic.specs, train, b.world(), gas, "train critic"));
  RlShape shape{rows_per_batch, p.max_prompt_seq_len, p.max_answer_seq_len, p.per_device_training_batch_size,
                p.ppo_epochs, p.inference_tp_size, p.common.num_train_epochs};
  apply_time(plan, rl_time(actor.setup, actor.specs, {&reference.setup, &critic.setup, &reward.setup},
                           {&critic.setup}, shape, rows, b.time()));
  // DeepSpeed-Chat's test mode ends step 3 after test_stop_step steps.
  if (p.enable_test_mode && p.test_stop_step > 0 && plan.steps > p.test_stop_step) {
    plan.steps = p.test_stop_step;
    plan.total_seconds = static_cast<double>(plan.steps) * plan.seconds_per_step;
    plan.steps_note += "; enable_test_mode stops it after test_stop_step " + std::to_string(p.test_stop_step);
  }
}

void plan_grpo(StepBuilder& b, StepPlan& plan, const rlhf::PipelineConfig& c, int64_t rows) {
  const rlhf::GrpoConfig& g = c.step2_grpo;
  std::string actor_source;
  const core::ModelConfig shape =
      shape_of({g.actor_model_name_or_path, c.step1.model_name_or_path}, "step2_grpo", &actor_source);
  const PlannedModel& actor = b.add(trained_setup("actor", actor_source, shape, false, g.common, g.actor));
  const torch::ScalarType dtype = actor.setup.dtype;
  std::vector<const PlannedModel*> scorers;  // the builder keeps them
  if (g.kl_coef != 0.0) {
    scorers.push_back(&b.add(
        frozen_setup("reference", actor_source, shape, false, dtype, g.actor.zero_stage, g.offload_reference_model)));
  }
  if (g.enable_ema) {  // resident only; partitioned (and offloaded with the reference) at ZeRO-3
    ModelSetup e = frozen_setup("ema", actor_source, shape, false, dtype, g.actor.zero_stage, g.offload_reference_model);
    e.lora_dim = g.actor.lora_dim;
    e.lora_module_name = g.actor.lora_module_name;
    b.add(e);
  }
  for (const rlhf::RewardSourceConfig& source : g.rewards) {
    if (source.type != rlhf::RewardSourceType::kRewardModel) continue;
    std::string rm_source;
    const core::ModelConfig rm = shape_of({source.model, c.reward_model}, "step2_grpo: rewards", &rm_source);
    scorers.push_back(
        &b.add(frozen_setup("reward " + source.name, rm_source, rm, true, dtype, g.actor.zero_stage, false)));
  }
  const int64_t rows_per_batch = g.per_device_generation_batch_size * g.n_samples_per_prompt;
  check_tp(plan, g.inference_tp_size, b.world());
  const int64_t max_out = g.max_prompt_seq_len + g.max_answer_seq_len;
  add_generation(b, actor, rows_per_batch, max_out, g);
  const PassShape full{g.per_device_training_batch_size, max_out};
  b.append(inference_pass(actor.setup, actor.specs, full, "experience: actor"));
  std::vector<const ModelSetup*> scorer_setups;
  for (const PlannedModel* scorer : scorers) {
    b.append(inference_pass(scorer->setup, scorer->specs, full, "experience: " + scorer->setup.role));
    scorer_setups.push_back(&scorer->setup);
  }
  b.append(training_pass(actor.setup, actor.specs, full, b.world(), g.common.gradient_accumulation_steps, "train actor"));
  RlShape rl{rows_per_batch, g.max_prompt_seq_len, g.max_answer_seq_len, g.per_device_training_batch_size,
             g.ppo_epochs, g.inference_tp_size, g.common.num_train_epochs};
  apply_time(plan, rl_time(actor.setup, actor.specs, scorer_setups, {}, rl, rows, b.time(), g.n_samples_per_prompt));
}

// lora_fuse_backup "auto" keeps the backups on the device only when the memory still free as
// generation starts (everything resident, nothing of the phase yet) holds them twice over.
void place_auto_backups(std::vector<MemoryItem>& items, int64_t device_total_bytes) {
  int64_t resident = 0;
  for (const MemoryItem& item : items) {
    if (item.phase.empty()) resident += item.device_bytes;
  }
  for (MemoryItem& item : items) {
    if (!item.host_when_short || device_total_bytes - resident >= 2 * item.device_bytes) continue;
    item.host_bytes += item.device_bytes;
    item.device_bytes = 0;
    item.what += " (auto: on the host)";
  }
}

void settle(StepPlan& plan, const PlanOptions& options) {
  const Hardware& hw = options.hardware;
  const double reserved = options.reserved_gib >= 0 ? options.reserved_gib : hw.cpu ? 0.6 : 1.0;
  plan.usable_bytes = static_cast<int64_t>((hw.device.memory_gib * (1.0 - options.margin) - reserved) * kPlanGiB);
  plan.host_usable_bytes =
      static_cast<int64_t>(hw.host_memory_gib * (1.0 - options.margin) * kPlanGiB / static_cast<double>(hw.gpus_per_node));
  if (!hw.cpu) place_auto_backups(plan.items, static_cast<int64_t>(hw.device.memory_gib * kPlanGiB));
  std::map<std::string, int64_t> phases;
  for (const MemoryItem& item : plan.items) {
    const int64_t device = item.device_bytes + (hw.cpu ? item.host_bytes : 0);
    if (item.phase.empty()) {
      plan.resident_bytes += device;
    } else {
      phases[item.phase] += device;
    }
    plan.host_bytes += item.host_bytes;
  }
  int64_t largest = 0;
  for (const auto& [phase, bytes] : phases) {
    if (bytes > largest || plan.peak_phase.empty()) {
      largest = bytes;
      plan.peak_phase = phase;
    }
  }
  plan.peak_bytes = plan.resident_bytes + largest;
  if (hw.cpu && options.host_block_cache) {
    const int64_t kept = plan.peak_bytes / core::HostBlockCache::kSlackDivisor;
    plan.items.push_back({"process", "host block cache: free blocks kept for reuse (1/8 of the live peak)", "", kept, 0});
    plan.resident_bytes += kept;
    plan.peak_bytes += kept;
  }
  for (ModelSummary& model : plan.models) {
    for (const MemoryItem& item : plan.items) {
      if (item.model != model.role || !item.phase.empty()) continue;
      model.resident_device_bytes += item.device_bytes;
      model.resident_host_bytes += item.host_bytes;
    }
  }
  std::ostringstream why;
  why.precision(3);
  if (plan.peak_bytes > plan.usable_bytes) {
    why << "peak " << plan.peak_bytes / kPlanGiB << " GiB (in " << plan.peak_phase << ") > " << plan.usable_bytes / kPlanGiB
        << " GiB usable per " << (hw.cpu ? "process" : "GPU");
  } else if (!hw.cpu && plan.host_bytes > plan.host_usable_bytes) {
    why << "offloaded state " << plan.host_bytes / kPlanGiB << " GiB per rank > " << plan.host_usable_bytes / kPlanGiB
        << " GiB of host memory per rank";
  }
  plan.why_not = plan.config_problem.empty() ? why.str() : plan.config_problem;
  plan.fits = plan.why_not.empty();
}

}  // namespace

StepPlan plan_step(const rlhf::PipelineConfig& config, int step, const PlanOptions& options, int64_t rows,
                   int64_t longest_row) {
  StepPlan plan;
  plan.step = step;
  plan.longest_row = longest_row;
  plan.kind = config.kind_of(step);
  plan.block = rlhf::step_block_name(plan.kind);
  plan.steps_note = rows < 0 ? "data not counted" : std::to_string(rows) + " rows in the phase";
  StepBuilder builder(plan, options);
  switch (plan.kind) {
    case rlhf::StepKind::kSft:
    case rlhf::StepKind::kRewardModel: plan_supervised(builder, plan, config, step, rows, longest_row); break;
    case rlhf::StepKind::kDpo: plan_dpo(builder, plan, config, rows, longest_row); break;
    case rlhf::StepKind::kPpo: plan_ppo(builder, plan, config, rows); break;
    case rlhf::StepKind::kCriticFree: plan_grpo(builder, plan, config, rows); break;
  }
  // Offloaded optimizer steps: one per optimizer step (RL: per generation batch and ppo epoch).
  const double offload = builder.offload_seconds_per_step();
  plan.seconds_per_step += offload;
  if (plan.total_seconds >= 0) plan.total_seconds += offload * static_cast<double>(plan.steps);
  settle(plan, options);
  return plan;
}

PipelinePlan plan_pipeline(const rlhf::PipelineConfig& config, const PlanOptions& options) {
  PipelinePlan plan;
  plan.options = options;
  if (!plan.options.efficiency) plan.options.efficiency = default_efficiency(options.hardware.cpu);
  for (int step : config.steps) {
    const int64_t rows = options.dataset_rows >= 0 ? split_phase_rows(config, step, options.dataset_rows)
                         : options.count_rows    ? count_phase_rows(config, step)
                                                 : -1;
    // The data's longest row, when the data is here to be read (not with --dataset-rows).
    const int64_t max_seq_len = supervised_max_seq_len(config, step);
    const int64_t longest = options.count_rows && options.dataset_rows < 0 && max_seq_len > 0
                                ? longest_row_tokens(config, step, max_seq_len)
                                : -1;
    plan.steps.push_back(plan_step(config, step, plan.options, rows, longest));
  }
  plan.suggestions = suggest_changes(config, plan);
  return plan;
}

bool PipelinePlan::fits() const {
  return std::all_of(steps.begin(), steps.end(), [](const StepPlan& s) { return s.fits; });
}

double PipelinePlan::total_seconds() const {
  double total = 0;
  for (const StepPlan& s : steps) {
    if (s.total_seconds < 0) return -1;
    total += s.total_seconds;
  }
  return total;
}

}  // namespace plan
}  // namespace dschat
