// The configs compiled into libdschat (configs/**/*.json, embedded by cmake/embed_configs.cmake):
// the per-size presets that mirror DeepSpeed-Chat's training scripts, and the demo config.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "core/json_object.h"
#include "core/strings.h"
#include "dschat/core/error.h"
#include "dschat/rlhf/pipeline_config.h"

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
  const std::string actor = preset_stem(actor_model);
  const std::string reward = preset_stem(reward_model);
  const auto table = preset_table();
  auto has = [&](int step, const std::string& stem) {
    auto d = table.find(deployment);
    if (d == table.end()) return false;
    auto s = d->second.find(step);
    return s != d->second.end() && s->second.count(stem) > 0;
  };
  DSCHAT_CHECK(has(1, actor) && has(2, reward) && has(3, actor), ConfigError, "no preset for deployment '",
               deployment, "' with actor '", actor_model, "' (", actor, ") and reward model '", reward_model, "' (",
               reward, "); steps 1 and 3 are chosen by the actor and step 2 by the reward model, and the presets are: ",
               describe_presets(), ". Pass --config with your own values instead");

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
  description.pop_back();
  out["description"] = description;
  return out;
}

nlohmann::json demo_config() { return embedded(kDemoName); }

}  // namespace rlhf
}  // namespace dschat
