#pragma once
// The LayerNorm decoder block shared by GPT-2, GPT-Neo, GPT-J, CodeGen, GPT-NeoX and BLOOM, and
// the backbone around it. The families differ in switches (ModelConfig: parallel residual with
// one or two norms, BLOOM's residual after the norm, learned/rotary/ALiBi positions, unscaled or
// windowed attention) and in their module names, which GptNames carries so parameter names
// follow each family's checkpoint (wte / word_embeddings / embed_in, h / layers, ...). Fused
// q/k/v projections of a checkpoint are split into q_proj, k_proj, v_proj on loading
// (models/checkpoint_layout.h), so every family runs the one nn::Attention.

#include <string>

#include "dschat/models/backbone.h"
#include "dschat/nn/activation.h"
#include "dschat/nn/attention.h"
#include "dschat/nn/embedding.h"
#include "dschat/nn/linear.h"
#include "dschat/nn/rotary.h"

namespace dschat {
namespace models {

/// How a family positions tokens.
enum class PositionKind { kLearned, kRotary, kAlibi };

/// One family's module names and position scheme.
struct GptNames {
  std::string embed, positions, embed_norm, layers, final_norm;  // positions/embed_norm "" = none
  std::string ln_1, attn, ln_2, mlp;  // ln_2 "" = the MLP reads ln_1's output (GPT-J, CodeGen)
  std::string out_proj, fc_in, fc_out;
  PositionKind position = PositionKind::kLearned;
};

/// The names of config.architecture (one of the LayerNorm families); throws for another.
GptNames gpt_names(const core::ModelConfig& config);

class GptMlpImpl : public torch::nn::Module {
 public:
  GptMlpImpl(const core::ModelConfig& config, const GptNames& names);
  /// x: [B, T, H] -> fc_out(act(fc_in(x))): [B, T, H]
  torch::Tensor forward(const torch::Tensor& x);
  /// As forward through the fused bias + activation op; with `tensor_parallel`, one rank's slice
  /// of the features, fc_out's partial sums all-reduced before its bias.
  torch::Tensor forward_inference(const torch::Tensor& x, nn::TensorParallelGroup* tensor_parallel);

  nn::Linear fc_in{nullptr}, fc_out{nullptr};

 private:
  nn::Activation activation_;
};
TORCH_MODULE(GptMlp);

class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(const core::ModelConfig& config, const GptNames& names, int64_t layer);
  /// x: [B, T, H] -> [B, T, H]
  torch::Tensor forward(const torch::Tensor& x, const nn::AttentionInputs& inputs, int64_t layer, nn::KvCache* cache);

  nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};  // ln_2 empty when shared
  nn::Attention attn{nullptr};
  GptMlp mlp{nullptr};

 private:
  torch::Tensor forward_inference(const torch::Tensor& x, const nn::AttentionInputs& inputs, int64_t layer,
                                  nn::KvCache* cache);

  bool parallel_;
  bool residual_after_norm_;  // BLOOM's apply_residual_connection_post_layernorm
  double dropout_;
};
TORCH_MODULE(GptBlock);

class GptModel : public Backbone {
 public:
  explicit GptModel(const core::ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask, nn::KvCache* cache,
                        nn::MaskLayout layout = nn::MaskLayout::kUnknown) override;
  torch::Tensor embedding_weight() override { return embed->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> decoder_layers() override { return layers->children(); }

  nn::Embedding embed{nullptr};       // [V, H]
  nn::Embedding positions{nullptr};   // [max_positions, H], learned positions only
  nn::LayerNorm embed_norm{nullptr};  // BLOOM only
  torch::nn::ModuleList layers{nullptr};
  nn::LayerNorm final_norm{nullptr};

 private:
  // ALiBi: the causal mask plus each head's slope x key position, [B, H, T, S] in `dtype`.
  torch::Tensor alibi_bias(const torch::Tensor& mask, int64_t new_tokens, torch::ScalarType dtype);

  GptNames names_;
  std::shared_ptr<nn::RotaryFrequencies> rotary_;  // rotary families only (see LlamaModel)
  torch::Tensor alibi_slopes_;    // [H] ALiBi only: this shard's slopes on the mask's device, made once
  int64_t alibi_slopes_rank_ = -1;  // the tensor-parallel rank they were cut for
};

/// ALiBi slopes [heads] (fp32) as BLOOM computes them: a geometric sequence from the nearest
/// power of two, interleaved extra slopes for the rest.
torch::Tensor alibi_slopes(int64_t heads);

}  // namespace models
}  // namespace dschat
