#pragma once
// Per-family config.json readers and writers behind parse_model_config / model_config_to_json
// (internal to L0). Each reader fills the family's fields of ModelConfig from its own HF key names
// (GPT-2's n_embd, GPT-NeoX's rotary_pct, ...); each writer emits keys transformers reads back.

#include <nlohmann/json.hpp>

#include <string>

#include "core/json_object.h"
#include "dschat/core/model_config.h"

namespace dschat {
namespace core {

/// The HF key names of one family's core sizes, so range errors name the key the file has.
struct SizeKeys {
  std::string hidden = "hidden_size", layers = "num_hidden_layers", heads = "num_attention_heads",
              ffn = "intermediate_size", positions = "max_position_embeddings";
};

/// rope_parameters (transformers >= 5, rope_theta inside) or rope_scaling: the rotary scaling,
/// with config.rope_theta updated when the block carries it.
RopeScaling parse_rope(JsonObject& root, ModelConfig& config);

/// Reads the family of c.model_type (gpt2, gpt_neo, gptj, codegen, gpt_neox, bloom) into c and
/// returns its key names; false when model_type is none of them.
bool parse_gpt_family(JsonObject& root, ModelConfig& c, SizeKeys& keys);

/// Writes the family-specific keys of c (one of the families above) into j.
void write_gpt_family(const ModelConfig& c, nlohmann::json& j);

/// Sliding-window layout of Qwen2/Qwen3 (layer_types, or use_sliding_window + max_window_layers)
/// and Mistral (sliding_window on every layer).
void parse_sliding_window(JsonObject& root, ModelConfig& c);
void write_sliding_window(const ModelConfig& c, nlohmann::json& j);

}  // namespace core
}  // namespace dschat
