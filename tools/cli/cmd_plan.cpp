// `dschat plan`: will the run fit, and how long will it take, before anything is loaded. Takes
// `dschat train`'s arguments plus the hardware (docs/plan.md).
#include <iostream>

#include "app/plan_command.h"
#include "commands.h"
#include "train_flags.h"
#include "dschat/plan/step_plan.h"

namespace dschat {
namespace cli {

void add_plan_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  auto hw = std::make_shared<app::HardwareFlags>();
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "plan", "Memory per GPU, whether each step fits, and the time, for `dschat train`'s arguments on given hardware");
  cmd->add_option("--config", f->config_file, "JSON config in the `dschat train` format (docs/config.md)");
  cmd->add_option("--actor", f->actor, "Actor model: directory, cached HF id, short name or preset (opt-13b)");
  cmd->add_option("--reward", f->reward, "Reward model (opt-350m)");
  cmd->add_option("--deployment", f->deployment, "single_gpu | single_node | multi_node (selects the preset)")
      ->check(CLI::IsMember({"single_gpu", "single_node", "multi_node"}));
  cmd->add_option("--pipeline", f->pipeline, "sft-rm-ppo (default), sft-dpo, sft-grpo, sft-rloo, sft-reinforce_pp");
  cmd->add_option("--step", f->args.steps, "Steps to plan (default: the ones `dschat train` runs)")->check(CLI::Range(1, 3));
  cmd->add_option("--init", f->init, "'random': the presets' shapes (what `dschat train --init random` builds)");
  cmd->add_option("--tokenizer", f->tokenizer, "Tokenizer directory (not needed to plan)");
  cmd->add_option("--data-path", f->args.data_path, "Datasets, counted for the total time");
  cmd->add_option("--device", f->device, "auto | cpu | cuda | cuda:N: the device planned when no --gpu is given");
  cmd->add_option("--gpu", hw->gpu, "Accelerator from the table (a100-40g, a100-80g, h100-80g, h200, v100-32g, "
                                    "a6000, ...; docs/plan.md)");
  cmd->add_option("--gpu-memory", hw->gpu_memory, "GiB per GPU (overrides the table's; alone: a custom GPU)");
  cmd->add_option("--gpus", hw->gpus, "GPUs (ranks) per node (default: the launcher's world, else 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--nodes", hw->nodes, "Nodes")->capture_default_str();
  cmd->add_option("--host-memory", hw->host_memory, "Host GiB per node (default: this machine's; with --gpu or --gpu-memory 128 per GPU)");
  cmd->add_option("--margin", hw->margin, "Fraction of device memory kept free")->capture_default_str();
  cmd->add_option("--dataset-rows", hw->dataset_rows, "Rows of each step's datasets before the split (default: count)");
  cmd->add_flag("--json", *json, "Print the plan as JSON");
  cmd->callback([f, hw, json] {
    app::TrainArguments args = f->resolved();
    args.keep_preset_dtypes = hw->names_gpu();
    const app::TrainPlan train = app::plan_train(args, DSCHAT_SOURCE_DIR);
    const plan::PipelinePlan plan = app::plan_for(train.config, *hw);
    if (*json) {
      std::cout << plan::plan_to_json(plan).dump(2) << "\n";
    } else {
      std::cout << plan::format_plan(plan) << std::flush;
    }
  });
}

}  // namespace cli
}  // namespace dschat
