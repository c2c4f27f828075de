#include "plan/step_time.h"

#include <algorithm>

namespace dschat {
namespace plan {
namespace {

int64_t ceil_divide(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Matmul parameters a token passes through: the layers' projections, the LM head or v_head.
double matmul_parameters(const ModelSetup& s) {
  const core::ModelConfig& c = s.config;
  const double h = static_cast<double>(c.hidden_size);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double f = static_cast<double>(c.intermediate_size);
  const double mlp = c.architecture == core::Architecture::Llama ? 3 * h * f : 2 * h * f;
  const double layer = 2 * h * h + 2 * h * kv + mlp;
  const double head = s.value_head ? static_cast<double>(c.output_dim()) : static_cast<double>(c.vocab_size * c.output_dim());
  return static_cast<double>(c.num_hidden_layers) * layer + head;
}

double peak_flops(const TimeContext& t) { return t.hardware.device.peak_tflops * 1e12; }

}  // namespace

Efficiency default_efficiency(bool cpu) {
  if (cpu) {
    // docs/benchmarks.md, "Training step": 965 tokens/s of a 5.8M-parameter model on 2 threads is
    // 6 × 5.8e6 × 965 = 34 GFLOP/s of this table's 160; the step-3 benchmark's generation runs at
    // about half the bandwidth figure.
    return {0.21, 0.21, 0.25, "calibrated: dschat's CPU benchmarks (docs/benchmarks.md)"};
  }
  return {0.40, 0.40, 0.50,
          "assumed: DeepSpeed-Chat's published step-3 throughput on A100s; no dschat GPU benchmark has run yet"};
}

double forward_flops(const ModelSetup& setup, const PassShape& shape) {
  const double tokens = static_cast<double>(shape.batch * shape.tokens);
  const core::ModelConfig& c = setup.config;
  const double attention = 2.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(shape.batch) *
                           static_cast<double>(shape.tokens) * static_cast<double>(shape.tokens) *
                           static_cast<double>(c.num_attention_heads * c.head_dim);
  return 2.0 * matmul_parameters(setup) * tokens + attention;
}

double training_flops(const ModelSetup& setup, const PassShape& shape) {
  const double forward = forward_flops(setup, shape);
  const double backward = setup.only_optimize_lora && setup.lora_dim > 0 ? forward : 2 * forward;
  const bool recompute = setup.gradient_checkpointing || setup.zero_stage == 3;
  return forward + backward + (recompute ? forward : 0);
}

StepTime supervised_time(const ModelSetup& model, const PassShape& micro_batch, const rlhf::CommonStepConfig& common,
                         int64_t rows, int64_t rows_per_micro_batch, double extra_forward_flops,
                         const TimeContext& context) {
  const int64_t gas = std::max<int64_t>(common.gradient_accumulation_steps, 1);
  const double micro_flops = training_flops(model, micro_batch) + extra_forward_flops;
  StepTime t;
  t.flops_per_step = micro_flops * static_cast<double>(gas);
  t.seconds_per_step = t.flops_per_step / (peak_flops(context) * context.efficiency.training);
  if (rows >= 0) {
    const int64_t world = context.hardware.world_size();
    const int64_t per_micro = std::max<int64_t>(rows_per_micro_batch, 1);
    const int64_t micro = ceil_divide(ceil_divide(rows, world), per_micro) * std::max<int64_t>(common.num_train_epochs, 0);
    t.steps = ceil_divide(micro, gas);
    t.total_seconds = static_cast<double>(micro) * micro_flops / (peak_flops(context) * context.efficiency.training);
  }
  return t;
}

StepTime rl_time(const ModelSetup& actor, const std::vector<engine::ParameterSpec>& actor_specs,
                 const std::vector<const ModelSetup*>& scorers, const std::vector<const ModelSetup*>& trained,
                 const RlShape& shape, int64_t rows, const TimeContext& context, int64_t answers_per_prompt) {
  const double peak = peak_flops(context);
  const Efficiency& e = context.efficiency;
  const int64_t total_tokens = shape.prompt_tokens + shape.answer_tokens;
  const int64_t tp = std::max<int64_t>(shape.tp, 1);
  // Generation: a TP group generates tp ranks' rows together, each rank computing 1/tp of it.
  const double prefill = forward_flops(actor, {shape.generation_rows, shape.prompt_tokens}) / (peak * e.prefill);
  const double weight_bytes = static_cast<double>(model_bytes(actor_specs)) / static_cast<double>(tp);
  const double bandwidth = context.hardware.device.bandwidth_gbs * 1e9 * e.bandwidth;
  const double decode_compute = forward_flops(actor, {shape.generation_rows, 1}) / (peak * e.prefill);
  const double decode = static_cast<double>(shape.answer_tokens) * std::max(weight_bytes / bandwidth, decode_compute);
  const PassShape full{shape.generation_rows, total_tokens};
  double experience_flops = forward_flops(actor, full);
  for (const ModelSetup* s : scorers) experience_flops += forward_flops(*s, full);
  double train_flops = training_flops(actor, full);
  for (const ModelSetup* s : trained) train_flops += training_flops(*s, full);
  train_flops *= static_cast<double>(std::max<int64_t>(shape.ppo_epochs, 1));
  StepTime t;
  t.flops_per_step = forward_flops(actor, {shape.generation_rows, shape.prompt_tokens}) +
                     forward_flops(actor, {shape.generation_rows, 1}) * static_cast<double>(shape.answer_tokens) +
                     experience_flops + train_flops;
  t.seconds_per_step = prefill + decode + experience_flops / (peak * e.prefill) + train_flops / (peak * e.training);
  if (rows >= 0) {
    const int64_t prompts_per_batch = std::max<int64_t>(shape.generation_rows / std::max<int64_t>(answers_per_prompt, 1), 1);
    t.steps = ceil_divide(ceil_divide(rows, context.hardware.world_size()), prompts_per_batch) *
              std::max<int64_t>(shape.epochs, 0);
    t.total_seconds = static_cast<double>(t.steps) * t.seconds_per_step;
  }
  return t;
}

void apply_time(StepPlan& plan, const StepTime& time) {
  plan.flops_per_step = time.flops_per_step;
  plan.seconds_per_step = time.seconds_per_step;
  plan.steps = time.steps;
  plan.total_seconds = time.total_seconds;
}

}  // namespace plan
}  // namespace dschat
