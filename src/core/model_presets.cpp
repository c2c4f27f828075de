// Architecture presets (the published config.json shapes of OPT, LLaMA-2, GPT-2, Pythia (GPT-NeoX),
// BLOOM, Qwen2.5, Qwen3 and Mistral), so that `--init random` and `dschat plan` can build any of
// them without downloading weights.
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

// The other families' shapes: hidden, layers, heads, key/value heads, MLP width, vocabulary,
// positions, tied head, head_dim (0 = hidden / heads).
struct FamilyShape {
  const char* name;
  const char* model_type;
  int64_t hidden, layers, heads, kv_heads, intermediate, vocab, positions;
  bool tied;
  int64_t head_dim;
};
const FamilyShape kFamilyShapes[] = {
    // openai-community/gpt2*
    {"gpt2", "gpt2", 768, 12, 12, 12, 3072, 50257, 1024, true, 0},
    {"gpt2-medium", "gpt2", 1024, 24, 16, 16, 4096, 50257, 1024, true, 0},
    {"gpt2-large", "gpt2", 1280, 36, 20, 20, 5120, 50257, 1024, true, 0},
    {"gpt2-xl", "gpt2", 1600, 48, 25, 25, 6400, 50257, 1024, true, 0},
    // EleutherAI/pythia-* (GPT-NeoX)
    {"pythia-70m", "gpt_neox", 512, 6, 8, 8, 2048, 50304, 2048, false, 0},
    {"pythia-160m", "gpt_neox", 768, 12, 12, 12, 3072, 50304, 2048, false, 0},
    {"pythia-410m", "gpt_neox", 1024, 24, 16, 16, 4096, 50304, 2048, false, 0},
    {"pythia-1b", "gpt_neox", 2048, 16, 8, 8, 8192, 50304, 2048, false, 0},
    {"pythia-1.4b", "gpt_neox", 2048, 24, 16, 16, 8192, 50304, 2048, false, 0},
    {"pythia-2.8b", "gpt_neox", 2560, 32, 32, 32, 10240, 50304, 2048, false, 0},
    {"pythia-6.9b", "gpt_neox", 4096, 32, 32, 32, 16384, 50432, 2048, false, 0},
    {"pythia-12b", "gpt_neox", 5120, 36, 40, 40, 20480, 50688, 2048, false, 0},
    // bigscience/bloom-* (ALiBi; bloomz-* share the shapes)
    {"bloom-560m", "bloom", 1024, 24, 16, 16, 4096, 250880, 2048, true, 0},
    {"bloom-1b1", "bloom", 1536, 24, 16, 16, 6144, 250880, 2048, true, 0},
    {"bloom-1b7", "bloom", 2048, 24, 16, 16, 8192, 250880, 2048, true, 0},
    {"bloom-3b", "bloom", 2560, 30, 32, 32, 10240, 250880, 2048, true, 0},
    {"bloom-7b1", "bloom", 4096, 30, 32, 32, 16384, 250880, 2048, true, 0},
    // Qwen/Qwen2.5-* (and -Instruct)
    {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 151936, 32768, true, 0},
    {"qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 151936, 32768, true, 0},
    {"qwen2.5-3b", "qwen2", 2048, 36, 16, 2, 11008, 151936, 32768, true, 0},
    {"qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, 32768, false, 0},
    {"qwen2.5-14b", "qwen2", 5120, 48, 40, 8, 13824, 152064, 32768, false, 0},
    {"qwen2.5-32b", "qwen2", 5120, 64, 40, 8, 27648, 152064, 32768, false, 0},
    {"qwen2.5-72b", "qwen2", 8192, 80, 64, 8, 29568, 152064, 32768, false, 0},
    // Qwen/Qwen3-* (head_dim 128 throughout)
    {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072, 151936, 40960, true, 128},
    {"qwen3-1.7b", "qwen3", 2048, 28, 16, 8, 6144, 151936, 40960, true, 128},
    {"qwen3-4b", "qwen3", 2560, 36, 32, 8, 9728, 151936, 40960, true, 128},
    {"qwen3-8b", "qwen3", 4096, 36, 32, 8, 12288, 151936, 40960, false, 128},
    {"qwen3-14b", "qwen3", 5120, 40, 40, 8, 17408, 151936, 40960, false, 128},
    {"qwen3-32b", "qwen3", 5120, 64, 64, 8, 25600, 151936, 40960, false, 128},
    // mistralai/Mistral-7B-v0.1 (sliding window 4096) and v0.3 (32768-token vocabulary, no window)
    {"mistral-7b-v0.1", "mistral", 4096, 32, 32, 8, 14336, 32000, 32768, false, 0},
    {"mistral-7b-v0.3", "mistral", 4096, 32, 32, 8, 14336, 32768, 32768, false, 0},
};

ModelConfig family_preset(const FamilyShape& s) {
  ModelConfig c;
  c.model_type = s.model_type;
  const std::string type = s.model_type;
  c.architecture = type == "gpt2"       ? Architecture::Gpt2
                   : type == "gpt_neox" ? Architecture::GptNeox
                   : type == "bloom"    ? Architecture::Bloom
                                        : Architecture::Llama;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  c.intermediate_size = s.intermediate;
  c.max_position_embeddings = s.positions;
  c.tie_word_embeddings = s.tied;
  c.dropout = c.attention_dropout = 0.0;
  c.torch_dtype = "bfloat16";
  if (c.architecture == Architecture::Llama) {
    c.activation = "silu";
    const bool qwen = type == "qwen2" || type == "qwen3";
    c.rms_norm_eps = qwen ? 1e-6 : 1e-5;
    c.rope_theta = qwen || std::string(s.name) == "mistral-7b-v0.3" ? 1000000.0 : 10000.0;
    c.attention_bias = type == "qwen2";
    c.qk_norm = type == "qwen3";
    if (std::string(s.name) == "mistral-7b-v0.1") {
      c.sliding_window = 4096;
      c.sliding_layers.assign(s.layers, true);
    }
  } else {
    c.attention_bias = c.attention_output_bias = true;
    c.activation = type == "gpt_neox" ? "gelu" : "gelu_new";
    c.layer_norm_eps = 1e-5;
    if (type == "gpt_neox") {
      c.parallel_residual = true;
      c.rotary_dim = c.head_dim / 4;  // rotary_pct 0.25
    }
  }
  return c;
}

// "facebook/OPT-1.3B" -> "opt-1.3b"; "meta-llama/Llama-2-7b-hf" -> "llama-2-7b".
std::string canonical(std::string name) {
  auto slash = name.rfind('/');
  if (slash != std::string::npos) name = name.substr(slash + 1);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  for (const char* suffix : {"-hf", "-chat-hf", "-chat", "-instruct", "-deduped"}) {
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
  for (const auto& s : kFamilyShapes) {
    if (key == s.name) return family_preset(s);
  }
  return std::nullopt;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& s : kOptShapes) names.emplace_back(s.name);
  for (const auto& s : kLlamaShapes) names.emplace_back(s.name);
  for (const auto& s : kFamilyShapes) names.emplace_back(s.name);
  return names;
}

}  // namespace core
}  // namespace dschat
