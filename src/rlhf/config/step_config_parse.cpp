// The per-step blocks of a pipeline config ("step1", "step2", "step3") and the data block. Every
// key is DeepSpeed-Chat's argparse name; defaults are set before reading, so an empty block gives
// DS-Chat's CLI defaults (docs/config.md lists every key and where we differ).
#include "dschat/rlhf/config/pipeline_config.h"

#include <limits>

#include "core/json_object.h"
#include "rlhf/config/config_read.h"
#include "core/strings.h"
#include "dschat/core/device.h"
#include "dschat/core/error.h"
#include "dschat/data/split.h"
#include "dschat/engine/lr_schedule.h"

namespace dschat {
namespace rlhf {

const char* gate_action_name(GateAction action) {
  switch (action) {
    case GateAction::kRefuse: return "refuse";
    case GateAction::kWarn: return "warn";
    case GateAction::kOff: return "off";
  }
  return "?";
}
namespace {

using core::JsonObject;
using namespace config_read;

// The keys of steps 1, 2 and DPO alike: the model to start from, data, the common and model keys,
// batch sizes and max_seq_len.
template <typename Config>
void read_supervised_keys(JsonObject& o, Config& c, const DataConfig& data) {
  accept_description(o);
  c.model_name_or_path = o.get<std::string>("model_name_or_path", c.model_name_or_path);
  c.data = read_step_data(o, data);
  read_common(o, c.common);
  read_model(o, "", c.model);
  c.per_device_train_batch_size = read_min(o, "per_device_train_batch_size", c.per_device_train_batch_size, 1);
  c.per_device_eval_batch_size = read_min(o, "per_device_eval_batch_size", c.per_device_eval_batch_size, 1);
  c.max_seq_len = read_min(o, "max_seq_len", c.max_seq_len, 1);
}

}  // namespace

DataConfig parse_data_config(const nlohmann::json& json, const std::string& where) {
  JsonObject o(object_or_empty(json), where);
  DataConfig data;
  read_data_keys(o, data);
  o.finish();
  return data;
}

SftConfig parse_sft_config(const nlohmann::json& json, const std::string& where, const DataConfig& data) {
  JsonObject o(object_or_empty(json), where);
  SftConfig c;
  c.model.learning_rate = 1e-3;  // step 1's --learning_rate default
  read_supervised_keys(o, c, data);
  c.eot_token = o.get<std::string>("eot_token", c.eot_token);
  c.print_loss = o.get<bool>("print_loss", c.print_loss);
  c.answer_only_loss = o.get<bool>("answer_only_loss", c.answer_only_loss);
  c.output_dir = o.get<std::string>("output_dir", c.output_dir);
  o.finish();
  return c;
}

RewardConfig parse_reward_config(const nlohmann::json& json, const std::string& where, const DataConfig& data) {
  JsonObject o(object_or_empty(json), where);
  RewardConfig c;
  c.model.learning_rate = 5e-5;  // step 2's --learning_rate default
  read_supervised_keys(o, c, data);
  if (o.has("num_padding_at_beginning")) {
    c.num_padding_at_beginning = read_min(o, "num_padding_at_beginning", 0, 0);
  } else {
    o.accept({"num_padding_at_beginning"});  // still a known key for typo suggestions
  }
  c.eval_interval = read_min(o, "eval_interval", c.eval_interval, 0);
  c.eval_iters = read_min(o, "eval_iters", c.eval_iters, 1);
  c.output_dir = o.get<std::string>("output_dir", c.output_dir);
  o.finish();
  return c;
}

DpoConfig parse_dpo_config(const nlohmann::json& json, const std::string& where, const DataConfig& data) {
  JsonObject o(object_or_empty(json), where);
  DpoConfig c;
  c.model.learning_rate = 1e-3;  // step2_dpo_finetuning's --learning_rate default
  read_supervised_keys(o, c, data);
  c.beta = read_nonnegative(o, "beta", c.beta);
  c.label_smoothing = core::check_range(o, "label_smoothing", o.get<double>("label_smoothing", c.label_smoothing),
                                        0.0, 0.5);
  c.offload_reference_model = o.get<bool>("offload_reference_model", c.offload_reference_model);
  c.eval_interval = read_min(o, "eval_interval", c.eval_interval, 0);
  c.eval_iters = read_min(o, "eval_iters", c.eval_iters, 1);
  c.output_dir = o.get<std::string>("output_dir", c.output_dir);
  o.finish();
  return c;
}

PpoConfig parse_ppo_config(const nlohmann::json& json, const std::string& where, const DataConfig& data) {
  JsonObject o(object_or_empty(json), where);
  PpoConfig c;
  c.actor.learning_rate = 9.65e-6;  // step 3's --actor_learning_rate default
  c.critic.learning_rate = 5e-6;    // --critic_learning_rate
  c.common.num_warmup_steps = 100;  // step 3's --num_warmup_steps default
  accept_description(o);
  c.actor_model_name_or_path = o.get<std::string>("actor_model_name_or_path", c.actor_model_name_or_path);
  c.critic_model_name_or_path = o.get<std::string>("critic_model_name_or_path", c.critic_model_name_or_path);
  c.data = read_step_data(o, data);
  read_common(o, c.common);
  read_model(o, "actor_", c.actor);
  read_model(o, "critic_", c.critic);
  c.num_padding_at_beginning = read_min(o, "num_padding_at_beginning", c.num_padding_at_beginning, 0);
  read_policy_step_keys(o, c);
  c.generation_batches = read_min(o, "generation_batches", c.generation_batches, 1);
  c.offload_reward_model = o.get<bool>("offload_reward_model", c.offload_reward_model);
  c.enable_mixed_precision_lora = o.get<bool>("enable_mixed_precision_lora", c.enable_mixed_precision_lora);
  c.align_overflow = o.get<bool>("align_overflow", c.align_overflow);
  c.enable_test_mode = o.get<bool>("enable_test_mode", c.enable_test_mode);
  c.test_stop_step = read_min(o, "test_stop_step", c.test_stop_step, 0);
  // Ours; 0 would keep empty answers, which have no reward slot after the prompt.
  c.min_answer_tokens = read_min(o, "min_answer_tokens", c.min_answer_tokens, 1);
  c.output_dir = o.get<std::string>("output_dir", c.output_dir);
  if (auto k = o.object("ppo_constants")) {
    PpoConstants& p = c.constants;
    p.kl_ctl = read_nonnegative(*k, "kl_ctl", p.kl_ctl);
    p.clip_reward_value = read_positive(*k, "clip_reward_value", p.clip_reward_value);
    p.cliprange = read_positive(*k, "cliprange", p.cliprange);
    p.cliprange_value = read_positive(*k, "cliprange_value", p.cliprange_value);
    p.gamma = read_unit(*k, "gamma", p.gamma);
    p.lam = read_unit(*k, "lam", p.lam);
    k->finish();
  }
  if (auto g = o.object("reward_gate")) {  // ours: the reward model's check before PPO (reward_gate.h)
    RewardGateConfig& r = c.reward_gate;
    const std::string action = read_choice(*g, "action", gate_action_name(r.action), {"refuse", "warn", "off"});
    r.action = action == "warn" ? GateAction::kWarn : action == "off" ? GateAction::kOff : GateAction::kRefuse;
    r.min_accuracy = read_unit(*g, "min_accuracy", r.min_accuracy);
    r.max_length_bias = core::check_range(*g, "max_length_bias", g->get<double>("max_length_bias", r.max_length_bias),
                                          -1.0, 1.0);
    r.max_padding_win_rate = read_unit(*g, "max_padding_win_rate", r.max_padding_win_rate);
    r.max_pairs = read_min(*g, "max_pairs", r.max_pairs, 0);
    g->finish();
  }
  o.finish();

  // DS-Chat's step-3 argument checks (main.py), after finish() so a misspelt key is reported as
  // such rather than as a rule its intended value would have satisfied.
  DSCHAT_CHECK(c.inference_tp_size == 1 || c.actor.zero_stage == 3, ConfigError, where,
               ": inference_tp_size ", c.inference_tp_size, " > 1 requires actor_zero_stage 3 (got ",
               c.actor.zero_stage, "): the hybrid engine regathers ZeRO-3 partitions into tensor-parallel shards");
  DSCHAT_CHECK(!(c.actor.zero_stage == 2 && c.critic.zero_stage == 2 && c.enable_hybrid_engine && c.common.offload &&
                 c.actor.lora_dim == 0),
               ConfigError, where,
               ": actor_zero_stage 2 + critic_zero_stage 2 + enable_hybrid_engine + offload with actor_lora_dim 0 "
               "is refused as in DeepSpeed-Chat (unstable in DeepSpeed-Chat); enable LoRA, change a ZeRO stage, "
               "or turn off offload or the hybrid engine");
  // DeepSpeed-Chat's own asserts: the quantised weights are the frozen base under the actor's LoRA,
  // partitioned by ZeRO-3.
  DSCHAT_CHECK(!c.enable_mixed_precision_lora || (c.actor.lora_dim > 0 && c.actor.zero_stage == 3), ConfigError,
               where, ": enable_mixed_precision_lora needs actor_lora_dim > 0 and actor_zero_stage 3 (got ",
               c.actor.lora_dim, " and ", c.actor.zero_stage, "): it stores the frozen base weights under the "
               "actor's LoRA as int8 ZeRO-3 partitions");
  return c;
}

}  // namespace rlhf
}  // namespace dschat
