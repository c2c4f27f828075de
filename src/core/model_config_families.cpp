#include "core/model_config_families.h"

#include <cmath>

namespace dschat {
namespace core {
namespace {

void read_dropouts(JsonObject& root, ModelConfig& c, const char* residual, const char* embedding,
                   const char* attention, double fallback) {
  c.dropout = root.get<double>(residual, fallback);
  // One probability serves the embeddings and the residual branches (DeepSpeed-Chat's --dropout
  // sets them all alike); a file whose embedding dropout differs keeps its residual value.
  root.accept({embedding});
  c.attention_dropout = root.get<double>(attention, fallback);
  check_range(root, residual, c.dropout, 0.0, 1.0);
  check_range(root, attention, c.attention_dropout, 0.0, 1.0);
}

// The keys GPT-2, GPT-J and CodeGen share (n_embd, n_layer, ..., resid/embd/attn_pdrop).
void read_gpt2_style(JsonObject& root, ModelConfig& c, SizeKeys& keys, Architecture architecture,
                     int64_t positions, bool tied, double dropout) {
  keys = {"n_embd", "n_layer", "n_head", "n_inner", "n_positions"};
  c.architecture = architecture;
  c.hidden_size = root.require<int64_t>("n_embd");
  c.num_hidden_layers = root.require<int64_t>("n_layer");
  c.num_attention_heads = root.require<int64_t>("n_head");
  c.intermediate_size = root.get<int64_t>("n_inner", 4 * c.hidden_size);
  c.max_position_embeddings = root.get<int64_t>("n_positions", positions);
  c.activation = root.get<std::string>("activation_function", "gelu_new");
  c.layer_norm_eps = root.get<double>("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = root.get<bool>("tie_word_embeddings", tied);
  read_dropouts(root, c, "resid_pdrop", "embd_pdrop", "attn_pdrop", dropout);
}

// GPT-2: learned positions, Conv1D projections (stored transposed), fused c_attn.
void parse_gpt2(JsonObject& root, ModelConfig& c, SizeKeys& keys) {
  read_gpt2_style(root, c, keys, Architecture::Gpt2, 1024, true, 0.1);
  c.scale_attention = root.get<bool>("scale_attn_weights", true);
  c.attention_bias = c.attention_output_bias = true;
  DSCHAT_CHECK(!root.get<bool>("scale_attn_by_inverse_layer_idx", false), Unsupported,
               root.at("scale_attn_by_inverse_layer_idx"), ": true is not supported (Mistral-style GPT-2 scaling)");
  DSCHAT_CHECK(!root.get<bool>("add_cross_attention", false), Unsupported, root.at("add_cross_attention"),
               ": cross-attention (an encoder-decoder GPT-2) is not supported");
  // Upcasting and reordering q.k only changes fp16 rounding; dschat's attention accumulates in fp32.
  root.accept({"reorder_and_upcast_attn", "n_ctx", "summary_type", "summary_use_proj", "summary_activation",
               "summary_proj_to_labels", "summary_first_dropout"});
}

// GPT-Neo: unscaled attention, "global" and "local" (sliding-window) layers.
void parse_gpt_neo(JsonObject& root, ModelConfig& c, SizeKeys& keys) {
  keys = {"hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings"};
  c.architecture = Architecture::GptNeo;
  c.hidden_size = root.require<int64_t>("hidden_size");
  c.num_hidden_layers = root.require<int64_t>("num_layers");
  c.num_attention_heads = root.require<int64_t>("num_heads");
  c.intermediate_size = root.get<int64_t>("intermediate_size", 4 * c.hidden_size);
  c.max_position_embeddings = root.get<int64_t>("max_position_embeddings", 2048);
  c.activation = root.get<std::string>("activation_function", "gelu_new");
  c.layer_norm_eps = root.get<double>("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = root.get<bool>("tie_word_embeddings", true);
  read_dropouts(root, c, "resid_dropout", "embed_dropout", "attention_dropout", 0.0);
  c.scale_attention = false;
  c.attention_output_bias = true;  // q/k/v have none, out_proj has one
  c.sliding_window = root.get<int64_t>("window_size", 256);
  check_range(root, "window_size", c.sliding_window, int64_t{1}, int64_t{1} << 24);
  // attention_types: [[["global", "local"], 12]] = the pattern repeated 12 times.
  std::vector<std::string> layers;
  const nlohmann::json types = root.get<nlohmann::json>("attention_types", nlohmann::json::array());
  const std::string where = root.at("attention_types");
  DSCHAT_CHECK(types.is_array(), ConfigError, where, " must be a list of [[types...], repeat] pairs");
  for (const auto& entry : types) {
    DSCHAT_CHECK(entry.is_array() && entry.size() == 2 && entry[0].is_array() && entry[1].is_number_integer(),
                 ConfigError, where, ": entry ", entry.dump(), " is not [[types...], repeat]");
    for (int64_t r = 0; r < entry[1].get<int64_t>(); ++r) {
      for (const auto& type : entry[0]) {
        DSCHAT_CHECK(type == "global" || type == "local", ConfigError, where, ": attention type ", type.dump(),
                     " is neither \"global\" nor \"local\"");
        layers.push_back(type.get<std::string>());
      }
    }
  }
  if (layers.empty()) layers.assign(c.num_hidden_layers, "global");
  DSCHAT_CHECK(static_cast<int64_t>(layers.size()) == c.num_hidden_layers, ConfigError, where, " gives ",
               layers.size(), " layers, num_layers is ", c.num_hidden_layers);
  for (const auto& type : layers) c.sliding_layers.push_back(type == "local");
  root.accept({"attention_layers", "classifier_dropout"});
}

// GPT-J and CodeGen: parallel attention + MLP over one LayerNorm, interleaved partial rotary,
// LM head with a bias. CodeGen differs only in its fused qkv_proj (models/gptj.cpp).
void parse_gptj(JsonObject& root, ModelConfig& c, SizeKeys& keys) {
  read_gpt2_style(root, c, keys, Architecture::GptJ, 2048, false, 0.0);
  c.rotary_dim = root.get<int64_t>("rotary_dim", 0);
  c.parallel_residual = true;
  c.lm_head_bias = true;
  DSCHAT_CHECK(!c.tie_word_embeddings, Unsupported, root.at("tie_word_embeddings"),
               ": a tied LM head is not supported for ", c.model_type, " (its head has a bias)");
  root.accept({"n_ctx"});
}

void parse_gpt_neox(JsonObject& root, ModelConfig& c, SizeKeys& keys) {
  keys = SizeKeys{};
  c.architecture = Architecture::GptNeox;
  c.hidden_size = root.require<int64_t>("hidden_size");
  c.num_hidden_layers = root.require<int64_t>("num_hidden_layers");
  c.num_attention_heads = root.require<int64_t>("num_attention_heads");
  c.intermediate_size = root.require<int64_t>("intermediate_size");
  c.max_position_embeddings = root.get<int64_t>("max_position_embeddings", 2048);
  c.activation = root.get<std::string>("hidden_act", "gelu");
  c.layer_norm_eps = root.get<double>("layer_norm_eps", 1e-5);
  c.tie_word_embeddings = root.get<bool>("tie_word_embeddings", false);
  c.parallel_residual = root.get<bool>("use_parallel_residual", true);
  c.attention_bias = c.attention_output_bias = root.get<bool>("attention_bias", true);
  read_dropouts(root, c, "hidden_dropout", "hidden_dropout", "attention_dropout", 0.0);
  // transformers < 5 writes rotary_pct / rotary_emb_base; 5 writes them into rope_parameters.
  double partial = root.get<double>("rotary_pct", 0.25);
  c.rope_theta = root.get<double>("rotary_emb_base", 10000.0);
  const nlohmann::json rope = root.get<nlohmann::json>("rope_parameters", nlohmann::json::object());
  if (rope.is_object() && rope.contains("partial_rotary_factor")) partial = rope["partial_rotary_factor"].get<double>();
  c.rope_scaling = parse_rope(root, c);
  DSCHAT_CHECK(partial > 0.0 && partial <= 1.0, ConfigError, root.at("rotary_pct"), " must be in (0, 1], got ",
               partial);
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.hidden_size / c.num_attention_heads) * partial);
  root.accept({"classifier_dropout", "use_cache", "rope_scaling"});
}

void parse_bloom(JsonObject& root, ModelConfig& c, SizeKeys& keys) {
  keys = {"hidden_size", "n_layer", "n_head", "hidden_size", "seq_length"};
  c.architecture = Architecture::Bloom;
  c.hidden_size = root.get<int64_t>("hidden_size", root.get<int64_t>("n_embed", 0));
  c.num_hidden_layers = root.require<int64_t>("n_layer");
  c.num_attention_heads = root.require<int64_t>("n_head");
  c.intermediate_size = 4 * c.hidden_size;
  // ALiBi has no position table; this only bounds generation and planning.
  c.max_position_embeddings = root.get<int64_t>("seq_length", 2048);
  c.activation = "gelu_new";  // bloom_gelu: the tanh approximation
  c.layer_norm_eps = root.get<double>("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = root.get<bool>("tie_word_embeddings", true);
  c.residual_post_layernorm = root.get<bool>("apply_residual_connection_post_layernorm", false);
  c.attention_bias = c.attention_output_bias = true;
  read_dropouts(root, c, "hidden_dropout", "hidden_dropout", "attention_dropout", 0.0);
  DSCHAT_CHECK(!root.get<bool>("slow_but_exact", false), Unsupported, root.at("slow_but_exact"),
               ": true (sliced tensor-parallel linear layers of Megatron) is not supported");
  root.accept({"pretraining_tp", "n_embed", "masked_softmax_fusion", "offset_alibi", "unk_token_id",
               "skip_bias_add", "skip_bias_add_qkv", "attention_softmax_in_fp32", "use_cache"});
}

}  // namespace

bool parse_gpt_family(JsonObject& root, ModelConfig& c, SizeKeys& keys) {
  const std::string& type = c.model_type;
  if (type == "gpt2") {
    parse_gpt2(root, c, keys);
  } else if (type == "gpt_neo") {
    parse_gpt_neo(root, c, keys);
  } else if (type == "gptj" || type == "codegen") {
    parse_gptj(root, c, keys);
  } else if (type == "gpt_neox") {
    parse_gpt_neox(root, c, keys);
  } else if (type == "bloom") {
    parse_bloom(root, c, keys);
  } else {
    return false;
  }
  c.num_key_value_heads = c.num_attention_heads;
  return true;
}

void write_gpt_family(const ModelConfig& c, nlohmann::json& j) {
  j.erase("hidden_size");
  j.erase("num_hidden_layers");
  j.erase("num_attention_heads");
  j.erase("max_position_embeddings");
  const std::string& type = c.model_type;
  if (type == "gpt2" || type == "gptj" || type == "codegen") {
    j["architectures"] = {type == "gpt2" ? "GPT2LMHeadModel" : type == "gptj" ? "GPTJForCausalLM" : "CodeGenForCausalLM"};
    j["n_embd"] = c.hidden_size;
    j["n_layer"] = c.num_hidden_layers;
    j["n_head"] = c.num_attention_heads;
    j["n_inner"] = c.intermediate_size;
    j["n_positions"] = c.max_position_embeddings;
    j["activation_function"] = c.activation;
    j["layer_norm_epsilon"] = c.layer_norm_eps;
    j["resid_pdrop"] = j["embd_pdrop"] = c.dropout;
    j["attn_pdrop"] = c.attention_dropout;
    if (type == "gpt2") j["scale_attn_weights"] = c.scale_attention;
    if (type != "gpt2") j["rotary_dim"] = c.rotary_dims();
    if (type == "codegen") j["n_ctx"] = c.max_position_embeddings;
  } else if (type == "gpt_neo") {
    j["architectures"] = {"GPTNeoForCausalLM"};
    j["hidden_size"] = c.hidden_size;
    j["num_layers"] = c.num_hidden_layers;
    j["num_heads"] = c.num_attention_heads;
    j["intermediate_size"] = c.intermediate_size;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["activation_function"] = c.activation;
    j["layer_norm_epsilon"] = c.layer_norm_eps;
    j["window_size"] = c.sliding_window;
    j["resid_dropout"] = j["embed_dropout"] = c.dropout;
    j["attention_dropout"] = c.attention_dropout;
    nlohmann::json types = nlohmann::json::array();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      types.push_back(nlohmann::json::array({nlohmann::json::array({c.is_sliding_layer(i) ? "local" : "global"}), 1}));
    }
    j["attention_types"] = types;
  } else if (type == "gpt_neox") {
    j["architectures"] = {"GPTNeoXForCausalLM"};
    j["hidden_size"] = c.hidden_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["intermediate_size"] = c.intermediate_size;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["hidden_act"] = c.activation;
    j["layer_norm_eps"] = c.layer_norm_eps;
    j["use_parallel_residual"] = c.parallel_residual;
    j["attention_bias"] = c.attention_bias;
    j["hidden_dropout"] = c.dropout;
    j["attention_dropout"] = c.attention_dropout;
    const double partial = static_cast<double>(c.rotary_dims()) / static_cast<double>(c.head_dim);
    j["rotary_pct"] = partial;
    j["rotary_emb_base"] = c.rope_theta;
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}, {"partial_rotary_factor", partial}};
  } else if (type == "bloom") {
    j["architectures"] = {"BloomForCausalLM"};
    j["hidden_size"] = c.hidden_size;
    j["n_layer"] = c.num_hidden_layers;
    j["n_head"] = c.num_attention_heads;
    j["seq_length"] = c.max_position_embeddings;
    j["layer_norm_epsilon"] = c.layer_norm_eps;
    j["apply_residual_connection_post_layernorm"] = c.residual_post_layernorm;
    j["hidden_dropout"] = c.dropout;
    j["attention_dropout"] = c.attention_dropout;
  }
}

void parse_sliding_window(JsonObject& root, ModelConfig& c) {
  const std::optional<int64_t> window = root.get_optional<int64_t>("sliding_window");
  if (c.model_type == "mistral") {
    c.sliding_window = window.value_or(0);
    if (c.sliding_window > 0) c.sliding_layers.assign(c.num_hidden_layers, true);
    root.accept({"layer_types"});
    return;
  }
  // Qwen2/Qwen3: layer_types when written, else transformers' default from use_sliding_window.
  const bool enabled = root.get<bool>("use_sliding_window", false);
  const int64_t max_window_layers = root.get<int64_t>("max_window_layers", 28);
  c.sliding_window = enabled ? window.value_or(4096) : 0;
  if (auto types = root.get_optional<std::vector<std::string>>("layer_types")) {
    DSCHAT_CHECK(static_cast<int64_t>(types->size()) == c.num_hidden_layers, ConfigError, root.at("layer_types"),
                 " has ", types->size(), " entries, num_hidden_layers is ", c.num_hidden_layers);
    for (const auto& type : *types) {
      DSCHAT_CHECK(type == "full_attention" || type == "sliding_attention", Unsupported, root.at("layer_types"),
                   ": layer type '", type, "' is not supported (supported: full_attention, sliding_attention)");
      c.sliding_layers.push_back(type == "sliding_attention" && enabled);
    }
  } else if (c.sliding_window > 0) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.sliding_layers.push_back(i >= max_window_layers);
  }
  bool any = false;
  for (bool sliding : c.sliding_layers) any = any || sliding;
  if (!any) {
    c.sliding_window = 0;
    c.sliding_layers.clear();
  }
  if (c.sliding_window > 0) check_range(root, "sliding_window", c.sliding_window, int64_t{1}, int64_t{1} << 24);
}

void write_sliding_window(const ModelConfig& c, nlohmann::json& j) {
  if (c.model_type == "mistral") {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    return;
  }
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    types.push_back(c.is_sliding_layer(i) ? "sliding_attention" : "full_attention");
  }
  j["layer_types"] = types;
  j["use_sliding_window"] = c.sliding_window > 0;
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  j["max_window_layers"] = c.num_hidden_layers;
}

}  // namespace core
}  // namespace dschat
