#include "dschat/models/families.h"

namespace dschat {
namespace models {

const std::vector<FamilySupport>& supported_families() {
  static const std::vector<FamilySupport> families = {
      {"OPT", "opt", "decoder.layers.", "learned (offset 2)",
       "decode attention, bias + residual + LayerNorm, bias + ReLU", "opt-125m ... opt-175b"},
      {"LLaMA, LLaMA-2/3", "llama", "layers.", "rotary (default, linear, dynamic, llama3 scaling)",
       "rotary, decode attention, residual + RMSNorm, SiLU gate", "llama-2-7b, llama-2-13b, llama-2-70b"},
      {"Mistral", "mistral", "layers.", "rotary; sliding window",
       "as LLaMA; windowed layers attend through SDPA once the window is shorter than the keys",
       "mistral-7b-v0.1, mistral-7b-v0.3"},
      {"Qwen2, Qwen2.5", "qwen2", "layers.", "rotary; sliding window by layer_types",
       "as LLaMA (q/k/v biases in the projections)", "qwen2.5-0.5b ... qwen2.5-72b"},
      {"Qwen3", "qwen3", "layers.", "rotary after per-head q/k RMSNorm", "as LLaMA",
       "qwen3-0.6b ... qwen3-32b"},
      {"GPT-2", "gpt2", "h.", "learned", "decode attention, bias + residual + LayerNorm, bias + GELU",
       "gpt2, gpt2-medium, gpt2-large, gpt2-xl"},
      {"GPT-Neo", "gpt_neo", "h.", "learned; local layers windowed",
       "as GPT-2; local layers attend through SDPA once the window is shorter than the keys", "-"},
      {"GPT-J, CodeGen", "gptj, codegen", "h.", "rotary on rotary_dim dims (interleaved pairs)",
       "rotary, decode attention, bias + GELU (parallel attention + MLP)", "-"},
      {"GPT-NeoX (Pythia)", "gpt_neox", "layers.", "rotary on rotary_pct of each head",
       "rotary, decode attention, bias + residual + LayerNorm (sequential), bias + GELU",
       "pythia-70m ... pythia-12b"},
      {"BLOOM", "bloom", "h.", "ALiBi", "bias + GELU; attention through SDPA with the ALiBi bias",
       "bloom-560m ... bloom-7b1"},
  };
  return families;
}

std::string supported_families_markdown() {
  std::string out =
      "| family | model_type | lora_module_name | positions | fused inference ops | presets |\n"
      "|---|---|---|---|---|---|\n";
  for (const auto& f : supported_families()) {
    out += "| " + f.family + " | `" + f.model_types + "` | `" + f.lora_modules + "` | " + f.positions + " | " +
           f.fused_ops + " | " + f.presets + " |\n";
  }
  return out;
}

}  // namespace models
}  // namespace dschat
