// The configs compiled into libdschat (configs/**/*.json, embedded by cmake/embed_configs.cmake):
// the per-size presets that mirror DeepSpeed-Chat's training scripts, and the demo config.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "core/json_object.h"
#include "core/strings.h"
#include "dschat/core/error.h"
#include "dschat/core/model_config.h"
#include "dschat/models/families.h"
#include "dschat/rlhf/config/pipeline_config.h"

namespace dschat {
namespace rlhf {
namespace {

struct EmbeddedConfig {
  const char* name;  // path relative to configs/
  const char* text;
};

const EmbeddedConfig kEmbeddedConfigs[] = {
#include "dschat_config_presets.inc"
};

const char* const kDemoName = "demo.json";

nlohmann::json embedded(const std::string& name) {
  for (const auto& config : kEmbeddedConfigs) {
    if (name == config.name) return core::parse_json_text(config.text, std::string("configs/") + name);
  }
  DSCHAT_THROW(NotFound, "configs/", name, " is not compiled into this build");
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

// "facebook/opt-1.3b", "opt-1.3b", "1.3b", "/models/OPT-1.3B/" -> "opt-1.3b";
// "meta-llama/Llama-2-7b-hf", "llama-2-7b" -> "llama-2-7b". DS-Chat's e2e strips "facebook/opt-".
std::string preset_stem(const std::string& model) {
  std::string name = model;
  while (!name.empty() && name.back() == '/') name.pop_back();
  auto slash = name.rfind('/');
  if (slash != std::string::npos) name = name.substr(slash + 1);
  name = lower(name);
  const std::string hf_suffix = "-hf";
  if (name.size() > hf_suffix.size() && name.compare(name.size() - hf_suffix.size(), hf_suffix.size(), hf_suffix) == 0) {
    name.resize(name.size() - hf_suffix.size());
  }
  if (name.rfind("llama", 0) == 0 || name.rfind("opt-", 0) == 0) return name;
  return "opt-" + name;
}

// deployment -> step -> stems that have a preset file.
std::map<std::string, std::map<int, std::set<std::string>>> preset_table() {
  std::map<std::string, std::map<int, std::set<std::string>>> table;
  for (const auto& name : preset_names()) {
    // "<deployment>/step<N>/<stem>.json"
    auto first = name.find('/');
    auto second = name.find('/', first + 1);
    std::string deployment = name.substr(0, first);
    int step = name[second - 1] - '0';
    std::string stem = name.substr(second + 1, name.size() - second - 1 - 5);
    table[deployment][step].insert(stem);
  }
  return table;
}

std::string describe_presets() {
  std::string out;
  for (const auto& [deployment, steps] : preset_table()) {
    if (!out.empty()) out += "; ";
    out += deployment + ":";
    for (const auto& [step, stems] : steps) {
      out += " step" + std::to_string(step) + " {" + core::join({stems.begin(), stems.end()}) + "}";
    }
  }
  return out;
}


// A model with no script of its own borrows the script of the nearest size, as long as the sizes
// are within this factor: hyper-parameters of a 1.3B script are a fair start for a 0.5B-3B model;
// a 13B script for a 70B model is not.
constexpr double kNearestSizeFactor = 4.0;

// Rough parameter count from the shapes (embeddings + attention + MLP), enough to rank sizes.
double approximate_parameters(const core::ModelConfig& c) {
  const double h = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double mlp_matrices = c.architecture == core::Architecture::Llama ? 3.0 : 2.0;
  const double per_layer = h * (2.0 * q + 2.0 * kv) + mlp_matrices * h * static_cast<double>(c.intermediate_size);
  const double embeddings = static_cast<double>(c.vocab_size) * h * (c.tie_word_embeddings ? 1.0 : 2.0);
  return embeddings + static_cast<double>(c.num_hidden_layers) * per_layer;
}

// A model the user has: a local directory with a config.json (not only a preset's name).
bool is_model_directory(const std::string& model) {
  return std::filesystem::is_regular_file(std::filesystem::path(model) / "config.json");
}

// The shapes of `model`: its --init random preset, or a local directory's config.json.
std::optional<core::ModelConfig> model_shapes(const std::string& model) {
  if (auto preset = core::model_preset(model)) return preset;
  if (is_model_directory(model)) return core::load_model_config(model);
  return std::nullopt;
}

// DeepSpeed-Chat's --lora_module_name for the decoder layers of this model_type.
std::string lora_layers_of(const std::string& model_type) {
  for (const auto& family : models::supported_families()) {
    // model_types is a list: "gptj, codegen"
    const std::string listed = ", " + family.model_types + ",";
    if (listed.find(", " + model_type + ",") != std::string::npos) return family.lora_modules;
  }
  return "";
}

struct ScriptChoice {
  std::string model;             // as given
  std::string stem;              // the script's file stem: "opt-1.3b"
  bool borrowed = false;         // not the model's own script
  std::string reason;            // why this script, when borrowed
  std::string lora_module_name;  // the model's own layer prefix, when borrowed
};

// The script for `model` among `stems`: its own by name, else the nearest size (LLaMA's scripts
// preferred for LLaMA-shaped families, OPT's for the LayerNorm decoders DS-Chat trains with them).
std::optional<ScriptChoice> choose_script(const std::string& model, const std::set<std::string>& stems) {
  const std::string own = preset_stem(model);
  if (stems.count(own) > 0) return ScriptChoice{model, own, false, "", ""};
  const std::optional<core::ModelConfig> shapes = model_shapes(model);
  if (!shapes) return std::nullopt;
  const double size = approximate_parameters(*shapes);
  const bool llama_shaped = shapes->architecture == core::Architecture::Llama;
  // A model directory of the user's own takes the deployment's nearest script however far its
  // size is (TRL and OpenRLHF take a model path alone too); a preset name beyond 4x is refused.
  const double limit = is_model_directory(model) ? std::numeric_limits<double>::infinity() : std::log(kNearestSizeFactor);
  std::optional<ScriptChoice> best;
  double best_distance = 0.0;
  for (const std::string& stem : stems) {
    const std::optional<core::ModelConfig> script_shapes = core::model_preset(stem);
    if (!script_shapes) continue;
    const double ratio = std::abs(std::log(size / approximate_parameters(*script_shapes)));
    if (ratio > limit) continue;
    const bool same_kind = (script_shapes->architecture == core::Architecture::Llama) == llama_shaped;
    const double distance = ratio + (same_kind ? 0.0 : std::log(1.25));
    if (!best || distance < best_distance) {
      best_distance = distance;
      char reason[256];
      const double apart = std::exp(ratio);
      std::snprintf(reason, sizeof reason, "%s %.2gB parameters, no script of its own: %s's script, the nearest size%s",
                    shapes->model_type.c_str(), size / 1e9, stem.c_str(),
                    apart > kNearestSizeFactor ? " (sizes far apart: check its batch sizes and learning rates)" : "");
      best = ScriptChoice{model, stem, true, reason, lora_layers_of(shapes->model_type)};
    }
  }
  return best;
}
}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& config : kEmbeddedConfigs) {
    std::string name = config.name;
    // Only "<deployment>/step<N>/<stem>.json"; demo.json and any other loose file are not presets.
    if (std::count(name.begin(), name.end(), '/') == 2 && name.find("/step") != std::string::npos) {
      names.push_back(name);
    }
  }
  return names;
}

nlohmann::json preset_config(const std::string& deployment, const std::string& actor_model,
                             const std::string& reward_model) {
  const auto table = preset_table();
  auto stems_of = [&](int step) {
    auto d = table.find(deployment);
    if (d == table.end()) return std::set<std::string>{};
    auto s = d->second.find(step);
    return s == d->second.end() ? std::set<std::string>{} : s->second;
  };
  const std::optional<ScriptChoice> actor1 = choose_script(actor_model, stems_of(1));
  const std::optional<ScriptChoice> reward2 = choose_script(reward_model, stems_of(2));
  const std::optional<ScriptChoice> actor3 = choose_script(actor_model, stems_of(3));
  DSCHAT_CHECK(actor1 && reward2 && actor3, ConfigError, "no preset for deployment '", deployment, "' with actor '",
               actor_model, "' (", preset_stem(actor_model), ") and reward model '", reward_model, "' (",
               preset_stem(reward_model),
               "); steps 1 and 3 are chosen by the actor and step 2 by the reward model: a script of that name, or "
               "for another family or size the script of the nearest size within ",
               kNearestSizeFactor, "x (sizes known from the --init random presets or the directory's config.json); "
               "the presets are: ",
               describe_presets(), ". Pass --config with your own values instead");
  const std::string& actor = actor1->stem;
  const std::string& reward = reward2->stem;

  // A bare size names DS-Chat's OPT checkpoint; anything else (hub id, short name, directory)
  // is kept for the model resolver.
  auto model_name = [](const std::string& given, const std::string& stem) {
    return given.find('-') == std::string::npos && given.find('/') == std::string::npos ? "facebook/" + stem : given;
  };
  nlohmann::json out = {{"actor_model", model_name(actor_model, actor)},
                        {"reward_model", model_name(reward_model, reward)},
                        {"deployment", deployment}};
  std::string description = "DeepSpeed-Chat " + deployment + " scripts:";
  const std::pair<int, const std::string*> steps[] = {{1, &actor}, {2, &reward}, {3, &actor}};
  for (const auto& [step, stem] : steps) {
    std::string key = "step" + std::to_string(step);
    nlohmann::json block = embedded(deployment + "/" + key + "/" + *stem + ".json");
    if (block.contains("description") && block["description"].is_string()) {
      description += " " + key + ": " + block["description"].get<std::string>() + ";";
    }
    block.erase("description");
    out[key] = std::move(block);
  }
  // A script borrowed from another family or size: say so, and point LoRA at this family's layers
  // (an OPT script's "decoder.layers." matches no GPT-2 or Qwen module).
  const std::pair<const ScriptChoice*, std::vector<std::pair<const char*, const char*>>> retargets[] = {
      {&*actor1, {{"step1", "lora_module_name"}, {"step3", "actor_lora_module_name"}}},
      {&*reward2, {{"step2", "lora_module_name"}, {"step3", "critic_lora_module_name"}}}};
  for (const auto& [choice, keys] : retargets) {
    if (!choice->borrowed) continue;
    description += " (" + choice->model + ": " + choice->reason + ")";
    for (const auto& [step, key] : keys) {
      if (!choice->lora_module_name.empty()) out[step][key] = choice->lora_module_name;
    }
  }
  description.pop_back();
  out["description"] = description;
  return out;
}

nlohmann::json demo_config() { return embedded(kDemoName); }

}  // namespace rlhf
}  // namespace dschat
