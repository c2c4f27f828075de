#pragma once
// The architecture hyper-parameters of a model: Hugging Face `config.json` as a typed struct.
// Parsed only here (from the checkpoint's config.json, or from a preset for `--init random`).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dschat {
namespace core {

/// The decoder families dschat builds. Llama also covers Mistral, Qwen2/2.5 and Qwen3 (their
/// differences are config flags: q/k/v biases, q/k RMSNorm, sliding windows); GptJ also covers
/// CodeGen (the same block; only the checkpoint's fused qkv_proj layout differs).
enum class Architecture { Opt, Llama, Gpt2, GptNeo, GptJ, GptNeox, Bloom };

/// LLaMA rotary scaling (HF `rope_scaling` / `rope_parameters`). Types: default, linear,
/// dynamic (NTK), llama3.
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;                    // llama3
  double high_freq_factor = 4.0;                   // llama3
  int64_t original_max_position_embeddings = 0;    // llama3; 0 = max_position_embeddings
};

struct ModelConfig {
  Architecture architecture = Architecture::Opt;
  std::string model_type = "opt";  // config.json's model_type: opt, llama, mistral, qwen2, qwen3, gpt2,
                                   // gpt_neo, gptj, codegen, gpt_neox, bloom
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // == num_attention_heads unless grouped-query attention
  int64_t head_dim = 0;             // hidden_size / num_attention_heads unless given
  int64_t intermediate_size = 0;    // OPT: ffn_dim
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = true;
  std::string torch_dtype = "float32";  // dtype the checkpoint was saved in
  std::string activation = "relu";      // OPT activation_function; LLaMA hidden_act
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;

  // OPT
  bool do_layer_norm_before = true;  // false: post-LN (opt-350m)
  int64_t word_embed_proj_dim = 0;   // != hidden_size: project_in / project_out exist
  bool enable_bias = true;
  bool layer_norm_elementwise_affine = true;
  bool remove_final_layer_norm = false;
  double dropout = 0.1;
  double attention_dropout = 0.0;
  double activation_dropout = 0.0;

  // LLaMA
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool attention_bias = false;  // bias on q/k/v (and on the output projection unless
  bool attention_output_bias = false;  // ... this says otherwise: Qwen2 has q/k/v biases only)
  bool mlp_bias = false;
  bool qk_norm = false;  // Qwen3: RMSNorm over each head of q and k before rotary

  // Sliding-window attention (Mistral, Qwen2/3 layer_types, GPT-Neo's "local" layers): a query
  // attends to the `sliding_window` most recent keys (itself included). sliding_layers[i] says
  // whether layer i is windowed; empty = no windowed layer.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;

  // GPT-2, GPT-Neo, GPT-J, CodeGen, GPT-NeoX, BLOOM (LayerNorm decoders)
  double layer_norm_eps = 1e-5;
  int64_t rotary_dim = 0;         // rotary on the first rotary_dim dims of each head; 0 = head_dim
  bool parallel_residual = false; // x + attn(ln(x)) + mlp(ln'(x)) (GPT-J/CodeGen: one shared LayerNorm)
  bool scale_attention = true;    // GPT-Neo: q.k is not divided by sqrt(head_dim)
  bool lm_head_bias = false;      // GPT-J, CodeGen
  bool residual_post_layernorm = false;  // BLOOM's apply_residual_connection_post_layernorm

  /// Width of the backbone's output: word_embed_proj_dim for OPT, hidden_size otherwise. The
  /// value head of reward and critic models reads this many features.
  int64_t output_dim() const;
  /// The dims of each head that rotary embeddings rotate (rotary_dim, or head_dim).
  int64_t rotary_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  /// Whether layer `layer` uses sliding-window attention.
  bool is_sliding_layer(int64_t layer) const {
    return sliding_window > 0 && layer < static_cast<int64_t>(sliding_layers.size()) && sliding_layers[layer];
  }
};

/// Parses config.json text; `where` (the file path) prefixes every error. Throws
/// core::ConfigError for a missing key, a bad type or value, an inconsistent combination
/// (e.g. hidden_size not divisible by num_attention_heads) and core::Unsupported for an unknown
/// model_type or rope type (listing the supported ones).
ModelConfig parse_model_config(const std::string& json_text, const std::string& where);

/// "opt, llama, mistral, ...": the model_type values parse_model_config reads.
std::string supported_model_types();

/// Reads `<dir>/config.json`.
ModelConfig load_model_config(const std::string& model_dir);

/// HF-compatible config.json text for `config` (what save writes and transformers reads back).
std::string model_config_to_json(const ModelConfig& config);

/// Architecture presets for `--init random`: "opt-125m" ... "opt-175b", "llama-2-7b", "llama-2-13b",
/// "llama-2-70b", and the published shapes of GPT-2, Pythia (GPT-NeoX), BLOOM, Qwen2.5, Qwen3 and
/// Mistral (model_preset_names lists them; an org prefix is accepted: "facebook/opt-1.3b",
/// "meta-llama/Llama-2-7b-hf", "Qwen/Qwen2.5-0.5B").
std::optional<ModelConfig> model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

}  // namespace core
}  // namespace dschat
