// The readers every step block shares (step_config_parse.cpp, grpo_config_parse.cpp): numbers
// in range, choices, string lists, and the data, common and model keys.
#include "rlhf/config/config_read.h"

#include <functional>
#include <limits>

#include "core/strings.h"
#include "dschat/core/device.h"
#include "dschat/core/dtype.h"
#include "dschat/core/error.h"
#include "dschat/data/split.h"
#include "dschat/engine/lr_schedule.h"

namespace dschat {
namespace rlhf {
namespace config_read {

using core::JsonObject;

// An absent step block (or an explicit null, as merge_config leaves none) reads as {}.
const nlohmann::json& object_or_empty(const nlohmann::json& json) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  return json.is_null() ? kEmpty : json;
}

int64_t read_min(JsonObject& o, const std::string& key, int64_t fallback, int64_t min) {
  int64_t value = o.get<int64_t>(key, fallback);
  DSCHAT_CHECK(value >= min, ConfigError, o.at(key), " must be >= ", min, ", got ", value);
  // Every count here (batch sizes, epochs, steps, lengths, intervals) is far below 2^24 in any real
  // run; the cap keeps their products (batch x GAS x world, epochs x steps) inside int64.
  DSCHAT_CHECK(value <= kMaxCount, ConfigError, o.at(key), " must be <= ", kMaxCount, ", got ", value);
  return value;
}

double read_nonnegative(JsonObject& o, const std::string& key, double fallback) {
  double value = o.get<double>(key, fallback);
  DSCHAT_CHECK(value >= 0 && value < std::numeric_limits<double>::infinity(), ConfigError, o.at(key),
               " must be a finite number >= 0, got ", value);
  return value;
}

double read_positive(JsonObject& o, const std::string& key, double fallback) {
  double value = o.get<double>(key, fallback);
  DSCHAT_CHECK(value > 0 && value < std::numeric_limits<double>::infinity(), ConfigError, o.at(key),
               " must be a finite number > 0, got ", value);
  return value;
}

double read_unit(JsonObject& o, const std::string& key, double fallback) {
  return core::check_range(o, key, o.get<double>(key, fallback), 0.0, 1.0);
}

std::string read_choice(JsonObject& o, const std::string& key, const std::string& fallback,
                        const std::vector<std::string>& choices) {
  std::string value = o.get<std::string>(key, fallback);
  for (const auto& choice : choices) {
    if (value == choice) return value;
  }
  DSCHAT_THROW(ConfigError, o.at(key), ": '", value, "' is not one of ", core::join(choices));
}

// DS-Chat's nargs="*" flags: a JSON array of strings, or one string for a single entry.
std::vector<std::string> read_string_list(JsonObject& o, const std::string& key,
                                          const std::vector<std::string>& fallback) {
  if (o.has(key) && o.get<nlohmann::json>(key, nullptr).is_string()) {
    return {o.get<std::string>(key, "")};
  }
  return o.get<std::vector<std::string>>(key, fallback);
}

void read_data_keys(JsonObject& o, DataConfig& data) {
  data.data_path = read_string_list(o, "data_path", data.data_path);
  DSCHAT_CHECK(!data.data_path.empty(), ConfigError, o.at("data_path"), " must name at least one dataset");
  data.data_split = o.get<std::string>("data_split", data.data_split);
  try {
    data::parse_data_split(data.data_split);
  } catch (const core::ConfigError& e) {
    DSCHAT_THROW(ConfigError, o.at("data_split"), ": ", e.what());
  }
  data.sft_only_data_path = read_string_list(o, "sft_only_data_path", data.sft_only_data_path);
  data.data_output_path = o.get<std::string>("data_output_path", data.data_output_path);
  data.local_jsonfile_dir = o.get<std::string>("local_jsonfile_dir", data.local_jsonfile_dir);
  data.unsupervised_dataset_name = read_string_list(o, "unsupervised_dataset_name", data.unsupervised_dataset_name);
  data.unsup_coef = read_nonnegative(o, "unsup_coef", data.unsup_coef);
}

// A step's own "data" object merges over the shared one key by key.
DataConfig read_step_data(JsonObject& o, const DataConfig& shared) {
  DataConfig data = shared;
  if (auto nested = o.object("data")) {
    read_data_keys(*nested, data);
    nested->finish();
  }
  return data;
}

void read_common(JsonObject& o, CommonStepConfig& c) {
  c.device = o.get<std::string>("device", c.device);
  DSCHAT_CHECK(core::is_device_name(c.device), ConfigError, o.at("device"), ": '", c.device,
               "' is not a device (auto, cpu, cuda or cuda:N)");
  c.dtype = *core::dtype_from_name(read_choice(o, "dtype", step_dtype_name(c.dtype), {"fp16", "bf16", "fp32"}));
  c.offload = o.get<bool>("offload", c.offload);
  c.seed = static_cast<uint32_t>(core::check_range<int64_t>(o, "seed", o.get<int64_t>("seed", c.seed), 0,
                                                            std::numeric_limits<uint32_t>::max()));
  c.num_train_epochs = read_min(o, "num_train_epochs", c.num_train_epochs, 1);
  c.gradient_accumulation_steps = read_min(o, "gradient_accumulation_steps", c.gradient_accumulation_steps, 1);
  c.lr_scheduler_type = read_choice(o, "lr_scheduler_type", c.lr_scheduler_type, engine::LrSchedule::type_names());
  c.num_warmup_steps = read_min(o, "num_warmup_steps", c.num_warmup_steps, 0);
  c.only_optimize_lora = o.get<bool>("only_optimize_lora", c.only_optimize_lora);
  c.compute_fp32_loss = o.get<bool>("compute_fp32_loss", c.compute_fp32_loss);
  c.add_eot_token = o.get<bool>("add_eot_token", c.add_eot_token);
  c.enable_tensorboard = o.get<bool>("enable_tensorboard", c.enable_tensorboard);
  c.tensorboard_path = o.get<std::string>("tensorboard_path", c.tensorboard_path);
  c.checkpoint_interval = read_min(o, "checkpoint_interval", c.checkpoint_interval, 0);
  c.keep_checkpoints = read_min(o, "keep_checkpoints", c.keep_checkpoints, 0);
  c.keep_last_checkpoint = o.get<bool>("keep_last_checkpoint", c.keep_last_checkpoint);
  c.save_format = io::parse_weights_format(
      read_choice(o, "save_format", io::weights_format_name(c.save_format), {"safetensors", "bin"}), o.where());
  c.async_checkpoint = o.get<bool>("async_checkpoint", c.async_checkpoint);
  c.print_interval = read_min(o, "print_interval", c.print_interval, 1);
  c.elastic_resume_allowed =
      read_choice(o, "elastic_resume", c.elastic_resume_allowed ? "allow" : "exact", {"exact", "allow"}) == "allow";
  c.log_sample_ids = o.get<bool>("log_sample_ids", c.log_sample_ids);
  read_guardian(o, c.guardian);
}

namespace {

// One signal's block: {"action": ..., <threshold_key>: ..., "window": ...}; `extra` reads the
// signal's other keys.
void read_rule(JsonObject& guardian, const std::string& name, monitor::GuardianRule& rule,
               const std::string& threshold_key, double low, double high, int64_t min_window,
               const std::function<void(JsonObject&)>& extra = {}) {
  auto r = guardian.object(name);
  if (!r) return;
  if (r->has("action")) rule.action = monitor::parse_action(r->get<std::string>("action", ""), r->at("action"));
  if (!threshold_key.empty()) {
    rule.threshold = core::check_range(*r, threshold_key, r->get<double>(threshold_key, rule.threshold), low, high);
  }
  if (min_window > 0) rule.window = read_min(*r, "window", rule.window, min_window);
  if (extra) extra(*r);
  r->finish();
}

}  // namespace

void read_guardian(JsonObject& o, monitor::GuardianConfig& g) {
  auto b = o.object("guardian");
  if (!b) return;
  constexpr double kHuge = 1e300;
  g.enabled = b->get<bool>("enabled", g.enabled);
  g.snapshot_interval = read_min(*b, "snapshot_interval", g.snapshot_interval, 1);
  g.max_rollbacks = read_min(*b, "max_rollbacks", g.max_rollbacks, 0);
  g.lr_factor = core::check_range(*b, "lr_factor", b->get<double>("lr_factor", g.lr_factor), 1e-12, 1.0);
  g.batches = read_choice(*b, "batches", g.batches, {"skip", "retry"});
  g.reseed = b->get<bool>("reseed", g.reseed);
  read_rule(*b, "non_finite", g.non_finite, "", 0, 0, 0);
  read_rule(*b, "loss_spike", g.loss_spike, "factor", 1.0, kHuge, 1, [&g](JsonObject& r) {
    g.loss_spike_min_steps = read_min(r, "min_steps", g.loss_spike_min_steps, 1);
    g.loss_spike_min_increase = read_nonnegative(r, "min_increase", g.loss_spike_min_increase);
  });
  read_rule(*b, "kl", g.kl, "limit", 0.0, kHuge, 0);
  read_rule(*b, "kl_growth", g.kl_growth, "limit", -kHuge, kHuge, 2);
  read_rule(*b, "entropy", g.entropy, "floor", 0.0, kHuge, 0);
  read_rule(*b, "answer_length", g.answer_length, "margin", 0.0, kHuge, 0);
  read_rule(*b, "repeated_answers", g.repeated_answers, "share", 0.0, 1.0, 0);
  read_rule(*b, "reward_hacking", g.reward_hacking, "min_rise", -kHuge, kHuge, 2, [&g](JsonObject& r) {
    g.reward_hacking_min_drop = r.get<double>("min_drop", g.reward_hacking_min_drop);
    g.heldout_interval = read_min(r, "interval", g.heldout_interval, 0);
    g.heldout_prompts = read_min(r, "prompts", g.heldout_prompts, 1);
    g.heldout_source = r.get<std::string>("source", g.heldout_source);
  });
  b->finish();
}

// Step 1/2 flags unprefixed; step 3 passes "actor_" / "critic_".
void read_model(JsonObject& o, const std::string& prefix, ModelTrainingConfig& m) {
  m.learning_rate = read_nonnegative(o, prefix + "learning_rate", m.learning_rate);
  m.weight_decay = read_nonnegative(o, prefix + "weight_decay", m.weight_decay);
  m.zero_stage = core::check_range(o, prefix + "zero_stage", o.get<int>(prefix + "zero_stage", m.zero_stage), 0, 3);
  m.gradient_checkpointing = o.get<bool>(prefix + "gradient_checkpointing", m.gradient_checkpointing);
  if (auto dropout = o.get_optional<double>(prefix + "dropout")) {
    m.dropout = core::check_range(o, prefix + "dropout", *dropout, 0.0, 1.0);
  }
  m.lora_dim = read_min(o, prefix + "lora_dim", m.lora_dim, 0);
  m.lora_module_name = o.get<std::string>(prefix + "lora_module_name", m.lora_module_name);
  m.lora_learning_rate = read_nonnegative(o, prefix + "lora_learning_rate", m.lora_learning_rate);
}

// A free-text note (presets name the DS-Chat script they mirror).
void accept_description(JsonObject& o) { o.get<nlohmann::json>("description", nullptr); }

void read_sampling(JsonObject& o, ExperienceSampling& e) {
  auto s = o.object("experience_sampling");
  if (!s) return;
  e.do_sample = s->get<bool>("do_sample", e.do_sample);
  e.temperature = read_positive(*s, "temperature", e.temperature);
  e.top_k = read_min(*s, "top_k", e.top_k, 0);
  e.top_p = s->get<double>("top_p", e.top_p);
  DSCHAT_CHECK(e.top_p > 0 && e.top_p <= 1, ConfigError, s->at("top_p"), " must be in (0, 1], got ", e.top_p);
  s->finish();
}

void read_policy_step_keys(core::JsonObject& o, PolicyStepConfig& c) {
  c.per_device_generation_batch_size =
      read_min(o, "per_device_generation_batch_size", c.per_device_generation_batch_size, 1);
  c.per_device_training_batch_size = read_min(o, "per_device_training_batch_size", c.per_device_training_batch_size, 1);
  c.ppo_epochs = read_min(o, "ppo_epochs", c.ppo_epochs, 1);
  c.max_prompt_seq_len = read_min(o, "max_prompt_seq_len", c.max_prompt_seq_len, 1);
  c.max_answer_seq_len = read_min(o, "max_answer_seq_len", c.max_answer_seq_len, 1);
  c.enable_hybrid_engine = o.get<bool>("enable_hybrid_engine", c.enable_hybrid_engine);
  c.unpin_actor_parameters = o.get<bool>("unpin_actor_parameters", c.unpin_actor_parameters);
  c.release_inference_cache = o.get<bool>("release_inference_cache", c.release_inference_cache);
  c.inference_tp_size = read_min(o, "inference_tp_size", c.inference_tp_size, 1);
  c.tp_gather_partition_size = read_min(o, "tp_gather_partition_size", c.tp_gather_partition_size, 1);
  c.enable_cuda_graph = o.get<bool>("enable_cuda_graph", c.enable_cuda_graph);
  c.continuous_batching = o.get<bool>("continuous_batching", c.continuous_batching);
  c.kv_cache_memory_mib = read_min(o, "kv_cache_memory_mib", c.kv_cache_memory_mib, 0);
  c.max_running_sequences = read_min(o, "max_running_sequences", c.max_running_sequences, 1);
  c.prefix_caching = o.get<bool>("prefix_caching", c.prefix_caching);
  c.offload_reference_model = o.get<bool>("offload_reference_model", c.offload_reference_model);
  c.enable_ema = o.get<bool>("enable_ema", c.enable_ema);
  c.lora_fuse_backup = *hybrid::lora_fuse_backup_named(read_choice(
      o, "lora_fuse_backup", hybrid::lora_fuse_backup_name(c.lora_fuse_backup), {"auto", "device", "host"}));
  c.print_answers = o.get<bool>("print_answers", c.print_answers);
  c.print_answers_interval = read_min(o, "print_answers_interval", c.print_answers_interval, 1);
  read_sampling(o, c.sampling);
}

}  // namespace config_read
}  // namespace rlhf
}  // namespace dschat
