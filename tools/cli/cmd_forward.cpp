// `dschat forward --model DIR --input-ids X.npy [--attention-mask M.npy] --output L.npy
//                 [--dtype fp32|bf16|fp16] [--value-head] [--init random]`
// int64 ids in, float32 logits [B, T, V] out (or per-token values [B, T] with --value-head), as
// NumPy files, for parity checks against other implementations.
#include <iostream>

#include "commands.h"
#include "model_flags.h"
#include "dschat/core/error.h"
#include "dschat/models/load_save.h"
#include "dschat/io/npy.h"

namespace dschat {
namespace cli {
namespace {

struct ForwardOptions {
  std::string model, input_ids, attention_mask, output, dtype = "fp32", init, device = "auto";
  bool value_head = false;
};

void run_forward(const ForwardOptions& o) {
  models::LoadOptions load = load_options(o.dtype, o.init, o.device);
  torch::Tensor ids = io::load_npy(o.input_ids);  // [B, T]
  DSCHAT_CHECK(ids.scalar_type() == torch::kInt64 && ids.dim() == 2, InvalidArgument, "--input-ids ", o.input_ids,
               ": expected a 2-D int64 array, got ", ids.scalar_type(), " of shape ", ids.sizes());
  torch::Tensor mask;  // [B, T] or undefined
  if (!o.attention_mask.empty()) mask = io::load_npy(o.attention_mask).to(load.device, torch::kInt64);
  ids = ids.to(load.device);
  torch::NoGradGuard no_grad;
  torch::Tensor out;
  if (o.value_head) {
    out = models::load_value_model(o.model, load)->forward(ids, mask);  // [B, T]
  } else {
    out = models::load_causal_lm(o.model, load)->forward(ids, mask);  // [B, T, V]
  }
  io::save_npy(o.output, out.to(torch::kCPU, torch::kFloat32));
}

}  // namespace

void add_forward_command(CLI::App& app) {
  auto options = std::make_shared<ForwardOptions>();
  auto* cmd = app.add_subcommand("forward", "Logits (float32 .npy) for int64 token ids (.npy)");
  cmd->add_option("--model", options->model, "Model directory, cached HF id or short name")->required();
  cmd->add_option("--input-ids", options->input_ids, "int64 [batch, tokens] .npy")->required();
  cmd->add_option("--attention-mask", options->attention_mask, "[batch, tokens] .npy, 1 = real token");
  cmd->add_option("--output", options->output, "Where to write float32 logits .npy")->required();
  cmd->add_option("--dtype", options->dtype, "Compute dtype: fp32, bf16, fp16")->capture_default_str();
  add_device_flag(*cmd, options->device);
  cmd->add_flag("--value-head", options->value_head, "Reward/critic model: write per-token values [batch, tokens]");
  cmd->add_option("--init", options->init, "'random': preset or config.json shapes with random weights");
  cmd->callback([options] { run_forward(*options); });
}

}  // namespace cli
}  // namespace dschat
