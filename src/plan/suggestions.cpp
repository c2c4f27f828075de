// suggest_changes: for a step that does not fit, the changes DeepSpeed-Chat's users reach for
// (ZeRO stage, offload, LoRA, gradient checkpointing, a smaller micro-batch with more
// accumulation, the hybrid engine's TP and cache release), each re-planned.
#include <algorithm>
#include <functional>
#include <optional>

#include "dschat/plan/step_plan.h"

namespace dschat {
namespace plan {
namespace {

struct Change {
  std::string what;
  nlohmann::json patch;  // {"<block>": {key: value}}
  std::function<void(rlhf::PipelineConfig&)> apply;
};

struct TrainedSlot {
  std::string prefix;  // "" (steps 1-2, DPO), "actor_", "critic_"
  std::function<rlhf::ModelTrainingConfig&(rlhf::PipelineConfig&)> model;
};

std::vector<TrainedSlot> trained_slots(rlhf::StepKind kind) {
  using C = rlhf::PipelineConfig;
  switch (kind) {
    case rlhf::StepKind::kSft: return {{"", [](C& c) -> rlhf::ModelTrainingConfig& { return c.step1.model; }}};
    case rlhf::StepKind::kRewardModel: return {{"", [](C& c) -> rlhf::ModelTrainingConfig& { return c.step2.model; }}};
    case rlhf::StepKind::kDpo: return {{"", [](C& c) -> rlhf::ModelTrainingConfig& { return c.step2_dpo.model; }}};
    case rlhf::StepKind::kCriticFree:
      return {{"actor_", [](C& c) -> rlhf::ModelTrainingConfig& { return c.step2_grpo.actor; }}};
    case rlhf::StepKind::kPpo: break;
  }
  return {{"actor_", [](C& c) -> rlhf::ModelTrainingConfig& { return c.step3.actor; }},
          {"critic_", [](C& c) -> rlhf::ModelTrainingConfig& { return c.step3.critic; }}};
}

// Whether a step trains a policy on sampled experience (PPO, the critic-free step).
bool policy_step(rlhf::StepKind kind) { return kind == rlhf::StepKind::kPpo || kind == rlhf::StepKind::kCriticFree; }

// The micro-batch key of a step and a reference to it.
int64_t& micro_batch_of(rlhf::PipelineConfig& c, rlhf::StepKind kind) {
  switch (kind) {
    case rlhf::StepKind::kSft: return c.step1.per_device_train_batch_size;
    case rlhf::StepKind::kRewardModel: return c.step2.per_device_train_batch_size;
    case rlhf::StepKind::kDpo: return c.step2_dpo.per_device_train_batch_size;
    case rlhf::StepKind::kCriticFree: return c.step2_grpo.per_device_training_batch_size;
    case rlhf::StepKind::kPpo: break;
  }
  return c.step3.per_device_training_batch_size;
}

std::vector<Change> candidate_changes(const rlhf::PipelineConfig& config, const StepPlan& step, int64_t world) {
  std::vector<Change> changes;
  const std::string& block = step.block;
  const rlhf::StepKind kind = step.kind;
  const int n = step.step;
  rlhf::PipelineConfig probe = config;
  for (const TrainedSlot& slot : trained_slots(kind)) {
    const rlhf::ModelTrainingConfig& m = slot.model(probe);
    for (int stage = m.zero_stage + 1; stage <= 3; ++stage) {
      changes.push_back({block + ": " + slot.prefix + "zero_stage " + std::to_string(m.zero_stage) + " -> " +
                             std::to_string(stage),
                         {{block, {{slot.prefix + "zero_stage", stage}}}},
                         [slot, stage](rlhf::PipelineConfig& c) { slot.model(c).zero_stage = stage; }});
    }
    if (!m.gradient_checkpointing) {
      changes.push_back({block + ": " + slot.prefix + "gradient_checkpointing on",
                         {{block, {{slot.prefix + "gradient_checkpointing", true}}}},
                         [slot](rlhf::PipelineConfig& c) { slot.model(c).gradient_checkpointing = true; }});
    }
    if (m.lora_dim == 0 || !config.common_of(n).only_optimize_lora) {
      const int64_t dim = m.lora_dim > 0 ? m.lora_dim : 128;
      changes.push_back({block + ": " + slot.prefix + "lora_dim " + std::to_string(dim) + " + only_optimize_lora",
                         {{block, {{slot.prefix + "lora_dim", dim}, {"only_optimize_lora", true}}}},
                         [slot, dim, n](rlhf::PipelineConfig& c) {
                           slot.model(c).lora_dim = dim;
                           c.common_of(n).only_optimize_lora = true;
                         }});
    }
  }
  if (!config.common_of(n).offload) {
    changes.push_back({block + ": offload on (ZeRO-Offload: optimizer state on the host)",
                       {{block, {{"offload", true}}}},
                       [n](rlhf::PipelineConfig& c) { c.common_of(n).offload = true; }});
  }
  const std::string micro_key =
      policy_step(kind) ? "per_device_training_batch_size" : "per_device_train_batch_size";
  const int64_t micro = micro_batch_of(probe, kind);
  const int64_t gas = config.common_of(n).gradient_accumulation_steps;
  for (int64_t divisor = 2; micro / divisor >= 1; divisor *= 2) {
    if (micro % divisor != 0) break;
    changes.push_back({block + ": " + micro_key + " " + std::to_string(micro) + " -> " + std::to_string(micro / divisor) +
                           ", gradient_accumulation_steps " + std::to_string(gas) + " -> " +
                           std::to_string(gas * divisor),
                       {{block, {{micro_key, micro / divisor}, {"gradient_accumulation_steps", gas * divisor}}}},
                       [kind, n, micro, gas, divisor](rlhf::PipelineConfig& c) {
                         micro_batch_of(c, kind) = micro / divisor;
                         c.common_of(n).gradient_accumulation_steps = gas * divisor;
                       }});
  }
  if (policy_step(kind)) {
    const bool ppo = kind == rlhf::StepKind::kPpo;
    const bool released = ppo ? config.step3.release_inference_cache : config.step2_grpo.release_inference_cache;
    if (!released) {
      changes.push_back({block + ": release_inference_cache on", {{block, {{"release_inference_cache", true}}}},
                         [ppo](rlhf::PipelineConfig& c) {
                           (ppo ? c.step3.release_inference_cache : c.step2_grpo.release_inference_cache) = true;
                         }});
    }
    const int actor_stage = ppo ? config.step3.actor.zero_stage : config.step2_grpo.actor.zero_stage;
    const int64_t tp = ppo ? config.step3.inference_tp_size : config.step2_grpo.inference_tp_size;
    if (tp != 1) {
      changes.push_back({block + ": inference_tp_size " + std::to_string(tp) + " -> 1",
                         {{block, {{"inference_tp_size", 1}}}}, [ppo](rlhf::PipelineConfig& c) {
                           (ppo ? c.step3.inference_tp_size : c.step2_grpo.inference_tp_size) = 1;
                         }});
    }
    // At stage 3 a TP group holds 1/t of the gathered model: every group size dividing the world.
    for (int64_t size = 2; world > 1 && actor_stage == 3 && size <= world; ++size) {
      if (world % size != 0 || size == tp) continue;
      changes.push_back({block + ": inference_tp_size " + std::to_string(size), {{block, {{"inference_tp_size", size}}}},
                         [ppo, size](rlhf::PipelineConfig& c) {
                           (ppo ? c.step3.inference_tp_size : c.step2_grpo.inference_tp_size) = size;
                         }});
    }
    // The hybrid engine at stage 3 keeps the gathered actor for generation unless unpinned:
    // unpinned, it gathers layer by layer (DeepSpeed-Chat's run_30b_lora.sh on 8 x A100-40G).
    const rlhf::PolicyStepConfig& policy = ppo ? static_cast<const rlhf::PolicyStepConfig&>(config.step3)
                                               : static_cast<const rlhf::PolicyStepConfig&>(config.step2_grpo);
    if (actor_stage == 3 && policy.enable_hybrid_engine && !policy.unpin_actor_parameters) {
      changes.push_back({block + ": unpin_actor_parameters on (generation gathers the actor layer by layer)",
                         {{block, {{"unpin_actor_parameters", true}}}}, [ppo](rlhf::PipelineConfig& c) {
                           (ppo ? c.step3.unpin_actor_parameters : c.step2_grpo.unpin_actor_parameters) = true;
                         }});
    }
    if (actor_stage == 3) {
      changes.push_back({block + ": offload_reference_model on", {{block, {{"offload_reference_model", true}}}},
                         [ppo](rlhf::PipelineConfig& c) {
                           (ppo ? c.step3.offload_reference_model : c.step2_grpo.offload_reference_model) = true;
                         }});
    }
    if (ppo && config.step3.critic.zero_stage == 3) {
      changes.push_back({block + ": offload_reward_model on", {{block, {{"offload_reward_model", true}}}},
                         [](rlhf::PipelineConfig& c) { c.step3.offload_reward_model = true; }});
    }
  }
  return changes;
}

Suggestion evaluate(const rlhf::PipelineConfig& changed, const StepPlan& step, const PlanOptions& options,
                    const std::string& what, const nlohmann::json& patch) {
  const StepPlan planned = plan_step(changed, step.step, options, -1, step.longest_row);
  return {what, patch, planned.peak_bytes, planned.seconds_per_step, planned.fits};
}

// The config with changes `chosen` applied in order.
rlhf::PipelineConfig with_changes(const rlhf::PipelineConfig& config, const std::vector<Change>& changes,
                                  const std::vector<size_t>& chosen) {
  rlhf::PipelineConfig changed = config;
  for (size_t i : chosen) changes[i].apply(changed);
  return changed;
}

// Greedy: add the change that best repairs the step (a config problem such as inference_tp_size
// first, then the lowest peak) until it fits; then drop every change it still fits without, so
// the suggestion names only what is needed.
std::optional<Suggestion> combine_changes(const rlhf::PipelineConfig& config, const StepPlan& step,
                                          const PlanOptions& options, const std::vector<Change>& changes) {
  std::vector<size_t> chosen;
  bool fits = false;
  while (!fits && chosen.size() < changes.size()) {
    int best = -1;
    std::pair<bool, int64_t> best_score{true, INT64_MAX};  // (config problem left, peak)
    for (size_t i = 0; i < changes.size(); ++i) {
      if (std::find(chosen.begin(), chosen.end(), i) != chosen.end()) continue;
      std::vector<size_t> trial = chosen;
      trial.push_back(i);
      const StepPlan planned =
          plan_step(with_changes(config, changes, trial), step.step, options, -1, step.longest_row);
      const std::pair<bool, int64_t> score{!planned.config_problem.empty(), planned.peak_bytes};
      if (score < best_score) {
        best_score = score;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    chosen.push_back(static_cast<size_t>(best));
    fits = plan_step(with_changes(config, changes, chosen), step.step, options, -1, step.longest_row).fits;
  }
  if (!fits) return std::nullopt;
  for (size_t k = chosen.size(); k-- > 0;) {
    std::vector<size_t> without = chosen;
    without.erase(without.begin() + static_cast<std::ptrdiff_t>(k));
    const bool fits_without =
        plan_step(with_changes(config, changes, without), step.step, options, -1, step.longest_row).fits;
    if (fits_without) chosen.erase(chosen.begin() + static_cast<std::ptrdiff_t>(k));
  }
  std::string what;
  nlohmann::json patch = nlohmann::json::object();
  for (size_t i : chosen) {
    what += (what.empty() ? "" : " + ") + changes[i].what;
    patch.merge_patch(changes[i].patch);
  }
  return evaluate(with_changes(config, changes, chosen), step, options, what, patch);
}

}  // namespace

std::vector<Suggestion> suggest_changes(const rlhf::PipelineConfig& config, const PipelinePlan& plan) {
  std::vector<Suggestion> out;
  const int64_t world = plan.options.hardware.world_size();
  for (const StepPlan& step : plan.steps) {
    if (step.fits) continue;
    const std::vector<Change> changes = candidate_changes(config, step, world);
    std::vector<Suggestion> fitting;
    for (const Change& change : changes) {
      rlhf::PipelineConfig changed = config;
      change.apply(changed);
      Suggestion s = evaluate(changed, step, plan.options, change.what, change.patch);
      if (s.fits) fitting.push_back(std::move(s));
    }
    if (fitting.empty()) {
      // No single change is enough: combine them, then drop what the combination does not need.
      std::optional<Suggestion> combined = combine_changes(config, step, plan.options, changes);
      if (combined) fitting.push_back(std::move(*combined));
    }
    std::stable_sort(fitting.begin(), fitting.end(),
                     [](const Suggestion& a, const Suggestion& b) { return a.seconds_per_step < b.seconds_per_step; });
    if (fitting.size() > 6) fitting.resize(6);
    out.insert(out.end(), fitting.begin(), fitting.end());
  }
  return out;
}

}  // namespace plan
}  // namespace dschat
