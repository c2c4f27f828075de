#include "dschat/monitor/throughput.h"

#include <cstdio>

namespace dschat {
namespace monitor {

double training_flops(const core::ModelConfig& config, int64_t batch, int64_t sequence, bool gradient_checkpointing,
                      int64_t lora_dim) {
  const double h = static_cast<double>(config.hidden_size);
  const double layers = static_cast<double>(config.num_hidden_layers);
  const double vocab = static_cast<double>(config.vocab_size);
  const double s = static_cast<double>(sequence);
  double factor = gradient_checkpointing ? 4.0 : 3.0;
  if (lora_dim > 0) factor -= 1.0 - 2.0 * static_cast<double>(lora_dim) / h;
  return 24.0 * factor * static_cast<double>(batch) * s * layers * h * h *
         (1.0 + s / (6.0 * h) + vocab / (16.0 * layers * h));
}

double parameters_billions(const core::ModelConfig& config) {
  // Embeddings + per layer 12h^2 (attention 4h^2, MLP 2·h·ffn with ffn = 4h for OPT).
  const double h = static_cast<double>(config.hidden_size);
  const double ffn = static_cast<double>(config.intermediate_size > 0 ? config.intermediate_size : 4 * h);
  const double per_layer = 4.0 * h * h + 2.0 * h * ffn;
  return (static_cast<double>(config.vocab_size) * h + static_cast<double>(config.num_hidden_layers) * per_layer) /
         1e9;
}

std::string training_throughput_line(const core::ModelConfig& config, int64_t batch, int64_t sequence,
                                     double seconds, bool gradient_checkpointing, int64_t lora_dim, int64_t world) {
  const double flops = training_flops(config, batch, sequence, gradient_checkpointing, lora_dim);
  const double samples_per_second = seconds > 0.0 ? static_cast<double>(batch * world) / seconds : 0.0;
  char line[256];
  std::snprintf(line, sizeof(line),
                "Model Parameters: %.3f B, Latency: %.2fs, TFLOPs: %.2f, Samples/sec: %.2f, Time/seq %.2fs, "
                "Batch Size: %lld, Sequence Length: %lld",
                parameters_billions(config), seconds, seconds > 0.0 ? flops / seconds / 1e12 : 0.0,
                samples_per_second, samples_per_second > 0.0 ? 1.0 / samples_per_second : 0.0,
                static_cast<long long>(batch), static_cast<long long>(sequence));
  return line;
}

}  // namespace monitor
}  // namespace dschat
