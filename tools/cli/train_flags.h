#pragma once
// The flags `dschat train|sft|rm|ppo|dpo|grpo` and `dschat plan` share.
#include <CLI/CLI.hpp>

#include <string>

#include "app/train_command.h"

namespace dschat {
namespace cli {

struct TrainFlags {
  app::TrainArguments args;
  std::string actor, reward, deployment, config_file, output_dir, init, tokenizer, device, resume_from, pipeline;
  std::string save_format;
  bool no_progress = false;
  bool dry_run = false;
  bool skip_plan = false;
  app::TrainArguments resolved() const {
    app::TrainArguments out = args;
    auto set = [](std::optional<std::string>& slot, const std::string& value) {
      if (!value.empty()) slot = value;
    };
    set(out.actor, actor);
    set(out.reward, reward);
    set(out.deployment, deployment);
    set(out.config_file, config_file);
    set(out.output_dir, output_dir);
    set(out.init, init);
    set(out.tokenizer, tokenizer);
    set(out.device, device);
    set(out.pipeline, pipeline);
    set(out.save_format, save_format);
    out.local_rank = app::launcher_local_rank();
    return out;
  }
};

/// --config, --output-dir, --init, --tokenizer, --data-path, --no-progress, --dry-run, --device,
/// --skip-plan, --resume-from, --save-format.
void add_common_flags(CLI::App& cmd, TrainFlags& f);

}  // namespace cli
}  // namespace dschat
