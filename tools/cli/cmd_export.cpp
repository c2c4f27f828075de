// `dschat export-hf --checkpoint DIR [--tag T] --output OUT [--dtype fp32|bf16|fp16]
// [--model-dir M] [--keep-lora]`: consolidates a training checkpoint saved by any number of ranks
// at any ZeRO stage into one Hugging Face model directory (DeepSpeed's zero_to_fp32.py).
#include <iostream>
#include <memory>
#include <string>

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
  bool keep_lora = false;
};

void run_export(const ExportCommandOptions& options) {
  engine::ExportOptions export_options;
  export_options.dtype = core::parse_dtype(options.dtype, "--dtype");
  export_options.fuse_lora = !options.keep_lora;
  export_options.model_dir = options.model_dir;
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
  cmd->add_option("--model-dir", options->model_dir, "Copy config.json and tokenizer files from this model directory");
  cmd->add_flag("--keep-lora", options->keep_lora, "Keep LoRA adapters as separate tensors instead of fusing them");
  cmd->callback([options] { run_export(*options); });
}

}  // namespace cli
}  // namespace dschat
