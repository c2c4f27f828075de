#include "dschat/inference/generation_stats.h"

#include <cstdio>

namespace dschat {
namespace inference {

double generation_flops(int64_t batch, int64_t sequence, int64_t layers, int64_t hidden, int64_t vocab) {
  const double b = static_cast<double>(batch), s = static_cast<double>(sequence), l = static_cast<double>(layers);
  const double h = static_cast<double>(hidden), v = static_cast<double>(vocab);
  if (h <= 0 || l <= 0) return 0.0;
  return 24.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
}

void finish_generation_stats(GenerationStats& stats, int64_t layers, int64_t hidden, int64_t vocab) {
  const double seconds = stats.latency_s;
  const double tokens = static_cast<double>(stats.new_tokens);
  stats.per_token_latency_s = tokens > 0 ? seconds / tokens : 0.0;
  stats.tokens_per_s = seconds > 0 ? static_cast<double>(stats.batch) * tokens / seconds : 0.0;
  // Rows that share a prompt's prefill (num_return_sequences > 1) ran no prompt forward of their
  // own: the estimate for every row's whole sequence, less the prompt part of those rows.
  const int64_t shared_rows =
      stats.prefill_rows > 0 && stats.prefill_rows < stats.batch ? stats.batch - stats.prefill_rows : 0;
  const double flops =
      generation_flops(stats.batch, stats.prompt_tokens + stats.new_tokens, layers, hidden, vocab) -
      generation_flops(shared_rows, stats.prompt_tokens, layers, hidden, vocab);
  stats.tflops = seconds > 0 ? flops / seconds / 1e12 : 0.0;
  const double weight_bytes = static_cast<double>(stats.parameters) * static_cast<double>(stats.bytes_per_parameter);
  stats.bandwidth_gb_s = stats.per_token_latency_s > 0 ? weight_bytes / stats.per_token_latency_s / 1e9 : 0.0;
}

std::string format_generation_stats(const GenerationStats& s) {
  char shared[64] = "";  // "from P prompts" only when answers shared a prompt's prefill
  if (s.prefill_rows > 0 && s.prefill_rows != s.batch) {
    std::snprintf(shared, sizeof(shared), " from %lld prompts", static_cast<long long>(s.prefill_rows));
  }
  char cached[64] = "";  // only when the prefix cache gave prompt tokens
  if (s.cached_prompt_tokens > 0) {
    std::snprintf(cached, sizeof(cached), ", %lld prompt tokens cached", static_cast<long long>(s.cached_prompt_tokens));
  }
  char line[448];
  std::snprintf(line, sizeof(line),
                "Generation => Latency: %.2fs, Per-token Latency %.2f ms, TFLOPs: %.2f, BW: %.2f GB/sec, "
                "Answer Seq. Length: %lld (batch %lld%s, prompt %lld%s, prefill %.3fs, %.1f tokens/s)",
                s.latency_s, s.per_token_latency_s * 1e3, s.tflops, s.bandwidth_gb_s,
                static_cast<long long>(s.new_tokens), static_cast<long long>(s.batch), shared,
                static_cast<long long>(s.prompt_tokens), cached, s.prefill_s, s.tokens_per_s);
  return line;
}

}  // namespace inference
}  // namespace dschat
