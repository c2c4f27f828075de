#include "dschat/inference/generate_text.h"

#include "dschat/core/error.h"
#include "dschat/inference/generate.h"

namespace dschat {
namespace inference {
namespace {

torch::Tensor to_tensor(const std::vector<std::vector<int64_t>>& rows) {
  const int64_t batch = static_cast<int64_t>(rows.size()), width = rows.empty() ? 0 : rows[0].size();
  torch::Tensor out = torch::empty({batch, width}, torch::kInt64);  // [B, T]
  for (int64_t b = 0; b < batch; ++b) {
    std::copy(rows[b].begin(), rows[b].end(), out[b].data_ptr<int64_t>());
  }
  return out;
}

// Tokenizes (left-padded), runs `run(ids, mask)` on the model's device, decodes the new tokens.
template <typename Generate>
std::vector<std::string> generate_with(models::CausalLM& model, const tokenizer::Tokenizer& tokenizer,
                                       const std::vector<std::string>& prompts, core::GenerationConfig config,
                                       Generate&& run) {
  DSCHAT_CHECK(!prompts.empty(), InvalidArgument, "generate: no prompt given");
  if (!config.eos_token_id) config.eos_token_id = tokenizer.eos_token_id();
  if (!config.pad_token_id) config.pad_token_id = tokenizer.pad_token_id() ? tokenizer.pad_token_id() : config.eos_token_id;
  tokenizer::BatchOptions options;
  options.padding_side = tokenizer::Side::kLeft;  // generation appends on the right
  options.pad_token_id = config.pad_token_id.value_or(0);
  tokenizer::BatchEncoding encoded = tokenizer.encode_batch(prompts, options);
  torch::Tensor ids = to_tensor(encoded.input_ids);        // [B, T]
  torch::Tensor mask = to_tensor(encoded.attention_mask);  // [B, T]
  auto device = model->parameters().front().device();
  GenerationResult result = run(ids.to(device), mask.to(device), config);
  const int64_t prompt_length = ids.size(1);
  torch::Tensor sequences = result.sequences.cpu();  // [B, T + N]
  torch::Tensor kept = result.attention_mask.cpu();  // [B, T + N]
  std::vector<std::string> texts;
  for (int64_t b = 0; b < sequences.size(0); ++b) {
    std::vector<int64_t> new_ids;
    for (int64_t t = prompt_length; t < sequences.size(1); ++t) {
      if (kept[b][t].item<int64_t>() == 1) new_ids.push_back(sequences[b][t].item<int64_t>());
    }
    texts.push_back(tokenizer.decode(new_ids, /*skip_special_tokens=*/true));
  }
  return texts;
}

}  // namespace

std::vector<std::string> generate_text(models::CausalLM& model, const tokenizer::Tokenizer& tokenizer,
                                       const std::vector<std::string>& prompts, core::GenerationConfig config) {
  return generate_with(model, tokenizer, prompts, std::move(config),
                       [&](const torch::Tensor& ids, const torch::Tensor& mask, const core::GenerationConfig& c) {
                         return generate(model, ids, mask, c);
                       });
}

std::vector<std::string> generate_text(InferenceEngine& engine, const tokenizer::Tokenizer& tokenizer,
                                       const std::vector<std::string>& prompts, core::GenerationConfig config) {
  return generate_with(engine.model(), tokenizer, prompts, std::move(config),
                       [&](const torch::Tensor& ids, const torch::Tensor& mask, const core::GenerationConfig& c) {
                         return engine.generate(ids, mask, c);
                       });
}

}  // namespace inference
}  // namespace dschat
