#include "dschat/core/model_config.h"

#include "core/json_object.h"
#include "core/log.h"
#include "core/model_config_families.h"

namespace dschat {
namespace core {
namespace {

// Keys transformers writes that do not change the computation; read and ignored.
const std::vector<std::string> kIgnoredKeys = {
    "_name_or_path", "architectures", "transformers_version", "use_cache", "init_std",
    "initializer_range", "layerdrop", "prefix", "output_projection",
    "pretraining_tp", "model_name", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "scale_embedding", "is_encoder_decoder", "decoder_start_token_id",
    "id2label", "label2id", "problem_type", "tokenizer_class", "task_specific_params",
    "use_bfloat16", "chunk_size_feed_forward", "tf_legacy_loss", "finetuning_task"};

void parse_opt(JsonObject& root, ModelConfig& c) {
  c.architecture = Architecture::Opt;
  c.hidden_size = root.require<int64_t>("hidden_size");
  c.num_hidden_layers = root.require<int64_t>("num_hidden_layers");
  c.num_attention_heads = root.require<int64_t>("num_attention_heads");
  c.num_key_value_heads = c.num_attention_heads;
  c.intermediate_size = root.require<int64_t>("ffn_dim");
  c.max_position_embeddings = root.get<int64_t>("max_position_embeddings", 2048);
  c.do_layer_norm_before = root.get<bool>("do_layer_norm_before", true);
  c.word_embed_proj_dim = root.get<int64_t>("word_embed_proj_dim", c.hidden_size);
  c.enable_bias = root.get<bool>("enable_bias", true);
  c.layer_norm_elementwise_affine = root.get<bool>("layer_norm_elementwise_affine", true);
  c.remove_final_layer_norm = root.get<bool>("_remove_final_layer_norm", false);
  c.activation = root.get<std::string>("activation_function", "relu");
  c.dropout = root.get<double>("dropout", 0.1);
  c.attention_dropout = root.get<double>("attention_dropout", 0.0);
  c.activation_dropout = root.get<double>("activation_dropout", 0.0);
  c.tie_word_embeddings = root.get<bool>("tie_word_embeddings", true);
  check_range(root, "word_embed_proj_dim", c.word_embed_proj_dim, int64_t{1}, int64_t{1} << 20);
  check_range(root, "dropout", c.dropout, 0.0, 1.0);
  check_range(root, "attention_dropout", c.attention_dropout, 0.0, 1.0);
}

void parse_llama(JsonObject& root, ModelConfig& c) {
  c.architecture = Architecture::Llama;
  c.hidden_size = root.require<int64_t>("hidden_size");
  c.num_hidden_layers = root.require<int64_t>("num_hidden_layers");
  c.num_attention_heads = root.require<int64_t>("num_attention_heads");
  c.num_key_value_heads = root.get<int64_t>("num_key_value_heads", c.num_attention_heads);
  c.intermediate_size = root.require<int64_t>("intermediate_size");
  c.max_position_embeddings = root.get<int64_t>("max_position_embeddings", 2048);
  c.rms_norm_eps = root.get<double>("rms_norm_eps", 1e-6);
  c.rope_theta = root.get<double>("rope_theta", 10000.0);
  c.rope_scaling = parse_rope(root, c);
  // Qwen2 has biases on q/k/v only; LLaMA, Mistral and Qwen3 put attention_bias on all four.
  c.attention_bias = c.model_type == "qwen2" || root.get<bool>("attention_bias", false);
  c.attention_output_bias = c.model_type != "qwen2" && c.attention_bias;
  c.mlp_bias = root.get<bool>("mlp_bias", false);
  c.qk_norm = c.model_type == "qwen3";
  c.activation = root.get<std::string>("hidden_act", "silu");
  c.attention_dropout = root.get<double>("attention_dropout", 0.0);
  c.dropout = 0.0;
  c.tie_word_embeddings = root.get<bool>("tie_word_embeddings", false);
  if (auto head_dim = root.get_optional<int64_t>("head_dim")) c.head_dim = *head_dim;
  if (c.model_type == "qwen3" && c.head_dim == 0) c.head_dim = 128;  // Qwen3Config's default
  if (c.model_type != "llama") parse_sliding_window(root, c);
  DSCHAT_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, ConfigError,
               root.at("num_key_value_heads"), " must divide num_attention_heads (", c.num_attention_heads,
               "), got ", c.num_key_value_heads);
  check_range(root, "rms_norm_eps", c.rms_norm_eps, 0.0, 1.0);
}

}  // namespace

RopeScaling parse_rope(JsonObject& root, ModelConfig& config) {
  RopeScaling rope;
  // transformers >= 5 writes "rope_parameters" (with rope_theta inside); older versions write
  // "rope_theta" + "rope_scaling" ({"type"|"rope_type": ..., "factor": ...}).
  std::optional<JsonObject> block = root.object("rope_parameters");
  if (!block) block = root.object("rope_scaling");
  if (!block) return rope;
  rope.type = block->get<std::string>("rope_type", block->get<std::string>("type", "default"));
  if (auto theta = block->get_optional<double>("rope_theta")) config.rope_theta = *theta;
  rope.factor = block->get<double>("factor", 1.0);
  rope.low_freq_factor = block->get<double>("low_freq_factor", 1.0);
  rope.high_freq_factor = block->get<double>("high_freq_factor", 4.0);
  rope.original_max_position_embeddings = block->get<int64_t>("original_max_position_embeddings", 0);
  block->accept({"partial_rotary_factor"});
  DSCHAT_CHECK(rope.type == "default" || rope.type == "linear" || rope.type == "dynamic" || rope.type == "llama3",
               Unsupported, block->where(), ": rope type '", rope.type,
               "' is not supported (supported: default, linear, dynamic, llama3)");
  DSCHAT_CHECK(rope.type == "default" || rope.factor >= 1.0, ConfigError, block->at("factor"),
               " must be >= 1 for rope type '", rope.type, "', got ", rope.factor);
  DSCHAT_CHECK(rope.type != "llama3" || rope.high_freq_factor > rope.low_freq_factor, ConfigError,
               block->where(), ": high_freq_factor (", rope.high_freq_factor, ") must exceed low_freq_factor (",
               rope.low_freq_factor, ")");
  block->finish();
  return rope;
}

int64_t ModelConfig::output_dim() const {
  return architecture == Architecture::Opt ? word_embed_proj_dim : hidden_size;
}

std::string supported_model_types() {
  return "opt, llama, mistral, qwen2, qwen3, gpt2, gpt_neo, gptj, codegen, gpt_neox, bloom";
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& where) {
  nlohmann::json json = parse_json_text(json_text, where);
  JsonObject root(json, where);
  ModelConfig c;
  c.model_type = root.require<std::string>("model_type");
  SizeKeys keys;
  if (c.model_type == "opt") {
    parse_opt(root, c);
    keys.ffn = "ffn_dim";
  } else if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2" ||
             c.model_type == "qwen3") {
    parse_llama(root, c);
  } else if (!parse_gpt_family(root, c, keys)) {
    DSCHAT_THROW(Unsupported, where, ": model_type '", c.model_type, "' is not supported (supported: ",
                 supported_model_types(), ")");
  }
  c.vocab_size = root.require<int64_t>("vocab_size");
  std::string dtype = root.get<std::string>("torch_dtype", "");
  c.torch_dtype = root.get<std::string>("dtype", dtype.empty() ? "float32" : dtype);  // transformers 5 writes "dtype"
  c.bos_token_id = root.get_optional<int64_t>("bos_token_id");
  c.eos_token_id = root.get_optional<int64_t>("eos_token_id");
  c.pad_token_id = root.get_optional<int64_t>("pad_token_id");
  if (c.head_dim == 0 && c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;

  check_range(root, "vocab_size", c.vocab_size, int64_t{1}, int64_t{1} << 24);
  check_range(root, keys.hidden, c.hidden_size, int64_t{1}, int64_t{1} << 20);
  check_range(root, keys.layers, c.num_hidden_layers, int64_t{1}, int64_t{4096});
  check_range(root, keys.heads, c.num_attention_heads, int64_t{1}, int64_t{4096});
  check_range(root, keys.positions, c.max_position_embeddings, int64_t{1}, int64_t{1} << 24);
  check_range(root, keys.ffn, c.intermediate_size, int64_t{1}, int64_t{1} << 22);
  DSCHAT_CHECK(c.architecture == Architecture::Llama || c.hidden_size % c.num_attention_heads == 0, ConfigError,
               where, ": ", keys.hidden, " (", c.hidden_size, ") must be divisible by ", keys.heads, " (",
               c.num_attention_heads, ")");
  DSCHAT_CHECK(c.model_type != "codegen" || c.hidden_size % 4 == 0, ConfigError, where, ": n_embd (", c.hidden_size,
               ") must be divisible by 4 (CodeGen's qkv_proj is interleaved over 4 shards)");
  DSCHAT_CHECK(c.rotary_dim == 0 || (c.rotary_dim % 2 == 0 && c.rotary_dim <= c.head_dim), ConfigError, where,
               ": rotary_dim (", c.rotary_dim, ") must be even and at most the head size (", c.head_dim, ")");
  DSCHAT_CHECK(c.torch_dtype == "float32" || c.torch_dtype == "float16" || c.torch_dtype == "bfloat16",
               ConfigError, where, ": torch_dtype must be float32, float16 or bfloat16, got '", c.torch_dtype, "'");
  root.accept(kIgnoredKeys);
  root.accept({"hidden_act", "activation_function", "attention_dropout", "dropout", "activation_dropout",
               "enable_bias", "head_dim", "rope_theta", "rope_scaling", "rope_parameters", "attention_bias",
               "mlp_bias", "rms_norm_eps", "num_key_value_heads", "tie_word_embeddings", "word_embed_proj_dim",
               "do_layer_norm_before", "layer_norm_elementwise_affine", "_remove_final_layer_norm",
               "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype"});
  // Other HF keys are tolerated (configs from newer transformers carry more), but logged.
  for (const auto& key : root.unread_keys()) log_debug(where, ": ignoring key '", key, "'");
  return c;
}

std::string model_config_to_json(const ModelConfig& c) {
  nlohmann::json j;
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = c.torch_dtype;
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id) j["eos_token_id"] = *c.eos_token_id;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  if (c.architecture == Architecture::Opt) {
    j["architectures"] = {"OPTForCausalLM"};
    j["ffn_dim"] = c.intermediate_size;
    j["do_layer_norm_before"] = c.do_layer_norm_before;
    j["word_embed_proj_dim"] = c.word_embed_proj_dim;
    j["enable_bias"] = c.enable_bias;
    j["layer_norm_elementwise_affine"] = c.layer_norm_elementwise_affine;
    j["_remove_final_layer_norm"] = c.remove_final_layer_norm;
    j["activation_function"] = c.activation;
    j["dropout"] = c.dropout;
    j["attention_dropout"] = c.attention_dropout;
    j["activation_dropout"] = c.activation_dropout;
  } else if (c.architecture != Architecture::Llama) {
    write_gpt_family(c, j);
  } else {
    j["architectures"] = {c.model_type == "mistral" ? "MistralForCausalLM"
                          : c.model_type == "qwen2" ? "Qwen2ForCausalLM"
                          : c.model_type == "qwen3" ? "Qwen3ForCausalLM"
                                                    : "LlamaForCausalLM"};
    j["intermediate_size"] = c.intermediate_size;
    j["num_key_value_heads"] = c.num_key_value_heads;
    j["head_dim"] = c.head_dim;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    if (c.model_type != "qwen2") j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
    if (c.model_type != "llama") write_sliding_window(c, j);
    j["hidden_act"] = c.activation;
    j["attention_dropout"] = c.attention_dropout;
    if (c.rope_scaling.type != "default") {
      nlohmann::json rope = {{"rope_type", c.rope_scaling.type}, {"factor", c.rope_scaling.factor}};
      if (c.rope_scaling.type == "llama3") {
        rope["low_freq_factor"] = c.rope_scaling.low_freq_factor;
        rope["high_freq_factor"] = c.rope_scaling.high_freq_factor;
        rope["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
      }
      j["rope_scaling"] = rope;
    }
  }
  return j.dump(2) + "\n";
}

ModelConfig load_model_config(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  nlohmann::json json = read_json_file(path);
  return parse_model_config(json.dump(), path);
}

}  // namespace core
}  // namespace dschat
