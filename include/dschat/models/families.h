#pragma once
// The model families dschat loads, and what works for each: the registry that docs/models.md's
// "Supported models" table is generated from (tests/models/family_table_test.cpp keeps the two
// equal, so the table cannot claim what the code does not say).

#include <string>
#include <vector>

namespace dschat {
namespace models {

struct FamilySupport {
  std::string family;        // "GPT-NeoX (Pythia)"
  std::string model_types;   // config.json model_type values: "gpt_neox"
  std::string lora_modules;  // DeepSpeed-Chat's --lora_module_name for the decoder layers: "layers."
  std::string positions;     // learned, rotary (partial, interleaved), ALiBi
  std::string fused_ops;     // which fused inference ops the decode path uses
  std::string presets;       // `--init random` / `dschat plan` preset names
};

/// Every family, in the order of docs/models.md. Training (SFT, reward model, critic, PPO, DPO,
/// GRPO/RLOO/REINFORCE++), ZeRO 0-3, activation checkpointing, the KV-cache inference engine,
/// the hybrid engine, tensor-parallel generation, `dschat serve` and `export-hf` work for all of
/// them (the table says so once, in its header line).
const std::vector<FamilySupport>& supported_families();

/// The markdown table of supported_families() (header, separator, one row per family).
std::string supported_families_markdown();

}  // namespace models
}  // namespace dschat
