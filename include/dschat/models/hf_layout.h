#pragma once
// The Hugging Face state-dict layout of each model family, against dschat's module names.
//
// dschat's modules keep each family's checkpoint names, except where one checkpoint tensor is
// several modules here or is stored differently:
//   - fused q/k/v projections are split into q_proj, k_proj, v_proj: GPT-2's attn.c_attn,
//     GPT-NeoX's attention.query_key_value and BLOOM's self_attention.query_key_value (per head
//     [q; k; v]), CodeGen's attn.qkv_proj (interleaved over 4 shards as q, v, k);
//   - GPT-2's Conv1D weights ([in, out]) are transposed into Linear's [out, in];
//   - GPT-J's and CodeGen's rotary dims of q and k, interleaved in pairs, are reordered into the
//     rotate-half layout the shared attention uses (the same permutation of q and k leaves q.k,
//     and so the model, unchanged);
//   - GPT-Neo's attn.attention.* is attn.*;
//   - buffers some checkpoints carry (causal masks, rotary inv_freq) are dropped.
// Both directions are exact (splits, transposes and permutations only), so a checkpoint saved by
// dschat loads in transformers with its own tensors.
//   NamedTensors modules = from_hf_layout(config, io_tensors, "model.", "ckpt/");
//   NamedTensors hf = to_hf_layout(config, named_weights(model));

#include <string>

#include "dschat/core/model_config.h"
#include "dschat/models/weights.h"

namespace dschat {
namespace models {

/// A checkpoint's tensors in any of the layouts transformers and DeepSpeed-Chat write (a
/// *ForCausalLM state dict, a bare base model, DeepSpeed-Chat's reward model with rwtransformer.*
/// and v_head.weight) -> module names: the backbone's under
/// `module_prefix` ("model." or "rwtransformer."), heads as lm_head.weight, lm_head.bias,
/// v_head.weight (GPT-NeoX's embed_out.weight is lm_head.weight). `source` names the checkpoint
/// in errors (a fused tensor of the wrong shape).
NamedTensors from_hf_layout(const core::ModelConfig& config, const NamedTensors& weights,
                            const std::string& module_prefix, const std::string& source);

/// Module names (a CausalLM's model.* and lm_head.*, or a ValueHeadModel's rwtransformer.* and
/// v_head.weight) -> the family's HF layout: a causal LM's backbone under its base-model prefix
/// (model., transformer., gpt_neox.) and its LM head name (lm_head, embed_out); a value model
/// keeps DeepSpeed-Chat's rwtransformer. prefix. Unfused LoRA adapters pass through by name for
/// families whose modules map one to one; for the others they are refused (core::Unsupported).
NamedTensors to_hf_layout(const core::ModelConfig& config, const NamedTensors& tensors);

/// "model.", "transformer." or "gpt_neox.": the base model's prefix in the family's *ForCausalLM.
std::string hf_base_prefix(const core::ModelConfig& config);

}  // namespace models
}  // namespace dschat
