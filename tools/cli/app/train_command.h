#pragma once
// What `dschat train|sft|rm|ppo` do between parsing flags and running steps: pick the preset
// (or the embedded demo when no model, deployment or config is named), merge the user's config
// file and flags over it, resolve the demo's bundled paths, join the launcher's job, and turn
// Ctrl-C into a stop request the trainers answer by saving a checkpoint.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/dist/process_group.h"
#include "dschat/rlhf/config/pipeline_config.h"

namespace dschat {
namespace app {

struct TrainArguments {
  std::optional<std::string> actor, reward, deployment, config_file, output_dir, init, tokenizer, device, pipeline;
  std::optional<std::string> save_format;  // --save-format: replaces every step's "save_format"
  /// The launcher's LOCAL_RANK (-1: not launched), for resolving "auto"/"cuda".
  int64_t local_rank = -1;
  std::vector<int> steps;
  std::vector<std::string> data_path;
  std::optional<int64_t> collective_timeout_seconds;  // --collective-timeout
  /// `dschat grpo`: unless the file names a critic-free pipeline, the one of step2_grpo's
  /// advantage_estimator (sft-grpo by default).
  bool critic_free_step = false;
  /// `dschat plan --gpu ...` from a machine without that GPU: keep the presets' fp16/bf16 even
  /// where "auto" resolves to the CPU here.
  bool keep_preset_dtypes = false;
};

struct TrainPlan {
  rlhf::PipelineConfig config;
  bool demo = false;
  std::filesystem::path demo_eval_file;  // the demo's held-out prompts
};

/// No actor, reward, deployment or config file: the embedded demo, its relative paths resolved
/// against the working directory, else `source_dir` (the dschat checkout the binary was built
/// from). Otherwise the preset of (deployment, actor, reward), the config file merged over it,
/// then the flags (--device replaces every "device" key). A step that runs on the CPU with a
/// preset's fp16/bf16 (a dtype the user's file did not set for it) runs in fp32, with one warning.
/// Throws core::ConfigError naming the file or flag.
TrainPlan plan_train(const TrainArguments& args, const std::filesystem::path& source_dir);

/// One line per step the plan runs: "step1: sft  device cpu  dtype fp32  model <path>" (the
/// devices plan_train resolved): what `dschat train --dry-run` prints.
std::string describe_plan(const TrainPlan& plan);

/// The JSON the plan was parsed from, written to <output_dir>/train_config.json for the record.
nlohmann::json plan_json(const TrainArguments& args, const std::filesystem::path& source_dir);

/// The data-parallel job this process belongs to (torchrun / mpirun / srun / `dschat launch`
/// variables), or null for a single process. With a CUDA `device` the GPU is made current first
/// and the communicator gets NCCL for CUDA tensors (Gloo always serves CPU tensors).
/// `timeout`: how long a collective waits for the other ranks (the config's collective_timeout_seconds).
std::shared_ptr<dist::Communicator> communicator_from_environment(
    const torch::Device& device = torch::kCPU, std::chrono::milliseconds timeout = std::chrono::minutes(5));

/// LOCAL_RANK of the launcher that started this process, or -1 when none did.
int64_t launcher_local_rank();

/// The device of the first step that `config` runs (where a CUDA rank's communicator lives), as
/// plan_train resolved it.
torch::Device pipeline_device(const rlhf::PipelineConfig& config);

/// Installs a SIGINT/SIGTERM handler that raises the returned flag; a second signal restores
/// the default action (so a second Ctrl-C kills at once).
const std::atomic<bool>* install_stop_signal_handler();

}  // namespace app
}  // namespace dschat
