#pragma once
// `dschat plan`: for every step of a pipeline config, what one rank holds (per model: parameters,
// gradients, optimizer, activations, logits, the hybrid engine's extras and KV workspace), the
// peak and whether it fits the hardware with a stated margin, and how long the step takes.
// Nothing is loaded: models are built on the meta device, datasets are only counted.
//
//   PlanOptions options;
//   options.hardware = hardware_for("h200", 1, 1);
//   PipelinePlan plan = plan_pipeline(config, options);
//   if (!plan.fits()) std::cout << format_plan(plan);
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/plan/hardware.h"
#include "dschat/plan/model_memory.h"
#include "dschat/rlhf/config/pipeline_config.h"

namespace dschat {
namespace plan {

/// The throughput assumptions the time estimate divides by (docs/plan.md, "Time").
struct Efficiency {
  double training = 0.40;   // achieved / peak FLOP/s of forward+backward GEMMs
  double prefill = 0.40;    // of a no-grad forward (experience, prefill)
  double bandwidth = 0.50;  // achieved / peak memory bandwidth of a decode step
  std::string source;       // where the figures come from
};
/// Calibrated for the CPU from dschat's benchmarks; assumed for GPUs until a GPU run measures them.
Efficiency default_efficiency(bool cpu);

struct PlanOptions {
  Hardware hardware;
  /// Fraction of device memory kept free (allocator fragmentation, unmodelled buffers).
  double margin = 0.10;
  /// Device memory that is not the allocator's: the CUDA context, cuBLAS and NCCL workspaces
  /// (GPU), or the process's own code and libraries (CPU).
  double reserved_gib = -1;  // < 0: 1.0 on a GPU, 0.6 on the CPU
  std::optional<Efficiency> efficiency;
  /// Train rows of each step's data before the split (the step reads its data_split share; overrides
  /// counting the datasets; -1: count).
  int64_t dataset_rows = -1;
  /// false: do not read the datasets (the step count and total time stay unknown).
  bool count_rows = true;
  /// CPU ranks allocate through core::HostBlockCache (the dschat CLI installs it:
  /// core::retain_freed_host_memory), which keeps free blocks up to 1/8 above the live peak: the
  /// plan counts that 1/8. false: freed memory goes back to the C library.
  bool host_block_cache = false;
};

struct ModelSummary {
  std::string role;
  std::string shape;  // "24 layers, hidden 2048, vocab 50272"
  int64_t parameters = 0;
  int64_t trainable = 0;
  int zero_stage = 0;
  std::string source;  // the model's directory, HF id or preset name
  torch::ScalarType dtype = torch::kFloat16;
  bool trained = false;
  bool offload = false;
  int64_t lora_dim = 0;
  bool gradient_checkpointing = false;
  // What this model holds for the whole step on one rank (parameters, gradients, optimizer state).
  int64_t resident_device_bytes = 0;
  int64_t resident_host_bytes = 0;
};

struct StepPlan {
  int step = 0;
  rlhf::StepKind kind = rlhf::StepKind::kSft;
  std::string block;  // the config block: step1, step2, step3, step2_dpo, step2_grpo
  std::vector<ModelSummary> models;
  std::vector<MemoryItem> items;
  int64_t resident_bytes = 0;  // device bytes held for the whole step
  int64_t peak_bytes = 0;      // device: resident + the largest phase
  std::string peak_phase;
  int64_t host_bytes = 0;       // host bytes per rank (offloaded state)
  int64_t usable_bytes = 0;     // device bytes the plan allows (capacity less margin and reserve)
  int64_t host_usable_bytes = 0;  // per rank
  bool fits = true;
  std::string why_not;  // when it does not fit
  /// A setting the trainers would refuse before memory matters ("" : none); the step then does
  /// not fit either.
  std::string config_problem;
  // Time
  double flops_per_step = 0;    // per rank, one optimizer step (PPO/GRPO: one generation batch)
  double seconds_per_step = 0;
  int64_t steps = -1;           // per epoch × epochs; -1 when the data could not be counted
  double total_seconds = -1;
  std::string steps_note;       // how the step count was found
  int64_t longest_row = -1;     // plan_step's longest_row (re-plans of this step pass it on)
};

struct Suggestion {
  std::string change;           // "step3: actor_zero_stage 0 -> 3"
  nlohmann::json config_patch;  // merge into --config
  int64_t peak_bytes = 0;
  double seconds_per_step = 0;
  bool fits = false;
};

struct PipelinePlan {
  PlanOptions options;
  std::vector<StepPlan> steps;
  std::vector<Suggestion> suggestions;  // for the steps that do not fit, best first
  bool fits() const;
  double total_seconds() const;  // -1 when a step's count is unknown
};

/// Plans the steps `config.steps` runs. Model shapes come from each model's config.json
/// (directory, HF cache) or its preset name; a later step's input that an earlier step writes
/// takes the shape it starts from. Throws core::NotFound naming a model with no shape.
PipelinePlan plan_pipeline(const rlhf::PipelineConfig& config, const PlanOptions& options);

/// One step alone (what plan_pipeline does for each); `rows`: the phase's rows, -1 unknown.
/// `longest_row`: SFT, reward and DPO steps pad each batch to its longest row, so their passes are
/// planned at min(max_seq_len, longest_row) tokens; -1: at max_seq_len (the data not read).
StepPlan plan_step(const rlhf::PipelineConfig& config, int step, const PlanOptions& options, int64_t rows,
                   int64_t longest_row = -1);

/// The cheapest changes that make each failing step fit, each re-planned, best (fastest) first.
std::vector<Suggestion> suggest_changes(const rlhf::PipelineConfig& config, const PipelinePlan& plan);

/// The per-step table, the time and the suggestions, as `dschat plan` prints them.
std::string format_plan(const PipelinePlan& plan);
/// The same as JSON (`dschat plan --json`).
nlohmann::json plan_to_json(const PipelinePlan& plan);

}  // namespace plan
}  // namespace dschat
