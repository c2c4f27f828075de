// `dschat export-hf --checkpoint DIR [--tag T] --output OUT [--dtype fp32|bf16|fp16]
// [--model-dir M] [--save-format safetensors|bin] [--keep-lora]`: consolidates a training
// checkpoint saved by any number of ranks at any ZeRO stage into one Hugging Face model directory
// (DeepSpeed's zero_to_fp32.py).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "dschat/core/dtype.h"
#include "dschat/core/error.h"
#include "dschat/engine/checkpoint_export.h"

namespace dschat {
namespace cli {
namespace {

struct ExportCommandOptions {
  std::string checkpoint;
  std::string tag;
  std::string output;
  std::string dtype = "fp32";
  std::string model_dir;
  std::string save_format = "safetensors";
  bool keep_lora = false;
};

namespace fs = std::filesystem;

// "out/actor_checkpoints" -> "out/actor"; "" when the name has no such suffix.
fs::path without_checkpoints_suffix(const fs::path& dir) {
  const std::string name = dir.filename().string(), suffix = "_checkpoints";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return {};
  return dir.parent_path() / name.substr(0, name.size() - suffix.size());
}

// Where config.json and the tokenizer come from: --model-dir, else the run's output beside the
// checkpoint (out/actor for out/actor_checkpoints; out/step3/actor for step 3's
// out/step3_checkpoints/actor). A checkpoint holds weights only: without a config the exported
// directory would load in neither dschat nor transformers, so none found is an error.
std::string model_dir_for(const ExportCommandOptions& options) {
  if (!options.model_dir.empty()) return options.model_dir;
  fs::path dir = options.checkpoint;
  while (!dir.empty() && dir.filename().empty()) dir = dir.parent_path();  // a trailing '/'
  std::vector<fs::path> candidates;
  if (const fs::path output = without_checkpoints_suffix(dir); !output.empty()) candidates.push_back(output);
  if (const fs::path output = without_checkpoints_suffix(dir.parent_path()); !output.empty()) {
    candidates.push_back(output / dir.filename());
  }
  std::string looked;
  for (const fs::path& candidate : candidates) {
    if (fs::exists(candidate / "config.json")) {
      std::cerr << "export-hf: config and tokenizer from " << candidate.string() << " (the run's output)\n";
      return candidate.string();
    }
    looked += (looked.empty() ? "" : ", ") + candidate.string();
  }
  DSCHAT_CHECK(false, InvalidArgument, "export-hf: --model-dir is needed: the checkpoint holds weights only, and ",
               "without a config.json the exported directory loads in neither dschat nor transformers; give the run's ",
               "output or its init model directory",
               looked.empty() ? std::string() : " (no config.json in " + looked + ")");
  return {};
}

void run_export(const ExportCommandOptions& options) {
  engine::ExportOptions export_options;
  export_options.dtype = core::parse_dtype(options.dtype, "--dtype");
  export_options.fuse_lora = !options.keep_lora;
  export_options.model_dir = model_dir_for(options);
  export_options.format = io::parse_weights_format(options.save_format, "--save-format");
  const int64_t count = engine::export_hf_checkpoint(options.checkpoint, options.tag, options.output, export_options);
  std::cerr << "export-hf: wrote " << count << " tensors (" << options.dtype << ") to " << options.output << "\n";
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto options = std::make_shared<ExportCommandOptions>();
  auto* cmd = app.add_subcommand("export-hf",
                                 "Consolidate a training checkpoint (any ZeRO stage, any world size) into a "
                                 "Hugging Face model directory");
  cmd->add_option("--checkpoint", options->checkpoint, "Checkpoint directory (holds 'latest' and the tags)")->required();
  cmd->add_option("--tag", options->tag, "Tag to export (default: the one 'latest' names)");
  cmd->add_option("--output", options->output, "Output model directory (created)")->required();
  cmd->add_option("--dtype", options->dtype, "fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--model-dir", options->model_dir, "Copy config.json and tokenizer files from this model directory (default: the run's output "
                  "beside the checkpoint)");
  cmd->add_option("--save-format", options->save_format,
                  "safetensors (model.safetensors) or bin (pytorch_model.bin, what DeepSpeed-Chat loads)")
      ->capture_default_str()
      ->check(CLI::IsMember({"safetensors", "bin"}));
  cmd->add_flag("--keep-lora", options->keep_lora, "Keep LoRA adapters as separate tensors instead of fusing them");
  cmd->callback([options] { run_export(*options); });
}

}  // namespace cli
}  // namespace dschat
