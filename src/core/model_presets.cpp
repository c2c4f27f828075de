// Architecture presets (the published shapes of OPT and LLaMA-2), so that `--init random` can
// build any of them without downloading weights.
#include <algorithm>
#include <cctype>

#include "dschat/core/model_config.h"

namespace dschat {
namespace core {
namespace {

struct OptShape {
  const char* name;
  int64_t hidden, layers, heads, ffn, word_embed_proj_dim;
};
// facebook/opt-* config.json values; 350m is the post-LN variant with 512-d embeddings.
const OptShape kOptShapes[] = {
    {"opt-125m", 768, 12, 12, 3072, 768},       {"opt-350m", 1024, 24, 16, 4096, 512},
    {"opt-1.3b", 2048, 24, 32, 8192, 2048},     {"opt-2.7b", 2560, 32, 32, 10240, 2560},
    {"opt-6.7b", 4096, 32, 32, 16384, 4096},    {"opt-13b", 5120, 40, 40, 20480, 5120},
    {"opt-30b", 7168, 48, 56, 28672, 7168},     {"opt-66b", 9216, 64, 72, 36864, 9216},
    {"opt-175b", 12288, 96, 96, 49152, 12288},
};

struct LlamaShape {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, intermediate;
};
// meta-llama/Llama-2-*-hf config.json values; 70b uses grouped-query attention (8 KV heads).
const LlamaShape kLlamaShapes[] = {
    {"llama-2-7b", 4096, 32, 32, 32, 11008},
    {"llama-2-13b", 5120, 40, 40, 40, 13824},
    {"llama-2-70b", 8192, 80, 64, 8, 28672},
};

ModelConfig opt_preset(const OptShape& s) {
  ModelConfig c;
  c.architecture = Architecture::Opt;
  c.model_type = "opt";
  c.vocab_size = 50272;
  c.hidden_size = s.hidden;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = c.num_key_value_heads = s.heads;
  c.head_dim = s.hidden / s.heads;
  c.intermediate_size = s.ffn;
  c.word_embed_proj_dim = s.word_embed_proj_dim;
  c.do_layer_norm_before = std::string(s.name) != "opt-350m";
  c.max_position_embeddings = 2048;
  c.torch_dtype = "float16";
  c.bos_token_id = 2;
  c.eos_token_id = 2;
  c.pad_token_id = 1;
  return c;
}

ModelConfig llama_preset(const LlamaShape& s) {
  ModelConfig c;
  c.architecture = Architecture::Llama;
  c.model_type = "llama";
  c.vocab_size = 32000;
  c.hidden_size = s.hidden;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.hidden / s.heads;
  c.intermediate_size = s.intermediate;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5;
  c.activation = "silu";
  c.dropout = 0.0;
  c.tie_word_embeddings = false;
  c.torch_dtype = "float16";
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

// "facebook/OPT-1.3B" -> "opt-1.3b"; "meta-llama/Llama-2-7b-hf" -> "llama-2-7b".
std::string canonical(std::string name) {
  auto slash = name.rfind('/');
  if (slash != std::string::npos) name = name.substr(slash + 1);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  for (const char* suffix : {"-hf", "-chat-hf", "-chat"}) {
    std::string sfx = suffix;
    if (name.size() > sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
      name.resize(name.size() - sfx.size());
      break;
    }
  }
  return name;
}

}  // namespace

std::optional<ModelConfig> model_preset(const std::string& name) {
  std::string key = canonical(name);
  for (const auto& s : kOptShapes) {
    if (key == s.name) return opt_preset(s);
  }
  for (const auto& s : kLlamaShapes) {
    if (key == s.name) return llama_preset(s);
  }
  return std::nullopt;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& s : kOptShapes) names.emplace_back(s.name);
  for (const auto& s : kLlamaShapes) names.emplace_back(s.name);
  return names;
}

}  // namespace core
}  // namespace dschat
