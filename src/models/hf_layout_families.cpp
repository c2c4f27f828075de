#include "models/hf_layout_families.h"

#include "core/strings.h"

#include "dschat/core/error.h"

namespace dschat {
namespace models {
namespace {

using core::ends_with;

using core::Architecture;


// "h.0.attn.c_attn.weight" split at `module` ("c_attn."): {"h.0.attn.", "weight"}; empty when absent.
bool split_at(const std::string& name, const std::string& module, std::string* prefix, std::string* leaf) {
  const auto at = name.find(module);
  if (at == std::string::npos || name.find('.', at + module.size()) != std::string::npos) return false;
  *prefix = name.substr(0, at);
  *leaf = name.substr(at + module.size());
  return true;
}

std::string replace_once(const std::string& name, const std::string& from, const std::string& to) {
  const auto at = name.find(from);
  return at == std::string::npos ? name : name.substr(0, at) + to + name.substr(at + from.size());
}

// Checkpoint buffers that are not parameters (causal masks, rotary tables).
bool is_buffer(const std::string& name) {
  for (const char* suffix : {".attn.bias", ".attn.masked_bias", ".attn.causal_mask", ".attention.bias",
                             ".attention.masked_bias", "rotary_emb.inv_freq", ".attn.attention.bias",
                             ".attn.attention.masked_bias"}) {
    if (ends_with(name, suffix)) return true;
  }
  return false;
}

// The rows of q_proj / k_proj ([heads * D, in], or a bias [heads * D]) reordered within the first
// `rotary` dims of each head: interleaved pairs (2i, 2i + 1) -> rotate-half (i, i + R / 2)
// (`to_half`), or back.
torch::Tensor reorder_rotary_rows(const torch::Tensor& t, int64_t head_dim, int64_t rotary, bool to_half) {
  std::vector<int64_t> order(head_dim);
  for (int64_t j = 0; j < head_dim; ++j) order[j] = j;
  for (int64_t i = 0; i < rotary / 2; ++i) {
    if (to_half) {
      order[i] = 2 * i;
      order[i + rotary / 2] = 2 * i + 1;
    } else {
      order[2 * i] = i;
      order[2 * i + 1] = i + rotary / 2;
    }
  }
  torch::Tensor index = torch::tensor(order, torch::kInt64).to(t.device());  // [D]
  const int64_t heads = t.size(0) / head_dim;
  std::vector<int64_t> shape = {heads, head_dim};
  for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
  return t.reshape(shape).index_select(1, index).reshape(t.sizes()).contiguous();  // [heads * D, ...]
}

// Per-head fused [q; k; v] rows (GPT-NeoX, BLOOM): [heads * 3 * D, ...] -> q, k, v [heads * D, ...].
std::vector<torch::Tensor> split_per_head(const torch::Tensor& t, int64_t heads, int64_t head_dim) {
  std::vector<int64_t> shape = {heads, 3, head_dim};
  for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
  torch::Tensor grouped = t.reshape(shape);  // [heads, 3, D, ...]
  std::vector<int64_t> part_shape = {heads * head_dim};
  for (int64_t d = 1; d < t.dim(); ++d) part_shape.push_back(t.size(d));
  std::vector<torch::Tensor> out;
  for (int64_t part = 0; part < 3; ++part) out.push_back(grouped.select(1, part).reshape(part_shape).contiguous());
  return out;
}

void check_rows(const torch::Tensor& t, int64_t rows, const std::string& name, const std::string& source) {
  DSCHAT_CHECK(t.dim() >= 1 && t.size(0) == rows, FormatError, source, ": '", name, "' has shape ", t.sizes(),
               ", expected ", rows, " rows (the fused q, k and v projections)");
}

// One family's tensors: `from` (checkpoint -> modules) and `to` (modules -> checkpoint) per name.
class FamilyLayout {
 public:
  explicit FamilyLayout(const core::ModelConfig& config) : c_(config) {}

  NamedTensors from_hf(const NamedTensors& weights, const std::string& source) const {
    NamedTensors out;
    for (const auto& [name, tensor] : weights) {
      if (is_buffer(name)) continue;
      std::string prefix, leaf;
      const int64_t hidden = c_.num_attention_heads * c_.head_dim;
      if (fused_qkv_name().size() && split_at(name, fused_qkv_name(), &prefix, &leaf)) {
        check_rows(arch() == Architecture::Gpt2 && leaf == "weight" ? tensor.t() : tensor, 3 * hidden, name, source);
        std::vector<torch::Tensor> qkv = split_qkv(tensor, leaf);
        const char* parts[] = {"q_proj.", "k_proj.", "v_proj."};
        for (int p = 0; p < 3; ++p) out[prefix + parts[p] + leaf] = qkv[p];
        continue;
      }
      out[from_name(name)] = from_tensor(name, tensor);
    }
    if (interleaved_rotary()) reorder_qk(out, /*to_half=*/true);
    return out;
  }

  NamedTensors to_hf(const NamedTensors& tensors) const {
    NamedTensors in = tensors;
    if (interleaved_rotary()) reorder_qk(in, /*to_half=*/false);
    NamedTensors out;
    for (const auto& [name, tensor] : in) {
      DSCHAT_CHECK(name.find(".lora_") == std::string::npos || (fused_qkv_name().empty() && !interleaved_rotary()),
                   Unsupported, "'", name, "': unfused LoRA adapters cannot be written in ", c_.model_type,
                   "'s layout (its q/k/v are fused or reordered there); fuse them first");
      std::string prefix, leaf;
      if (fused_qkv_name().size() && split_at(name, "q_proj.", &prefix, &leaf)) {
        const torch::Tensor& q = tensor;
        const torch::Tensor& k = in.at(prefix + "k_proj." + leaf);
        const torch::Tensor& v = in.at(prefix + "v_proj." + leaf);
        out[prefix + fused_qkv_name() + leaf] = join_qkv(q, k, v, leaf);
        continue;
      }
      if (fused_qkv_name().size() && (split_at(name, "k_proj.", &prefix, &leaf) ||
                                      split_at(name, "v_proj.", &prefix, &leaf))) {
        continue;  // written with q_proj
      }
      out[to_name(name)] = to_tensor(name, tensor);
    }
    return out;
  }

 private:
  Architecture arch() const { return c_.architecture; }
  bool interleaved_rotary() const { return arch() == Architecture::GptJ; }

  std::string fused_qkv_name() const {
    switch (arch()) {
      case Architecture::Gpt2: return "c_attn.";
      case Architecture::GptNeox: return "query_key_value.";
      case Architecture::Bloom: return "query_key_value.";
      case Architecture::GptJ: return c_.model_type == "codegen" ? "qkv_proj." : "";
      default: return "";
    }
  }

  // GPT-2's Conv1D weights are [in, out].
  bool is_conv1d(const std::string& name) const {
    return arch() == Architecture::Gpt2 && ends_with(name, ".weight") &&
           (name.find(".attn.c_proj.") != std::string::npos || name.find(".mlp.c_fc.") != std::string::npos ||
            name.find(".mlp.c_proj.") != std::string::npos);
  }

  std::string from_name(const std::string& name) const {
    return arch() == Architecture::GptNeo ? replace_once(name, ".attn.attention.", ".attn.") : name;
  }
  std::string to_name(const std::string& name) const {
    return arch() == Architecture::GptNeo ? replace_once(name, ".attn.", ".attn.attention.") : name;
  }
  torch::Tensor from_tensor(const std::string& name, const torch::Tensor& t) const {
    return is_conv1d(name) ? t.t().contiguous() : t;
  }
  torch::Tensor to_tensor(const std::string& name, const torch::Tensor& t) const {
    return is_conv1d(name) ? t.t().contiguous() : t;
  }

  std::vector<torch::Tensor> split_qkv(const torch::Tensor& t, const std::string& leaf) const {
    const int64_t hidden = c_.num_attention_heads * c_.head_dim;
    if (arch() == Architecture::Gpt2) {  // Conv1D [in, 3H] (bias [3H]): q, k, v one after another
      torch::Tensor rows = leaf == "weight" ? t.t() : t;  // [3H, ...]
      auto parts = rows.split(hidden, 0);
      return {parts[0].contiguous(), parts[1].contiguous(), parts[2].contiguous()};
    }
    if (arch() == Architecture::GptJ) {  // CodeGen: [4 shards, (q, v, k), H / 4, in]
      torch::Tensor grouped = t.reshape({4, 3, hidden / 4, t.size(1)});
      auto part = [&](int64_t i) { return grouped.select(1, i).reshape({hidden, t.size(1)}).contiguous(); };
      return {part(0), part(2), part(1)};
    }
    return split_per_head(t, c_.num_attention_heads, c_.head_dim);  // NeoX, BLOOM
  }

  torch::Tensor join_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const std::string& leaf) const {
    const int64_t heads = c_.num_attention_heads, d = c_.head_dim, hidden = heads * d;
    if (arch() == Architecture::Gpt2) {
      torch::Tensor rows = torch::cat({q, k, v}, 0);  // [3H, ...]
      return (leaf == "weight" ? rows.t() : rows).contiguous();
    }
    if (arch() == Architecture::GptJ) {  // CodeGen
      const int64_t in = q.size(1);
      auto shard = [&](const torch::Tensor& t) { return t.reshape({4, 1, hidden / 4, in}); };
      return torch::cat({shard(q), shard(v), shard(k)}, 1).reshape({3 * hidden, in}).contiguous();
    }
    std::vector<int64_t> shape = {heads, 1, d};
    for (int64_t i = 1; i < q.dim(); ++i) shape.push_back(q.size(i));
    torch::Tensor joined = torch::cat({q.reshape(shape), k.reshape(shape), v.reshape(shape)}, 1);  // [heads, 3, D, ...]
    std::vector<int64_t> out_shape = {3 * hidden};
    for (int64_t i = 1; i < q.dim(); ++i) out_shape.push_back(q.size(i));
    return joined.reshape(out_shape).contiguous();
  }

  void reorder_qk(NamedTensors& tensors, bool to_half) const {
    for (auto& [name, tensor] : tensors) {
      if (name.find(".q_proj.") == std::string::npos && name.find(".k_proj.") == std::string::npos) continue;
      if (name.find(".lora_") != std::string::npos) continue;  // refused by to_hf; from_hf never has them
      tensor = reorder_rotary_rows(tensor, c_.head_dim, c_.rotary_dims(), to_half);
    }
  }

  const core::ModelConfig& c_;
};

}  // namespace

bool backbone_layout_is_identity(const core::ModelConfig& config) {
  return config.architecture == Architecture::Opt || config.architecture == Architecture::Llama;
}

NamedTensors backbone_from_hf(const core::ModelConfig& config, const NamedTensors& weights, const std::string& source) {
  if (backbone_layout_is_identity(config)) {
    NamedTensors out;
    for (const auto& [name, tensor] : weights) {
      if (!ends_with(name, "rotary_emb.inv_freq")) out.emplace(name, tensor);
    }
    return out;
  }
  return FamilyLayout(config).from_hf(weights, source);
}

NamedTensors backbone_to_hf(const core::ModelConfig& config, const NamedTensors& tensors) {
  if (backbone_layout_is_identity(config)) return tensors;
  return FamilyLayout(config).to_hf(tensors);
}

}  // namespace models
}  // namespace dschat
