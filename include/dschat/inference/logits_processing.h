#pragma once
// From the last position's logits to the next token, as Hugging Face's generate does it: the
// logits processors (logit bias, repetition / frequency / presence penalties, min_new_tokens' EOS
// suppression), then for sampling the warpers (temperature, top-k, top-p) and one draw per row
// from that row's own generator.

#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include <vector>

#include "dschat/core/generation_config.h"

namespace dschat {
namespace inference {

/// logits: [B, V] -> [B, V] bool, true for the tokens top-p (nucleus) sampling drops: Hugging
/// Face's TopPLogitsWarper (a token goes when the probability of it and every less likely token is
/// <= 1 - top_p; the best stays) without sorting the vocabulary. On the CPU a per-row quickselect
/// for the smallest kept probability (O(V)); elsewhere outside_top_p_by_topk. Equal to the
/// sorting rule up to float rounding of a token exactly at the boundary; tokens tied with the
/// smallest kept one are all kept (the sort keeps an arbitrary part of them).
torch::Tensor outside_top_p(const torch::Tensor& logits, double top_p);
/// The same by topk of a growing k (64, 256, ...) until the candidates hold top_p of the mass.
torch::Tensor outside_top_p_by_topk(const torch::Tensor& logits, double top_p);

/// logits: [B, V] float32, seen: [B, S] the ids so far (prompt and generated), `generated`: tokens
/// generated before this one (the last `generated` columns of `seen`) -> the adjusted logits
/// [B, V] (masked entries are -inf). In vLLM's order: logit_bias, the repetition penalty over
/// `seen`, OpenAI's frequency / presence penalties over the generated columns, EOS suppression
/// (min_new_tokens), then for sampling temperature, top-k, top-p. `seen` is read only when a
/// penalty is set.
torch::Tensor process_logits(torch::Tensor logits, const torch::Tensor& seen, const core::GenerationConfig& config,
                             int64_t generated);

/// The next token of every row [B] (on the logits' device): argmax when greedy, else one draw per
/// row from softmax(logits) with that row's own generator (`row_generators[r]`, one per row):
/// inverse-CDF sampling with one uniform per row (draw_by_inverse_cdf). A row's token therefore
/// depends on its logits and its generator only, never on which other rows share the batch: what
/// continuous batching needs ("a seeded request's output must not depend on what else runs").
/// A generator of another device than the logits' (a CPU generator for CUDA logits) draws its
/// uniform there and the uniform is copied over.
torch::Tensor select_next_tokens(const torch::Tensor& logits, const core::GenerationConfig& config,
                                 std::vector<at::Generator>& row_generators);

/// Inverse-CDF sampling: probabilities [R, V] (rows need not sum to 1), uniform [R] in [0, 1)
/// float64 -> per row the first token whose cumulative probability exceeds uniform * total [R].
torch::Tensor draw_by_inverse_cdf(const torch::Tensor& probabilities, const torch::Tensor& uniform);

/// The seed of row `row` of a call seeded with `seed` (SplitMix64 of both): rows of one call draw
/// independent streams, and a row's stream is the same whichever engine or batch runs it.
uint64_t row_seed(uint64_t seed, int64_t row);

/// One generator per row for `rows` rows on `device` (make_sampling_generator(device,
/// row_seed(seed, first_row + r))).
std::vector<at::Generator> make_row_generators(const torch::Device& device, uint64_t seed, int64_t rows,
                                               int64_t first_row = 0);

/// The sampling generator of one generate call on `device`, seeded with `seed`: a CPU generator
/// on the CPU (the same ids as ever), a CUDA generator on a CUDA device (its own Philox stream, not
/// the device's default one), a CPU generator elsewhere. The same seed gives the same ids on a
/// given device; a CPU and a GPU draw differ. Per rank: the caller picks the seed (PPO's trainer
/// derives one per rank and step); nothing is added here.
at::Generator make_sampling_generator(const torch::Device& device, uint64_t seed);

}  // namespace inference
}  // namespace dschat
