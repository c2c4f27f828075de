#pragma once
// What one generate call cost, with the figures DeepSpeed-Chat's step 3 prints
// (dschat/utils/perf.py print_throughput_step3):
//   Generation => Latency: 1.23s, Per-token Latency 38.44 ms, TFLOPs: 0.51, BW: 6.48 GB/sec, Answer Seq. Length: 32
// TFLOPs use its Megatron-style estimate 24·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) with s = prompt +
// generated tokens; the bandwidth is parameter bytes / per-token latency (every weight read once
// per token). DeepSpeed-Chat divides by the configured answer length; these figures use the tokens
// this call actually generated, and count bytes for any dtype (it reports -1 for bf16). With
// num_return_sequences = n each prompt is prefilled once for its n rows, so the estimate leaves out
// the prompt tokens of the (n - 1) rows per prompt that shared that prefill.

#include <cstdint>
#include <string>

namespace dschat {
namespace inference {

struct GenerationStats {
  int64_t batch = 0;               // rows generated (B * num_return_sequences)
  int64_t prefill_rows = 0;        // rows the prefill ran on: B, each prompt once (its n answers share its KV)
  int64_t prompt_tokens = 0;       // T: the (padded) prompt width
  int64_t new_tokens = 0;          // tokens appended to every row (the returned length - T)
  int64_t forward_steps = 0;       // model forwards run (lockstep may add idle ones)
  double latency_s = 0.0;          // the whole call, prefill included
  double prefill_s = 0.0;          // the prompt's forward and the first token
  double per_token_latency_s = 0.0;  // latency_s / new_tokens
  double tokens_per_s = 0.0;       // batch * new_tokens / latency_s
  double tflops = 0.0;             // generation_flops (less the shared prefills) / latency_s / 1e12
  double bandwidth_gb_s = 0.0;     // parameters * bytes_per_parameter / per_token_latency_s / 1e9
  int64_t parameters = 0;          // elements of the model's parameters (this rank's)
  int64_t bytes_per_parameter = 0;  // element size of the model's dtype
  int64_t cuda_graph_replays = 0;  // decode steps served by a captured CUDA graph
  int64_t cached_prompt_tokens = 0;  // prompt tokens the continuous engine's prefix cache gave
                                     // instead of prefilling them (ContinuousEngine only)
};

/// DeepSpeed-Chat's generation FLOPs for `batch` rows of `sequence` tokens (prompt + answer).
double generation_flops(int64_t batch, int64_t sequence, int64_t layers, int64_t hidden, int64_t vocab);

/// Fills the derived fields (per-token latency, tokens/s, TFLOPs, bandwidth) from the counts,
/// times and parameter figures already set; zero where a count or time is zero.
void finish_generation_stats(GenerationStats& stats, int64_t layers, int64_t hidden, int64_t vocab);

/// DeepSpeed-Chat's "Generation => ..." line, then batch (and "from P prompts" when rows shared a
/// prompt's prefill), prompt length, prefill time and tokens/s.
std::string format_generation_stats(const GenerationStats& stats);

}  // namespace inference
}  // namespace dschat
