#pragma once
// DeepSpeed-Chat's throughput lines (dschat/utils/perf.py): the Megatron-style FLOP estimate
// 24·f·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)), f = 3 (4 with gradient checkpointing, less
// (1 - 2r/h) with LoRA of rank r), and the per-step line of steps 1 and 2.
#include <cstdint>
#include <string>

#include "dschat/core/model_config.h"

namespace dschat {
namespace monitor {

/// FLOPs of one training iteration (forward + backward) over `batch` rows of `sequence` tokens.
double training_flops(const core::ModelConfig& config, int64_t batch, int64_t sequence, bool gradient_checkpointing,
                      int64_t lora_dim);

/// Parameters of the model in billions, as "Model Parameters: X B" prints them.
double parameters_billions(const core::ModelConfig& config);

/// "Model Parameters: 0.001 B, Latency: 0.12s, TFLOPs: 0.01, Samples/sec: 130.2, Time/seq 0.01s,
/// Batch Size: 16, Sequence Length: 32" (print_throughput).
std::string training_throughput_line(const core::ModelConfig& config, int64_t batch, int64_t sequence,
                                     double seconds, bool gradient_checkpointing, int64_t lora_dim, int64_t world);

}  // namespace monitor
}  // namespace dschat
